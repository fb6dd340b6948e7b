"""The benchmark's arithmetic, free of I/O: ratios, padding accounting and the engine ceiling."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from tritonbundle.bench.records import CeilingRow
from tritonbundle.contract import target_index


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing or the denominator is not positive."""
    if numerator is None or denominator is None or not denominator > 0 or not math.isfinite(numerator):
        return None
    return float(numerator) / float(denominator)


def bucket_shares(lengths: Sequence[int] | npt.NDArray[np.int64], targets: Sequence[int]) -> dict[int, float]:
    """Share of rows whose padding target (smallest target >= length) is each target."""
    lengths = np.asarray(lengths, dtype=np.int64)
    ordered = sorted(int(t) for t in targets)
    counts = np.bincount(target_index(lengths, ordered), minlength=len(ordered))
    return {t: float(c) / max(1, lengths.size) for t, c in zip(ordered, counts)}


def padding_accounting(lengths: Sequence[int] | npt.NDArray[np.int64], targets: Sequence[int]) -> dict[str, float]:
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


def ceiling(timings: Mapping[tuple[int, int], float], shares: Mapping[int, float], mean_tokens: float,
            slo_s: float) -> tuple[list[CeilingRow], CeilingRow | None]:
    """Requests/s the engine sustains at each batch size when every launch is full and every row sits at
    its padding target, weighted by the sample's share of rows per target.

    For batch ``B``: seconds per row = sum over targets of share(S) * t(B, S) / B. A batch size is
    feasible when its slowest shape, t(B, max S), fits in the SLO. The best is the feasible batch size
    with the most requests/s (at the sample's mean length, one row per request): ``(rows, best)``.
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
        rows.append(CeilingRow(batch=b, requests_per_s=rps, useful_tokens_per_s=rps * mean_tokens,
                               computed_tokens_per_s=rps * computed, worst_batch_ms=worst * 1000.0,
                               feasible=worst <= slo_s))
    feasible = [r for r in rows if r.feasible]
    return rows, max(feasible, key=lambda r: r.requests_per_s) if feasible else None
