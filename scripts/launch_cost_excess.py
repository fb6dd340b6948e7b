"""What the encoder instances' own launch costs make their plans cost on the GPU: each instance's table
(the replay times it measured at start-up) plans the same calls; every plan is priced with the fastest
time any instance of the given reports measured for each shape (the nearest to an undisturbed GPU the
reports hold) and compared with the plan that table itself chooses.

    .venv/bin/python scripts/launch_cost_excess.py docs/benchmarks/h200-launch-costs/*-bench.json [--texts 58]

Chat-like lengths (the synthetic sample, seed 1), ``--texts`` per encoder call (58.7 at the H200's
tokens-in knee), 300 calls. Prints, per report, its rate at the SLO and per instance the GPU time its
plans take over the best plan's (1.00: the same), then the mean over instances. An instance that timed
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


def tables(report: dict) -> list[Table]:
    """Each encoder instance's launch times (seconds per shape) in a bench.json's first model."""
    entry = next(iter(report["models"].values()))
    return [{(int(b), int(s)): ms / 1e3 for b, s, ms in ((*k.split("x"), v) for k, v in inst["timings_ms"].items())}
            for inst in entry["systems"].get("bundle", {}).get("encoder_instances") or [] if inst.get("timings_ms")]


def excess(table: Table, truth: Table, calls: list[np.ndarray]) -> float:
    """GPU time of ``table``'s plans for ``calls``, priced by ``truth``, over ``truth``'s own plans'."""
    targets, buckets = sorted({s for _, s in truth}), sorted({b for b, _ in truth})

    def planner(t: Table) -> LaunchPlanner:
        return LaunchPlanner(targets, buckets, {k: v + LAUNCH_OVERHEAD_S for k, v in t.items()})

    priced = planner(truth)
    chosen = [planner(t) for t in (table, truth)]
    cost = [sum(priced.launch_cost(p.plan_packed(call)[1]) for call in calls) for p in chosen]
    return cost[0] / cost[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--texts", type=int, default=58)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    reports = {path: json.loads(path.read_text()) for path in args.reports}
    every = [t for r in reports.values() for t in tables(r)]
    if not every:
        raise SystemExit("no encoder instance with launch timings in these reports")
    truth = {shape: min(t[shape] for t in every if shape in t) for shape in every[0]}
    lengths = np.minimum(synthetic("chat", n=20000, seed=1).row_lengths(), max(s for _, s in truth))
    rng = np.random.default_rng(1)
    calls = [rng.choice(lengths, args.texts) for _ in range(args.calls)]
    for path, report in reports.items():
        if not tables(report):
            continue
        entry = next(iter(report["models"].values()))
        rps = entry["systems"]["bundle"].get("best_rps")
        found = [excess(t, truth, calls) for t in tables(report)]
        print(f"{path.name}: {rps or 0:,.0f} req/s; GPU time per call over the best plan's: "
              + ", ".join(f"{x:.2f}" for x in found) + f" (mean {np.mean(found):.2f})")


if __name__ == "__main__":
    main()
