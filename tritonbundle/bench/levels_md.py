"""The report's sections per load level: latency at each offered load, the failed requests, the refusals
past the knee, and what the host did to a bystander process during the levels (host stalls); and the
number formats every part of ``bench.md`` uses."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from tritonbundle.bench.records import ServedResult
from tritonbundle.bench.result import ModelResult
from tritonbundle.errors import QUEUE_FULL
from tritonbundle.measure import stalls
from tritonbundle.measure.latency import StepResult

SYSTEMS = ("naive", "peer", "bundle")


def fmt(value: Any, spec: str = ".1f", none: str = "-") -> str:
    """A figure for the report: ``none`` when missing, "inf" for an infinite one."""
    if value is None:
        return none
    if value == "inf" or (isinstance(value, float) and math.isinf(value)):
        return "inf"
    try:
        return format(float(value), spec)
    except (TypeError, ValueError):
        return str(value)


def shown_ms(value: float) -> float | None:
    """A level's latency as the report shows it: NaN (nothing answered) is missing, inf stays."""
    return None if math.isnan(value) else value


def level_lines(entry: ModelResult) -> list[str]:
    """The model's levels, by offered rate and system, then what failed, refusals past the knee and
    host stalls."""
    served = {system: entry.system(system, ServedResult) for system in SYSTEMS}
    sweeps = {system: result.sweep for system, result in served.items() if result is not None}
    levels: dict[float, dict[str, StepResult]] = {}
    for system, sweep in sweeps.items():
        for s in sweep.steps:
            levels.setdefault(round(float(s.offered_rps), 1), {})[system] = s
    if not levels:
        return []
    steps = [s for sweep in sweeps.values() for s in sweep.steps]
    probed = any(s.extra.get("host_probe_s") is not None for s in steps)
    pressure = any(s.extra.get("host_cpu_wait") is not None for s in steps)
    marks = ((f"; where the host stalled the probe {stalls.LONG_STALL_MS:g}+ ms: how often, the longest" if probed else "")
             + (f"; where tasks waited for a CPU {100 * stalls.CPU_WAIT_SHOWN:g}+ % of the time: that share"
                if pressure else ""))
    out = ["", f"Latency at each offered load (p50 / p99 ms; answered req/s{marks}):", "",
           "| offered req/s | naive | peer | bundle |", "|---:|---|---|---|"]
    for rate in sorted(levels):
        cells = []
        for system in SYSTEMS:
            level = levels[rate].get(system)
            cells.append(f"{fmt(shown_ms(level.p50_ms))} / {fmt(shown_ms(level.p99_ms))}; {fmt(level.achieved_rps)}"
                         f"{'' if level.passed else ' (missed)'}{_stalled(level)}" if level else "-")
        out.append(f"| {rate:g} | {cells[0]} | {cells[1]} | {cells[2]} |")
    failed = [(system, level) for rate in sorted(levels) for system, level in levels[rate].items() if level.failed]
    if failed:
        out += ["", "Failed requests (refused, timed out or unanswered), by level:", ""]
        out += [f"- {system} at {level.offered_rps:,.0f} req/s offered: {level.failed:,} of {level.sent:,} "
                f"({100 * level.error_ratio:.1f} %): " + "; ".join(
                    f"{n:,} {_REQUEST_ID.sub('', why)}" for why, n in (level.extra.get("errors") or {}).items())
                for system, level in failed]
    for system, sweep in sweeps.items():
        refused = _refused_past_the_knee(sweep.steps, sweep.best_rps)
        if refused is not None:
            out.append(f"\n{system}: the first level past its rate at the SLO ({refused.offered_rps:,.0f} req/s) missed "
                       f"on refusals: the server refused {100 * refused.error_ratio:.1f} % of its requests for a full "
                       f"queue ({QUEUE_FULL}): the queue's bound (`max_queue_size`, by default two full batches per "
                       "instance) was reached, by a burst or by more requests than the instances served; a larger "
                       "bound passes the level only in the first case")
    stalled = [line for system, sweep in sweeps.items() if (line := host_stall_line(system, sweep.steps))]
    if stalled:
        out += ["", f"Host stalls (a process of its own that sleeps 1 ms at a time and is late only when no core "
                f"was given to it: `tritonbundle/measure/stalls.py`), levels with a wake-up {stalls.LONG_STALL_MS:g}+ ms "
                "late:", "", *stalled]
    return out


def _stalled(level: StepResult) -> str:
    n, wait = level.extra.get("host_long_stalls"), level.extra.get("host_cpu_wait")
    return ((f"; host {n}x, {level.extra.get('host_stall_max_ms', 0):.0f} ms" if n else "")
            + (f"; CPU wait {100 * wait:.0f} %" if wait is not None and wait >= stalls.CPU_WAIT_SHOWN else ""))


def host_stall_line(system: str, steps: Sequence[StepResult]) -> str:
    """How many of the system's passing levels (all at or below its knee) and of its missed levels past
    the knee saw the probe stalled (long stalls); ``""`` when the probe watched none of them. Missed levels
    past the knee with stalls, and passing ones without, say the knee moved with the host; stalls on every
    level say nothing either way. (The knee by offered rate: its answered rate may read a little lower.)"""
    watched = [s for s in steps if s.extra.get("host_probe_s") is not None]
    if not watched:
        return ""
    knee = max((s.offered_rps for s in steps if s.passed), default=0.0)
    below = [s for s in watched if s.passed]
    past = [s for s in watched if not s.passed and s.offered_rps > knee]

    def part(levels: list[StepResult], what: str) -> str:
        hit = [s for s in levels if s.extra.get("host_long_stalls")]
        worst = max((float(s.extra.get("host_stall_max_ms") or 0.0) for s in hit), default=0.0)
        waits = [100 * float(w) for s in levels if (w := s.extra.get("host_cpu_wait")) is not None]
        return (f"{len(hit)} of the {len(levels)} {what}" + (f" (the longest {worst:.0f} ms)" if hit else "")
                + (f", CPU wait {min(waits):.0f}-{max(waits):.0f} % of the time" if waits else ""))

    return f"- {system}: {part(below, 'passing levels up to its rate at the SLO')}; {part(past, 'missed levels past it')}"


#: Triton's request id in its error texts ("[request id: <id_unknown>] "), left out of the report.
_REQUEST_ID = re.compile(r"\[request id: [^\]]*\] ")


def _refused_past_the_knee(steps: Sequence[StepResult], best_rps: float | None) -> StepResult | None:
    """The lowest missed level above the best passing rate, when failures decided its miss (at least 1 %
    failed, so its p99 is infinite) and most of them are refusals for a full queue; none when its p99 of
    answered requests missed (a few refusals under 1 % do not decide it)."""
    past = sorted((s for s in steps if not s.passed and s.offered_rps > (best_rps or 0.0)), key=lambda s: s.offered_rps)
    if not past or not past[0].failed or not math.isinf(past[0].p99_ms):
        return None
    errors = past[0].extra.get("errors") or {}
    return past[0] if 2 * sum(n for why, n in errors.items() if QUEUE_FULL in why) > past[0].failed else None
