"""The benchmark's bookkeeping, free of I/O: latency percentiles, SLO checks, the rate search,
ratios, padding accounting and the engine ceiling. Unit-tested with synthetic latency models.

Conventions: latencies in milliseconds, rates in requests per second. A failed or unanswered
request counts as an infinite latency, so a step with more than 1 % failures cannot meet a p99 SLO.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

PERCENTILES = (50.0, 90.0, 99.0)


# -- latencies -----------------------------------------------------------------------------------------
def percentile(values: Sequence[float] | np.ndarray, q: float) -> float:
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
    """p50/p90/p99/mean/max of the answered requests, failures counted as infinite latencies."""
    ok = np.asarray(list(latencies_ms), dtype=np.float64)
    values = np.concatenate([ok, np.full(int(failures), math.inf)])
    out = {f"p{q:g}_ms": percentile(values, q) for q in PERCENTILES}
    out["mean_ms"] = float(ok.mean()) if ok.size else math.nan
    out["max_ms"] = float(values.max()) if values.size else math.nan
    return out


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


def step_result(offered_rps: float, window_s: float, latencies_ms: Sequence[float], failed: int,
                sent: int | None = None, extra: Mapping[str, Any] | None = None) -> StepResult:
    """Summarise one measured window. ``sent`` defaults to answered + failed."""
    completed = len(latencies_ms)
    sent = completed + failed if sent is None else sent
    summary = latency_summary(latencies_ms, failed + max(0, sent - completed - failed))
    return StepResult(
        offered_rps=float(offered_rps), window_s=float(window_s), sent=int(sent), completed=completed,
        failed=int(sent - completed), p50_ms=summary["p50_ms"], p90_ms=summary["p90_ms"], p99_ms=summary["p99_ms"],
        mean_ms=summary["mean_ms"], max_ms=summary["max_ms"],
        achieved_rps=completed / window_s if window_s > 0 else 0.0, extra=dict(extra or {}),
    )


def judge(step: StepResult, slo_ms: float, *, max_error_ratio: float = 0.01) -> StepResult:
    """Set ``passed``/``reason``: p99 within the SLO and at most ``max_error_ratio`` of requests failed."""
    if step.sent == 0:
        step.passed, step.reason = False, "no requests were sent"
    elif step.error_ratio > max_error_ratio:
        step.passed, step.reason = False, f"{step.error_ratio:.1%} of requests failed (at most {max_error_ratio:.0%})"
    elif not step.p99_ms <= slo_ms:
        step.passed, step.reason = False, f"p99 {step.p99_ms:.1f} ms > SLO {slo_ms:g} ms"
    else:
        step.passed, step.reason = True, f"p99 {step.p99_ms:.1f} ms <= SLO {slo_ms:g} ms"
    return step


# -- the rate search ------------------------------------------------------------------------------------
@dataclass
class Sweep:
    steps: list[StepResult]
    best: StepResult | None
    #: Why the search ended ("bracketed", "max rate", "time budget", "missed at the lowest rate"...).
    stopped: str

    @property
    def best_rps(self) -> float | None:
        return self.best.achieved_rps if self.best is not None else None

    def to_json(self) -> dict[str, Any]:
        return {"steps": [s.to_json() for s in self.steps], "best": self.best.to_json() if self.best else None,
                "best_rps": self.best_rps, "stopped": self.stopped}


def search_rate(
    measure: Callable[[float], StepResult], *, slo_ms: float, start: float, factor: float = 4.0,
    refine: int = 3, max_rate: float = math.inf, max_error_ratio: float = 0.01,
    can_continue: Callable[[], bool] | None = None, max_down: int = 3,
) -> Sweep:
    """Highest throughput whose p99 meets the SLO: a geometric ladder up from ``start`` (x ``factor``)
    until a level fails (when the first one fails: down by ``factor``, at most ``max_down`` times,
    until one passes), then ``refine`` bisections (geometric midpoints) between the last level that
    passed and the first that failed. At most ``log(max/start)/log(factor) + 1 + refine`` levels.
    ``can_continue()`` is asked before every level (the time budget).
    """
    if start <= 0 or factor <= 1:
        raise ValueError("start must be > 0 and factor > 1")
    steps: list[StepResult] = []
    ok = can_continue or (lambda: True)

    def run(rate: float) -> StepResult:
        step = judge(measure(rate), slo_ms, max_error_ratio=max_error_ratio)
        steps.append(step)
        return step

    lo: float | None = None
    hi: float | None = None
    rate = start
    stopped = "max rate"
    while rate <= max_rate * (1 + 1e-9):
        if not ok():
            stopped = "time budget"
            break
        if run(rate).passed:
            lo = rate
            rate *= factor
        else:
            hi = rate
            if lo is None:
                # Missed at the start: step down (bounded) until a level passes, then refine above it.
                for _ in range(max_down):
                    if not ok():
                        break
                    rate /= factor
                    if run(rate).passed:
                        lo = rate
                        break
                    hi = rate
            stopped = "bracketed" if lo is not None else "missed at the lowest rate"
            break
    if lo is not None and hi is not None:
        for _ in range(refine):
            if not ok():
                stopped = "time budget"
                break
            mid = math.sqrt(lo * hi)
            if run(mid).passed:
                lo = mid
            else:
                hi = mid
    passing = [s for s in steps if s.passed]
    best = max(passing, key=lambda s: s.achieved_rps) if passing else None
    return Sweep(steps, best, stopped)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing or the denominator is not positive."""
    if numerator is None or denominator is None or not denominator > 0 or not math.isfinite(numerator):
        return None
    return float(numerator) / float(denominator)


