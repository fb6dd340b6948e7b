"""What every measured system shares: the run's context and the rate search with server-side
observations around each load level."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tritonbundle import traffic as traffic_mod
from tritonbundle.bench.options import BenchOptions, Clock, expected_steps, step_timing
from tritonbundle.log import LOG
from tritonbundle.measure.latency import Slo, StepResult
from tritonbundle.measure.loadgen import LoadPool
from tritonbundle.measure.probes import GpuSampler
from tritonbundle.measure.search import Sweep, search_rate


@dataclass
class Context:
    options: BenchOptions
    clock: Clock
    work: Path
    logs: Path
    traffic_path: Path
    sample: traffic_mod.TrafficSample
    tokenizer: Path
    gpu: GpuSampler | None
    save: Callable[[], None]
    #: model name -> (texts, FP32 reference embeddings)
    references: dict[str, tuple[list[str], Any]] = field(default_factory=dict)

    @property
    def slo(self) -> Slo:
        """The benchmark's objective: p99 within ``--slo-p99-ms``, at most 1 % of requests failed."""
        return Slo(p99_ms=self.options.slo_ms, max_failure_ratio=self.options.max_failure_ratio)


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


Observe = Callable[[], dict[str, Any]]
Finish = Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]


class SystemDown(RuntimeError):
    """The system under test died or hung during a level: the phase fails, naming why."""


def sweep(ctx: Context, pool: LoadPool, phase_deadline: float, system: str, observe: Observe | None,
          finish: Finish | None, drain: Callable[[float], float] | None = None,
          down: Callable[[], str] | None = None) -> Sweep:
    """Rate search on one system, with server-side observations around each level. Before each level
    ``drain(max_s)`` waits until the system has no backlog left from the previous one. After each,
    ``down()`` says why the system is down ('' when it is not): a server that died or hung fails the
    phase (:class:`SystemDown`) instead of reporting every later level as "0 answered"."""
    o = ctx.options
    warmup, window, grace = step_timing(o, phase_deadline - time.monotonic(), expected_steps(o, system))
    LOG.info("    %s: levels of %.1f s (+%.1f s warm-up), p99 SLO %g ms", system, window, warmup, o.slo_ms)
    cost = warmup + window + grace + 2.0
    level = [0]

    def measure(rate: float) -> StepResult:
        level[0] += 1
        drained = drain(min(15.0, max(1.0, phase_deadline - time.monotonic() - cost))) if drain else 0.0
        before = observe() if observe else {}
        t0 = time.monotonic()
        result = pool.step(rate, warmup_s=warmup, window_s=window, grace_s=grace, seed=o.seed * 100 + level[0])
        w0, w1 = t0 + warmup, t0 + warmup + window
        if ctx.gpu is not None:
            result.extra.update(ctx.gpu.window(w0, w1))
        if observe and finish:
            result.extra.update(finish(before, observe()))
        result.extra["drain_s"] = round(drained, 2)
        why = down() if down else ""
        if why:
            raise SystemDown(f"{system} went down during the level at {rate:.1f} req/s ({result.completed} of "
                             f"{result.sent} answered): {why}")
        LOG.info("    %s @ %8.1f req/s offered: %8.1f answered/s, p50 %7.1f ms, p99 %7.1f ms, failed %d%s",
                 system, rate, result.achieved_rps, result.p50_ms, result.p99_ms, result.failed,
                 f", GPU {result.extra['gpu_util_mean']:.0f}%" if result.extra.get("gpu_util_mean") is not None else "")
        return result

    return search_rate(
        measure, slo=ctx.slo, start=o.ladder_start, factor=o.ladder_factor, refine=o.refine, max_rate=o.max_rate,
        can_continue=lambda: time.monotonic() + cost < phase_deadline,
    )
