"""How a system is measured, once for ``bench`` (every system) and ``tune`` (every point): load levels
of a fixed shape (:class:`Timing`), each wrapped in what the system offers to watch (:class:`Probes`:
drain the last level's backlog, observe before and after, say whether it is down), judged against
one :class:`~tritonbundle.measure.latency.Slo`, and searched by the open-model rate search.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tritonbundle.errors import TritonBundleError
from tritonbundle.log import LOG
from tritonbundle.measure import stalls
from tritonbundle.measure.latency import Slo, StepResult, judge
from tritonbundle.measure.loadgen import LoadPool
from tritonbundle.measure.search import Sweep, search_rate

Observe = Callable[[], dict[str, Any]]
Finish = Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]


class Sampler(Protocol):
    """Something sampled through the whole run (the GPU, the host's stalls) that summarises a span of
    it (monotonic seconds) into keys of a level's record."""

    def window(self, start: float, end: float) -> dict[str, float | None]: ...


class SystemDown(TritonBundleError):
    """The system under test died or hung during a level and could not be brought back (or has no way
    to be): the measurement fails, naming why, instead of reporting every later level as "0 answered".
    ``sweep``: the levels measured up to and including that one (stopped "system down"), whose best
    passing rate is a floor of the knee: what the search had found is not thrown away."""

    def __init__(self, message: str, sweep: Sweep | None = None) -> None:
        super().__init__(message)
        self.sweep = sweep if sweep is not None else Sweep([], None, SYSTEM_DOWN)


#: Why a search ended when its system went down for good (:class:`SystemDown`).
SYSTEM_DOWN = "system down"
#: Restarts one search may make before it gives up on the system.
MAX_RESTARTS = 3
#: A level's console line names the load generators' longest collector pause from this long (ms).
GC_PAUSE_SHOWN_MS = 5.0


def warmup_for(window_s: float) -> float:
    """A level's warm-up before a window of ``window_s`` seconds (:meth:`Timing.for_window`)."""
    return max(0.5, 0.25 * window_s)


def sending_s(step: StepResult) -> float:
    """How long a level sent requests (warm-up and window): the span the served system's own counters
    (rows, launches) cover, where the GPU's utilisation is sampled over the window alone. Recorded from
    2026-12-06 on (``extra["sending_s"]``); before, the rule's warm-up is assumed."""
    return float(step.extra.get("sending_s") or warmup_for(step.window_s) + step.window_s)


@dataclass(frozen=True)
class Timing:
    """Seconds per load level: unmeasured warm-up, the measured window, then grace for the answers to
    the window's last requests."""

    warmup_s: float
    window_s: float
    grace_s: float

    @classmethod
    def for_window(cls, window_s: float, slo_p99_ms: float) -> Timing:
        """The one rule: a quarter of the window to warm up (at least 0.5 s), and grace for four SLOs
        (1-2 s), enough for the late answers that decide a p99."""
        return cls(warmup_s=warmup_for(window_s), window_s=window_s,
                   grace_s=min(2.0, max(1.0, 4 * slo_p99_ms / 1000.0)))

    @property
    def cost_s(self) -> float:
        """Wall time one level takes, with the generators' setup and the scrapes around it."""
        return self.warmup_s + self.window_s + self.grace_s + 2.0


@dataclass(frozen=True)
class Ladder:
    """The rate search's ladder: from ``start`` up by ``factor``, ``refine`` bisections, capped at ``max_rate``."""

    start: float
    factor: float = 2.0
    refine: int = 2
    max_rate: float = 100_000.0


@dataclass
class Probes:
    """What a system offers around each level; each is optional."""

    #: A snapshot (metrics, CPU times...) taken before and after the level.
    observe: Observe | None = None
    #: (before, after) -> what the level adds to its step's record.
    finish: Finish | None = None
    #: Wait up to the given seconds for the previous level's backlog to clear; returns the wait.
    drain: Callable[[float], float] | None = None
    #: Why the system is down ("" while it is up).
    down: Callable[[], str] | None = None
    #: Bring a system that went down back up within the given seconds, its load generators reconnected;
    #: returns the seconds it took, raises when it cannot.
    restart: Callable[[float], float] | None = None


def wait_idle(probe: Callable[[], float], max_s: float, threshold: float) -> float:
    """Poll ``probe()`` until it reads <= ``threshold`` twice in a row (or ``max_s`` passes); return the wait."""
    start = time.monotonic()
    calm = 0
    while time.monotonic() - start < max_s:
        if probe() <= threshold:
            calm += 1
            if calm >= 2:
                break
        else:
            calm = 0
        time.sleep(0.05)
    return time.monotonic() - start


def measure_rates(pool: LoadPool, *, system: str, slo: Slo, timing: Timing, ladder: Ladder, probes: Probes,
                  deadline: float, seed: int, samplers: Sequence[Sampler] = ()) -> Sweep:
    """The highest rate at which ``system`` meets ``slo``, searched with levels that end before
    ``deadline`` (monotonic). Level ``n`` draws its arrivals from ``seed + n``: the same stream for
    every system measured with the same seed. A level during which the system went down fails (its
    record says why, ``extra["down"]``); the system is restarted when ``probes`` can (at most
    :data:`MAX_RESTARTS` times) and the search goes on below that rate, else :class:`SystemDown` is
    raised. (Triton 2.51 crashes in its gRPC frontend when callers cancel under overload: a crash far
    above the knee must not throw away the levels that measured it.)"""
    level = [0]
    restarts = [0]
    measured: list[StepResult] = []  # judged levels, for the sweep a SystemDown carries

    def down(what: str, result: StepResult) -> SystemDown:
        result.extra["down"] = what
        measured.append(judge(result, slo))
        passing = [s for s in measured if s.passed]
        return SystemDown(what, Sweep(list(measured), max(passing, key=lambda s: s.achieved_rps) if passing else None,
                                      SYSTEM_DOWN))

    def measure(rate: float) -> StepResult:
        level[0] += 1
        drained = probes.drain(min(15.0, max(1.0, deadline - time.monotonic() - timing.cost_s))) if probes.drain else 0.0
        before = probes.observe() if probes.observe else {}
        t0 = time.monotonic()
        result = pool.step(rate, warmup_s=timing.warmup_s, window_s=timing.window_s, grace_s=timing.grace_s,
                           seed=seed + level[0])
        for sampler in samplers:  # over the window the level is judged on
            result.extra.update(sampler.window(t0 + timing.warmup_s, t0 + timing.warmup_s + timing.window_s))
        if probes.observe and probes.finish:
            result.extra.update(probes.finish(before, probes.observe()))
        result.extra["drain_s"] = round(drained, 2)
        result.extra["sending_s"] = timing.warmup_s + timing.window_s
        why = probes.down() if probes.down else ""
        if why:
            what = f"{system} went down during the level at {rate:.1f} req/s ({result.completed} of " \
                   f"{result.sent} answered): {why}"
            if probes.restart is None or restarts[0] >= MAX_RESTARTS:
                raise down(what + ("" if probes.restart is None else f" (restarted {restarts[0]} times already)"), result)
            restarts[0] += 1
            LOG.warning("    %s; restarting it", what)
            try:
                result.extra["restart_s"] = round(probes.restart(max(10.0, deadline - time.monotonic())), 1)
            except Exception as e:  # noqa: BLE001 - any failure to come back ends the measurement
                raise down(f"{what}; it did not come back: {e}", result) from e
            result.extra["down"] = why
        judge(result, slo)
        gpu_util, sm_mhz = result.extra.get("gpu_util_mean"), result.extra.get("gpu_sm_mhz_mean")
        from_send, gc_ms = result.extra.get("p99_from_send_ms"), result.extra.get("client_gc_max_ms") or 0.0
        long_stalls, cpu_wait = result.extra.get("host_long_stalls") or 0, result.extra.get("host_cpu_wait") or 0.0
        LOG.info("    %s @ %8.1f req/s offered: %8.1f answered/s, p50 %7.1f ms, p99 %7.1f ms%s%s%s%s, failed %d%s%s: %s",
                 system, rate, result.achieved_rps, result.p50_ms, result.p99_ms,
                 f" ({from_send:.1f} from the send)" if from_send is not None else "",
                 f", a load generator's collector paused {gc_ms:.1f} ms" if gc_ms >= GC_PAUSE_SHOWN_MS else "",
                 f", the host stalled a bystander {long_stalls} times (up to {result.extra['host_stall_max_ms']:.0f} ms)"
                 if long_stalls else "",
                 f", tasks waited for a CPU {100 * cpu_wait:.0f} % of the time" if cpu_wait >= stalls.CPU_WAIT_SHOWN else "",
                 result.failed,
                 f", GPU {gpu_util:.0f}%" if gpu_util is not None else "",
                 f" at {sm_mhz:.0f} MHz" if sm_mhz is not None else "",
                 "PASS" if result.passed else f"FAIL ({result.reason})")
        measured.append(result)
        return result

    return search_rate(measure, slo=slo, start=ladder.start, factor=ladder.factor, refine=ladder.refine,
                       max_rate=ladder.max_rate, can_continue=lambda: time.monotonic() + timing.cost_s < deadline)
