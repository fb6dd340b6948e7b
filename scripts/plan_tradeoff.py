"""Tokens against GPU time: the launch planner's least-time plans next to least-token plans, priced with
an H200 run's measured CUDA-graph times.

    .venv/bin/python scripts/plan_tradeoff.py docs/benchmarks/h200-minilm.json minilm 37

Chat-like lengths (the synthetic sample, seed 1), ``texts`` per encoder call (the run's average batch at
its knee), 200 calls. Prints computed/useful tokens and GPU milliseconds per call for both objectives.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from tritonbundle.runtimes.pytorch import launch
from tritonbundle.traffic import synthetic


def main(report: str, model: str, texts: int, calls: int = 200) -> None:
    timings = json.load(open(report))["models"][model]["systems"]["bundle"]["encoder_instances"][0]["timings_ms"]
    cost = {(int(b), int(s)): ms / 1e3 for b, s, ms in ((*k.split("x"), v) for k, v in timings.items())}
    targets, buckets = sorted({s for _, s in cost}), sorted({b for b, _ in cost})
    timed = launch.LaunchPlanner(targets, buckets, cost)
    # Least tokens; among plans of equal tokens, the fewest launches (the 1e-12 s per launch breaks ties).
    by_tokens = launch.LaunchPlanner(targets, buckets, {(b, s): 1e-9 * b * s + 1e-12 for b, s in cost})
    lengths = np.minimum(synthetic("chat", n=max(20000, texts * calls), seed=1).row_lengths(), targets[-1])
    for name, planner in (("least GPU time (served)", timed), ("least tokens", by_tokens)):
        computed = useful = 0
        gpu_s = 0.0
        for batch in np.array_split(lengths[: texts * calls], calls):
            _, launches = planner.plan_packed(batch)
            computed += launch.launch_tokens(launches)
            useful += int(batch.sum())
            gpu_s += timed.launch_cost(launches)
        print(f"{model}, {texts} texts per call, {name}: computed/useful {computed / useful:.3f}, "
              f"GPU {gpu_s / calls * 1e3:.3f} ms per call")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
