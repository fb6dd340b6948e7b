"""How fast this host ran the same work, so that runs from different calls (other machines, or one
machine on a slow spell) can be told apart from the settings they measure: a fixed single-thread
Python workload timed before and after a run, and the share of the CPU's time the hypervisor took
over the run (``steal`` in ``/proc/stat``, through psutil).

Why: on the H200 (2026-12-04) a call read every configuration at half the rate the call before had
read, on the same machine, with the load generators' CPU time per request up 40 % for code that had
not changed; nothing in the reports said whether the host was slower (docs/benchmarks.md, "the
plain-text tokenizer").

The same workload in 1, a quarter, half, three quarters and all of the CPUs' processes at once
(:func:`capacity`) says how many cores' worth of work the host does with every CPU busy. A VM's
"16 cores" may be 8 physical cores' hyperthreads, or share them with other guests: then 10 busy CPUs
can be the host's limit while 6 read idle. MiniLM's knees on the H200 (2026-12-04) fell at 9.2-11.0
busy cores of 16 whatever their rate (10,800-34,800 req/s): this is the reading that tells a full host
from a half-idle one."""

from __future__ import annotations

import json
import multiprocessing
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tritonbundle import proc

#: Times the workload runs for one reading (its median and fastest are kept).
REPEAT = 5


def python_ms(repeat: int = REPEAT) -> tuple[float, float]:
    """The workload's time in ms: the median and the fastest of ``repeat`` runs (the fastest follows
    the core's clock; the median, the spells when something else had it)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        _work()
        times.append(1000.0 * (time.perf_counter() - t0))
    return round(statistics.median(times), 2), round(min(times), 2)


def _work() -> int:
    """What the load generators and the Python backend's stubs spend their Python time on: small
    dicts, formatted strings, JSON (~20-60 ms on one core)."""
    total = 0
    for i in range(20_000):
        total += len(json.dumps({"id": i, "text": f"request {i} of the probe", "rows": [i, i + 1]}))
    return total


def process_counts(cpus: int) -> list[int]:
    """The process counts :func:`capacity` runs: 1, then a quarter, half, three quarters and all of ``cpus``."""
    return sorted({1, *(max(1, cpus * q // 4) for q in (1, 2, 3, 4))})


@dataclass(frozen=True)
class Capacity:
    """A :func:`capacity` reading: for each process count (``procs``), the median process's median time
    (``ms``) and the work done in cores' worth (``cores``: ``n`` x the time alone / the time among ``n``)."""

    procs: list[int]
    ms: list[float]
    cores: list[float | None]

    def to_json(self) -> dict[str, Any]:
        return {"procs": list(self.procs), "ms": list(self.ms), "cores": list(self.cores)}

    def describe(self) -> str:
        worth = ", ".join(f"{n}: {c}" for n, c in zip(self.procs, self.cores, strict=True))
        return (f"in {self.procs[-1]} processes at once before the run it did {self.cores[-1]} cores' worth of "
                f"work (each took {self.ms[-1]} ms against {self.ms[0]} alone; cores' worth by processes {worth})")


def capacity(procs: Sequence[int] | None = None, *, repeat: int = 3,
             work: Callable[[], object] | None = None) -> Capacity:
    """The workload run ``repeat`` times in each of ``n`` processes started together, for each ``n`` of
    ``procs`` (default: :func:`process_counts` of the CPUs this process may run on, which ``taskset``
    narrows). ``ms``: the median process's median time; ``cores``: the work done, in cores' worth (``n``
    x the time alone / the time among ``n``).

    Processes, not threads (the GIL); spawned, not forked (the bench has threads by then); they wait on
    a barrier, so that they run at once. ~3 s on 16 CPUs."""
    counts = list(procs) if procs is not None else process_counts(len(proc.usable_cpus()))
    ctx = multiprocessing.get_context("spawn")
    ms: list[float] = []
    for n in counts:
        barrier, results = ctx.Barrier(n), ctx.Queue()
        workers = [ctx.Process(target=_timed, args=(barrier, results, repeat, work or _work), daemon=True)
                   for _ in range(n)]
        try:
            for w in workers:
                w.start()
            medians = [_result(results, workers) for _ in workers]
        finally:
            for w in workers:
                w.join(timeout=5)
                if w.is_alive():
                    w.terminate()
                    w.join(timeout=5)
        ms.append(round(statistics.median(medians), 2))
    alone = ms[counts.index(1)] if 1 in counts else None
    cores = [round(n * alone / t, 2) if alone and t > 0 else None for n, t in zip(counts, ms, strict=True)]
    return Capacity(counts, ms, cores)


def _result(results: Any, workers: Sequence[Any], timeout_s: float = 120.0) -> float:
    """The next process's median (ms); raises RuntimeError at once when one failed or died instead."""
    import queue

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            got = results.get(timeout=0.2)
        except queue.Empty:
            if time.monotonic() > deadline or any(w.exitcode not in (None, 0) for w in workers):
                raise RuntimeError("a capacity process died or timed out") from None
            continue
        if isinstance(got, str):
            raise RuntimeError(f"a capacity process failed: {got}")
        return float(got)


