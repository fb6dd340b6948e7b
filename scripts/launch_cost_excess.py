"""What the encoder instances' own launch costs make their plans cost on the GPU: each instance's table
(the replay times it measured at start-up) plans the same calls; every plan is priced with the fastest
time any instance of the same model in the given reports measured for each shape (the nearest to an
undisturbed GPU the reports hold) and compared with the plan that table itself chooses.

    .venv/bin/python scripts/launch_cost_excess.py docs/benchmarks/h200-launch-costs/*-bench.json [--texts 58]

Chat-like lengths (the synthetic sample, seed 1), ``--texts`` per encoder call (58.7-61.9 rows at the
H200's tokens-in knees), 300 calls. Prints, per report and model, its rate at the SLO and per instance
the GPU time its plans take over the best plan's (1.00: the same), then the mean over instances. An instance that timed
its launches while others used the GPU stretched some shapes more than others, and its planner then
chooses launches that are not the cheapest (docs/benchmarks.md, "the launch costs").
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from tritonbundle.runtimes.pytorch.engine import LAUNCH_OVERHEAD_S
from tritonbundle.runtimes.pytorch.launch import LaunchPlanner
from tritonbundle.traffic import synthetic

Table = dict[tuple[int, int], float]


def tables(report: dict) -> dict[str, list[Table]]:
    """Per model of a bench.json, each encoder instance's launch times (seconds per shape)."""
    found: dict[str, list[Table]] = {}
    for model, entry in report["models"].items():
        instances = entry["systems"].get("bundle", {}).get("encoder_instances") or []
        found[model] = [{(int(b), int(s)): ms / 1e3 for b, s, ms in ((*k.split("x"), v) for k, v in inst["timings_ms"].items())}
                        for inst in instances if inst.get("timings_ms")]
    return {model: t for model, t in found.items() if t}


def excess(table: Table, truth: Table, calls: list[np.ndarray]) -> float:
    """GPU time of ``table``'s plans for ``calls``, priced by ``truth``, over ``truth``'s own plans'."""
    targets, buckets = sorted({s for _, s in truth}), sorted({b for b, _ in truth})

    def planner(t: Table) -> LaunchPlanner:
        return LaunchPlanner(targets, buckets, {k: v + LAUNCH_OVERHEAD_S for k, v in t.items()})

    priced = planner(truth)
    chosen = [planner(table), priced]  # the truth's own plans are priced by its own planner
    cost = [sum(priced.launch_cost(p.plan_packed(call)[1]) for call in calls) for p in chosen]
    return cost[0] / cost[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--texts", type=int, default=58)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    reports = {path: json.loads(path.read_text()) for path in args.reports}
    every: dict[str, list[Table]] = {}  # per model: its tables in every report (one model's truth)
    for report in reports.values():
        for model, found in tables(report).items():
            every.setdefault(model, []).extend(found)
    if not every:
        raise SystemExit("no encoder instance with launch timings in these reports")
    truths = {model: {shape: min(t[shape] for t in found if shape in t) for shape in found[0]}
              for model, found in every.items()}
    lengths = synthetic("chat", n=20000, seed=1).row_lengths()
    calls: dict[str, list[np.ndarray]] = {}  # per model, the same calls for every report
    for model, truth in truths.items():
        rng = np.random.default_rng(1)
        calls[model] = [rng.choice(np.minimum(lengths, max(s for _, s in truth)), args.texts) for _ in range(args.calls)]
    for path, report in reports.items():
        for model, found in tables(report).items():
            rps = report["models"][model]["systems"]["bundle"].get("best_rps")
            ratios = [excess(t, truths[model], calls[model]) for t in found]
            print(f"{path.name} {model}: {rps or 0:,.0f} req/s; GPU time per call over the best plan's: "
                  + ", ".join(f"{x:.2f}" for x in ratios) + f" (mean {np.mean(ratios):.2f})")


if __name__ == "__main__":
    main()
