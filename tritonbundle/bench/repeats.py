"""Repeated measurements: on the H200 the knee moves ~15 % from one run to the next, so a figure is the
median of ``--repeat`` rounds (each round measures every system once, in turn, so slow drift on the
machine falls on all of them alike), reported with its spread. Free of I/O.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from tritonbundle.bench.accounting import ratio

#: ratio name -> (numerator system, denominator system)
RATIOS = {"bundle_over_naive": ("bundle", "naive"), "bundle_over_peer": ("bundle", "peer"),
          "bundle_over_ceiling": ("bundle", "ceiling")}
TARGETS = {"bundle_over_naive >= 8": ("bundle_over_naive", 8.0, 1), "bundle_over_peer >= 10": ("bundle_over_peer", 10.0, 1),
           "bundle_over_ceiling >= 0.75": ("bundle_over_ceiling", 0.75, 1),
           "computed_per_useful <= 1.15": ("computed_per_useful", 1.15, -1)}


def best_rps(record: dict[str, Any]) -> float | None:
    value = record.get("best_rps") if record.get("status") == "ok" else None
    return float(value) if value is not None else None


def spread(values: Sequence[float | None]) -> dict[str, Any]:
    """Median, range and spread (range / median) of the measured values; None values are failed runs."""
    measured = [v for v in values if v is not None]
    out: dict[str, Any] = {"values": list(values), "runs": len(values), "failed": len(values) - len(measured)}
    if measured:
        median = statistics.median(measured)
        out.update(median=median, min=min(measured), max=max(measured),
                   spread_pct=100.0 * (max(measured) - min(measured)) / median if median > 0 else None)
    return out


def combine(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One system's rounds as one record: the median round's record (its sweep, breakdown... describe a
    typical run), with ``repeats`` saying what every round measured. One round: that round, unchanged."""
    if len(records) == 1:
        return records[0]
    ok = [r for r in records if best_rps(r) is not None]
    if ok:
        ok.sort(key=lambda r: best_rps(r) or 0.0)
        chosen = dict(ok[(len(ok) - 1) // 2])
        chosen["best_rps"] = statistics.median(best_rps(r) or 0.0 for r in ok)
    else:
        chosen = dict(records[-1])
    chosen["repeats"] = spread([best_rps(r) for r in records])
    return chosen


def ratios(rounds: Sequence[dict[str, dict[str, Any]]], bundle: dict[str, Any]) -> dict[str, Any]:
    """The bundle's ratios, each the median over rounds of the ratio measured within one round (both
    systems on the same machine minutes apart), with its range; the padding figures of ``bundle`` (its
    combined record); and whether each target is met."""
    out: dict[str, Any] = {"rounds": len(rounds)}
    ranges: dict[str, Any] = {}
    for name, (num, den) in RATIOS.items():
        per_round = [ratio(best_rps(r.get(num, {})), best_rps(r.get(den, {}))) for r in rounds]
        s = spread(per_round)
        out[name] = s.get("median")
        if len(rounds) > 1 and s.get("median") is not None:
            ranges[name] = [s["min"], s["max"]]
    out["computed_per_useful"] = bundle.get("computed_per_useful")
    out["seq_padded_per_useful"] = bundle.get("seq_padded_per_useful")
    if ranges:
        out["ranges"] = ranges
    out["targets"] = {label: None if out[key] is None else sign * out[key] >= sign * bound
                      for label, (key, bound, sign) in TARGETS.items()}
    return out
