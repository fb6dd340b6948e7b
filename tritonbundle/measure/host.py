"""How fast this host ran the same work, so that runs from different calls (other machines, or one
machine on a slow spell) can be told apart from the settings they measure: a fixed single-thread
Python workload timed before and after a run, and the share of the CPU's time the hypervisor took
over the run (``steal`` in ``/proc/stat``, through psutil).

Why: on the H200 (2026-12-04) a call read every configuration at half the rate the call before had
read, on the same machine, with the load generators' CPU time per request up 40 % for code that had
not changed; nothing in the reports said whether the host was slower (docs/benchmarks.md, "the
plain-text tokenizer")."""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

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


def _cpu_times() -> dict[str, float] | None:
    try:
        import psutil
    except ImportError:
        return None
    return dict(psutil.cpu_times()._asdict())


class HostWatch:
    """Started before a run, :meth:`finish` after it: the record the report prints."""

    def __init__(self) -> None:
        self.before = python_ms()
        self.times = _cpu_times()

    def finish(self) -> dict[str, Any]:
        after, times = python_ms(), _cpu_times()
        out: dict[str, Any] = {"python_ms_before": list(self.before), "python_ms_after": list(after), "steal_share": None}
        if self.times is not None and times is not None and "steal" in times:
            # guest time is already counted in user (Linux: /proc/stat), so it is left out of the total
            delta = {k: times[k] - self.times.get(k, 0.0) for k in times if not k.startswith("guest")}
            total = sum(delta.values())
            out["steal_share"] = round(delta["steal"] / total, 4) if total > 0 else None
        return out


def describe(record: dict[str, Any]) -> str:
    """One line for the report."""
    before, after = record.get("python_ms_before") or [None], record.get("python_ms_after") or [None]
    steal = record.get("steal_share")
    return (f"a fixed Python workload took {before[0]} ms before the run and {after[0]} ms after it (median of "
            f"{REPEAT}; lower is faster, compare across runs); CPU time taken by the hypervisor (steal) during it: "
            + (f"{100 * steal:.1f} %" if steal is not None else "not reported"))
