"""Repeated measurements: on the H200 the knee moves ~15 % from one run to the next, so a figure is the
median of ``--repeat`` rounds (each round measures every system once, in turn, so slow drift on the
machine falls on all of them alike), reported with its spread. Free of I/O.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence

from tritonbundle.bench.accounting import ratio
from tritonbundle.bench.records import BundleResult, Spread, SystemResult
from tritonbundle.bench.result import Ratios
from tritonbundle.recipes import CEILING_TARGET

#: ratio name -> (numerator system, denominator system)
RATIOS = {"bundle_over_naive": ("bundle", "naive"), "bundle_over_peer": ("bundle", "peer"),
          "bundle_over_ceiling": ("bundle", "ceiling")}


def targets(ceiling_target: float = CEILING_TARGET) -> dict[str, tuple[str, float, int]]:
    """The bench's targets: label -> (figure, bound, sign: 1 for at least, -1 for at most); the share of the
    ceiling is the model's (:attr:`tritonbundle.recipes.Recipe.ceiling_target`)."""
    return {"bundle_over_naive >= 8": ("bundle_over_naive", 8.0, 1), "bundle_over_peer >= 10": ("bundle_over_peer", 10.0, 1),
            f"bundle_over_ceiling >= {ceiling_target:g}": ("bundle_over_ceiling", ceiling_target, 1),
            "computed_per_useful <= 1.15": ("computed_per_useful", 1.15, -1)}


def best_rps(record: SystemResult) -> float | None:
    """A system's rate at the SLO when it ran (None: failed, skipped or no rate met the SLO)."""
    value = record.best_rps if record.status == "ok" else None
    return float(value) if value is not None else None


def counted_rps(system: str, record: SystemResult | None) -> float | None:
    """A round's rate as every median over rounds counts it (bench's repeats and ratios, compare's tables):
    the rate it sustained at the SLO. A bundle round that ran and failed (the server crashed, or no rate met
    the SLO) counts as 0: that is a result about the bundle. A reference's (the ceiling's, the peer's, the
    naive server's) failed round, and any skipped or missing one, is left out (None): it says nothing about
    the bundle, and a ratio's denominator must not be a zero."""
    if record is None or record.status == "skipped":
        return None
    rate = best_rps(record)
    return 0.0 if rate is None and system == "bundle" else rate


def spread(values: Sequence[float | None]) -> Spread:
    """Median, range and spread (range / median) of the measured values; None values are failed runs."""
    measured = [v for v in values if v is not None]
    if not measured:
        return Spread(list(values), runs=len(values), failed=len(values))
    median = statistics.median(measured)
    return Spread(list(values), runs=len(values), failed=len(values) - len(measured), median=median,
                  min=min(measured), max=max(measured),
                  spread_pct=100.0 * (max(measured) - min(measured)) / median if median > 0 else None)


def combine(system: str, records: Sequence[SystemResult]) -> SystemResult:
    """One system's rounds as one record: the median round's record (its sweep, breakdown... describe a
    typical run) with the median of the rounds' rates as :func:`counted_rps` counts them, and ``repeats``
    saying what every round measured and how many failed. One round: that round, unchanged."""
    if len(records) == 1:
        return records[0]
    rates = [counted_rps(system, r) for r in records]
    counted = dataclasses.replace(spread(rates), failed=sum(r.status != "skipped" and best_rps(r) is None
                                                            for r in records))
    median = counted.median
    if median is None:
        return dataclasses.replace(records[-1], repeats=counted)
    # The round nearest the median (a failed one when the failures are the median: its status says so).
    nearest = min((abs(rate - median), best_rps(r) is not None, i) for i, (r, rate) in enumerate(zip(records, rates))
                  if rate is not None)
    chosen = records[nearest[2]]
    if best_rps(chosen) is not None:
        chosen = dataclasses.replace(chosen, best_rps=median)
    return dataclasses.replace(chosen, repeats=counted)


def ratios(rounds: Sequence[Mapping[str, SystemResult]], bundle: SystemResult | None, *,
           ceiling_target: float = CEILING_TARGET) -> Ratios:
    """The bundle's ratios, each the median over rounds of the ratio measured within one round (both
    systems on the same machine minutes apart), with its range; the padding figures of ``bundle`` (its
    combined record); and whether each target is met."""
    medians: dict[str, float | None] = {}
    ranges: dict[str, list[float]] = {}
    for name, (num, den) in RATIOS.items():
        per_round = [ratio(_rps(r, num), _rps(r, den)) for r in rounds]
        s = spread(per_round)
        medians[name] = s.median
        if len(rounds) > 1 and s.median is not None and s.min is not None and s.max is not None:
            ranges[name] = [s.min, s.max]
    figures: dict[str, float | None] = {
        **medians, "computed_per_useful": bundle.computed_per_useful if bundle else None,
        "seq_padded_per_useful": bundle.seq_padded_per_useful if isinstance(bundle, BundleResult) else None,
    }
    met: dict[str, bool | None] = {}
    for label, (key, bound, sign) in targets(ceiling_target).items():
        value = figures[key]
        met[label] = None if value is None else sign * value >= sign * bound
    return Ratios(rounds=len(rounds), bundle_over_naive=figures["bundle_over_naive"],
                  bundle_over_peer=figures["bundle_over_peer"], bundle_over_ceiling=figures["bundle_over_ceiling"],
                  computed_per_useful=figures["computed_per_useful"],
                  seq_padded_per_useful=figures["seq_padded_per_useful"], ranges=ranges or None, targets=met,
                  ceiling_target=ceiling_target)


def _rps(round_: Mapping[str, SystemResult], system: str) -> float | None:
    return counted_rps(system, round_.get(system))