# -- padding ----------------------------------------------------------------------------------------------
def bucket_shares(lengths: Sequence[int] | np.ndarray, targets: Sequence[int]) -> dict[int, float]:
    """Share of rows whose padding target (smallest target >= length) is each target."""
    lengths = np.asarray(lengths, dtype=np.int64)
    targets = sorted(int(t) for t in targets)
    index = np.searchsorted(np.asarray(targets), lengths, side="left")
    if index.size and int(index.max()) >= len(targets):
        raise ValueError(f"lengths above the last target {targets[-1]}")
    counts = np.bincount(index, minlength=len(targets))
    return {t: float(c) / max(1, lengths.size) for t, c in zip(targets, counts)}


def padding_accounting(lengths: Sequence[int] | np.ndarray, targets: Sequence[int]) -> dict[str, float]:
    """Useful tokens vs tokens computed when every row is padded to its target (no batch padding)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    shares = bucket_shares(lengths, targets)
    useful = float(lengths.sum())
    padded = float(sum(share * lengths.size * t for t, share in shares.items()))
    return {"useful_tokens": useful, "padded_tokens": padded, "computed_per_useful": padded / useful if useful else math.nan}


def tokens_ratio(stats: Mapping[str, float]) -> dict[str, float | None]:
    """From the encoder's counters: computed/useful with sequence padding only, and with batch padding too."""
    useful = float(stats.get("useful_tokens", 0) or 0)
    return {
        "useful_tokens": useful,
        "seq_padded_tokens": float(stats.get("seq_tokens", 0) or 0),
        "computed_tokens": float(stats.get("computed_tokens", 0) or 0),
        "seq_padded_per_useful": ratio(stats.get("seq_tokens"), useful),
        "computed_per_useful": ratio(stats.get("computed_tokens"), useful),
    }


# -- the engine ceiling -----------------------------------------------------------------------------------
def ceiling(timings: Mapping[tuple[int, int], float], shares: Mapping[int, float], mean_tokens: float,
            slo_s: float) -> dict[str, Any]:
    """Requests/s the engine sustains at each batch size when every launch is full and every row sits at
    its padding target, weighted by the sample's share of rows per target.

    For batch ``B``: seconds per row = sum over targets of share(S) * t(B, S) / B. A batch size is
    feasible when its slowest shape, t(B, max S), fits in the SLO. The best is the feasible batch size
    with the most requests/s (at the sample's mean length, one row per request).
    """
    batches = sorted({b for b, _ in timings})
    rows = []
    for b in batches:
        per_row = 0.0
        computed = 0.0
        missing = False
        for s, share in shares.items():
            if share <= 0:
                continue
            if (b, s) not in timings:
                missing = True
                break
            per_row += share * timings[(b, s)] / b
            computed += share * s
        if missing or per_row <= 0:
            continue
        worst = max(timings[(b, s)] for s in shares if (b, s) in timings)
        rps = 1.0 / per_row
        rows.append({
            "batch": b, "requests_per_s": rps, "useful_tokens_per_s": rps * mean_tokens,
            "computed_tokens_per_s": rps * computed, "worst_batch_ms": worst * 1000.0,
            "feasible": worst <= slo_s,
        })
    feasible = [r for r in rows if r["feasible"]]
    best = max(feasible, key=lambda r: r["requests_per_s"]) if feasible else None
    return {"per_batch": rows, "best": best, "best_rps": best["requests_per_s"] if best else None}