def _timed(barrier: Any, results: Any, repeat: int, work: Callable[[], object]) -> None:
    """One process of :func:`capacity`: waits for the others, then puts its median time (ms), or its
    error as a string."""
    try:
        barrier.wait(timeout=60)
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            work()
            times.append(1000.0 * (time.perf_counter() - t0))
        results.put(statistics.median(times))
    except Exception as e:  # noqa: BLE001 - reported to the parent, which fails the reading
        results.put(f"{type(e).__name__}: {e}")


def _cpu_times() -> dict[str, float] | None:
    try:
        import psutil
    except ImportError:
        return None
    return dict(psutil.cpu_times()._asdict())


def _pair(value: Any) -> tuple[float, float] | None:
    return (float(value[0]), float(value[1])) if isinstance(value, (list, tuple)) and len(value) == 2 else None


@dataclass
class HostSpeed:
    """What :class:`HostWatch` read: the workload's median and fastest time (ms) before and after the run,
    the hypervisor's share of the CPU time during it, and the host's capacity before it (or why it could
    not be read). Stored in a report's ``environment["host_speed"]`` as :meth:`to_json` writes it; reports
    from before a field existed read back without it."""

    python_ms_before: tuple[float, float] | None = None
    python_ms_after: tuple[float, float] | None = None
    steal_share: float | None = None
    parallel_before: Capacity | None = None
    #: Why the capacity could not be read ("" when it was, or was not tried).
    parallel_error: str = ""
    #: Keys of a stored record this version does not know, kept as they were.
    other: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.other)
        for key in ("python_ms_before", "python_ms_after"):
            if (pair := getattr(self, key)) is not None:
                out[key] = list(pair)
        if self.python_ms_after is not None or self.steal_share is not None:
            out["steal_share"] = self.steal_share
        if self.parallel_error:
            out["parallel_before"] = {"error": self.parallel_error}
        elif self.parallel_before is not None:
            out["parallel_before"] = self.parallel_before.to_json()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> HostSpeed:
        data = dict(data or {})
        parallel = data.pop("parallel_before", None) or {}
        steal = data.pop("steal_share", None)
        speed = cls(_pair(data.pop("python_ms_before", None)), _pair(data.pop("python_ms_after", None)),
                    float(steal) if steal is not None else None, parallel_error=str(parallel.get("error", "")))
        if not speed.parallel_error and {"procs", "ms", "cores"} <= set(parallel):
            speed.parallel_before = Capacity(list(parallel["procs"]), list(parallel["ms"]), list(parallel["cores"]))
        speed.other = data
        return speed

    @property
    def median_ms_before(self) -> float | None:
        """The workload's median time before the run, ms (None when not read)."""
        return self.python_ms_before[0] if self.python_ms_before else None

    @property
    def median_ms_after(self) -> float | None:
        return self.python_ms_after[0] if self.python_ms_after else None

    def capacity_cores(self) -> float | None:
        """The cores' worth of work the host did with its most processes at once, or None."""
        cores = self.parallel_before.cores[-1] if self.parallel_before and self.parallel_before.cores else None
        return float(cores) if isinstance(cores, (int, float)) else None

    def describe(self) -> str:
        """One line for the report."""
        before, after, steal = self.median_ms_before, self.median_ms_after, self.steal_share
        capacity = (f"; the host's capacity could not be read ({self.parallel_error})" if self.parallel_error else
                    f"; {self.parallel_before.describe()}" if self.parallel_before else "")
        return (f"a fixed Python workload took {before} ms before the run and {after} ms after it (median of "
                f"{REPEAT}; lower is faster, compare across runs); CPU time taken by the hypervisor (steal) during it: "
                + (f"{100 * steal:.1f} %" if steal is not None else "not reported") + capacity)


class HostWatch:
    """Started before a run, :meth:`finish` after it: the record the report prints."""

    def __init__(self) -> None:
        self.before = python_ms()
        self.parallel: Capacity | None = None
        self.parallel_error = ""
        try:
            self.parallel = capacity()
        except Exception as e:  # noqa: BLE001 - a reading, not the run: the run goes on without it
            self.parallel_error = f"{type(e).__name__}: {e}"
        self.times = _cpu_times()

    def finish(self) -> HostSpeed:
        after, times = python_ms(), _cpu_times()
        speed = HostSpeed(self.before, after, parallel_before=self.parallel, parallel_error=self.parallel_error)
        if self.times is not None and times is not None and "steal" in times:
            # guest time is already counted in user (Linux: /proc/stat), so it is left out of the total
            delta = {k: times[k] - self.times.get(k, 0.0) for k in times if not k.startswith("guest")}
            total = sum(delta.values())
            speed.steal_share = round(delta["steal"] / total, 4) if total > 0 else None
        return speed
