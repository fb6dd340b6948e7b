"""Latency bookkeeping, free of I/O: percentiles, load-level results and the SLO gate.

One convention everywhere (load tests, benchmark, tuner): latencies in milliseconds, rates in
requests per second, percentiles by linear interpolation between order statistics (numpy's default)
over every request sent, a failed or unanswered request counting as an infinite latency. So a level
with more than 1 % failures cannot meet a p99 SLO, whatever its answered requests did.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
import numpy.typing as npt

PERCENTILES = (50.0, 90.0, 95.0, 99.0)
PERCENTILE_FIELDS = tuple(f"p{q:g}_ms" for q in PERCENTILES)


def percentile(values: Sequence[float] | npt.NDArray[np.float64], q: float) -> float:
    """The q-th percentile (linear interpolation between order statistics, as numpy's default).

    ``inf`` entries (failures) sort last; a percentile that lands on or between them is ``inf``.
    Empty input gives ``nan``.
    """
    arr = np.sort(np.asarray(values, dtype=np.float64))
    if arr.size == 0:
        return math.nan
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    pos = (arr.size - 1) * q / 100.0
    lo, hi = int(math.floor(pos)), int(math.ceil(pos))
    if math.isinf(arr[hi]) or math.isinf(arr[lo]):
        return math.inf
    return float(arr[lo] + (arr[hi] - arr[lo]) * (pos - lo))


def latency_summary(latencies_ms: Iterable[float], failures: int = 0) -> dict[str, float]:
    """p50/p90/p95/p99, mean and max over answered requests plus ``failures`` infinite latencies
    (the mean is of the answered ones)."""
    ok = np.asarray(list(latencies_ms), dtype=np.float64)
    values = np.concatenate([ok, np.full(int(failures), math.inf)])
    out = {f"p{q:g}_ms": percentile(values, q) for q in PERCENTILES}
    out["mean_ms"] = float(ok.mean()) if ok.size else math.nan
    out["max_ms"] = float(values.max()) if values.size else math.nan
    return out


#: Failed requests a measured load level may have and still meet the SLO (bench, tune, the CLI's
#: ``--max-failure-ratio``): a level that loses one request in a hundred is not a capacity.
FAILURE_BUDGET = 0.01


@dataclass
class Slo:
    """A latency objective: percentile bounds (None: not gated) and the share of requests that may fail."""

    p95_ms: float | None = None
    p99_ms: float | None = None
    max_failure_ratio: float = 0.0

    def violations(self, summary: Mapping[str, Any], *, sent: int, failed: int, label: str = "") -> list[str]:
        """Why a set of requests (``summary`` from :func:`latency_summary`) breaks the objective."""
        prefix = f"{label}: " if label else ""
        if sent == 0:
            return [f"{prefix}no requests were sent"]
        out = []
        ratio = failed / sent
        if ratio > self.max_failure_ratio:
            out.append(f"{prefix}failure ratio {ratio:.3f} > {self.max_failure_ratio:g}")
        for name, bound in (("p95", self.p95_ms), ("p99", self.p99_ms)):
            value = summary.get(f"{name}_ms")
            if bound is not None and not (value is not None and value <= bound):
                shown = "inf" if value is None or math.isinf(value) else f"{value:.1f}"
                out.append(f"{prefix}{name} {shown} ms > SLO {bound:g} ms")
        return out

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class StepResult:
    """One load level: what was offered, what came back, and whether it met the SLO."""

    offered_rps: float
    window_s: float
    sent: int
    completed: int
    failed: int
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    achieved_rps: float
    passed: bool = False
    reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def error_ratio(self) -> float:
        return self.failed / self.sent if self.sent else 0.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key, value in list(data.items()):
            if isinstance(value, float) and not math.isfinite(value):
                data[key] = None if math.isnan(value) else "inf"
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StepResult:
        """A level as :meth:`to_json` wrote it ("inf" back to infinity, null back to NaN). A field older
        reports lack (``p95_ms`` before it was recorded) reads as NaN."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in data:
                continue
            value = data[f.name]
            if f.type == "float":
                value = math.nan if value is None else float(value)
            values[f.name] = value
        for name in PERCENTILE_FIELDS:
            values.setdefault(name, math.nan)
        values["extra"] = dict(values.get("extra") or {})
        return cls(**values)


def step_result(offered_rps: float, window_s: float, latencies_ms: Sequence[float], failed: int,
                sent: int | None = None, extra: Mapping[str, Any] | None = None) -> StepResult:
    """Summarise one measured window. ``sent`` defaults to answered + failed; unanswered requests fail."""
    completed = len(latencies_ms)
    sent = completed + failed if sent is None else sent
    summary = latency_summary(latencies_ms, failed + max(0, sent - completed - failed))
    return StepResult(
        offered_rps=float(offered_rps), window_s=float(window_s), sent=int(sent), completed=completed,
        failed=int(sent - completed), p50_ms=summary["p50_ms"], p90_ms=summary["p90_ms"], p95_ms=summary["p95_ms"],
        p99_ms=summary["p99_ms"], mean_ms=summary["mean_ms"], max_ms=summary["max_ms"],
        achieved_rps=completed / window_s if window_s > 0 else 0.0, extra=dict(extra or {}),
    )


#: A level whose load generators sent this late on average (ms) measured the clients, not the server;
#: or a tenth of the SLO when that is more (client_lag_limit_ms).
CLIENT_LAG_LIMIT_MS = 2.0


def client_lag_limit_ms(slo: Slo) -> float:
    """How late the load generators may send, on average, before a level is client-bound: 2 ms, or a
    tenth of the latency objective when that is more. A fixed 2 ms rejected every level of an H200 tune
    at 0.5-4 req/s (3.4 ms late, p99 8-13 ms against a 50 ms SLO): scheduling jitter, not saturation."""
    bound = slo.p99_ms if slo.p99_ms is not None else slo.p95_ms
    return max(CLIENT_LAG_LIMIT_MS, (bound or 0.0) / 10)


def judge(step: StepResult, slo: Slo) -> StepResult:
    """Set ``passed``/``reason`` from the SLO gate. A level during which the system went down
    (``extra["down"]``) fails, whatever it answered. A level whose clients fell behind their schedule
    (``extra["client_lag_mean_ms"]`` over :data:`CLIENT_LAG_LIMIT_MS`) is client-bound: it does not
    count as passed, whatever its latencies, and says so; when that is its only problem
    (``extra["client_bound_only"]``) it measured the clients alone, and a rate search does not take it
    for the system's miss (a level that also lost requests or missed the latency bound is one: an
    overloaded server makes its clients late too)."""
    problems = slo.violations(asdict(step), sent=step.sent, failed=step.failed)
    if step.extra.get("down"):
        problems.insert(0, f"the system went down: {step.extra['down']}")
    lag = step.extra.get("client_lag_mean_ms")
    limit = client_lag_limit_ms(slo)
    if lag is not None and lag > limit:
        step.extra["client_bound"] = True
        step.extra["client_bound_only"] = not problems
        problems.append(f"client-bound: the load generators sent {lag:.1f} ms late on average "
                        f"(limit {limit:g} ms): the clients, not the server, set this level")
    step.passed = not problems
    bound = slo.p99_ms if slo.p99_ms is not None else slo.p95_ms
    step.reason = "; ".join(problems) if problems else (
        f"p99 {step.p99_ms:.1f} ms <= SLO {bound:g} ms" if bound is not None else "no failures over the allowed ratio"
    )
    return step
