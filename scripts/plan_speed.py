"""Host time of the launch planner per encoder call, priced with an H200 run's measured CUDA-graph times.

    .venv/bin/python scripts/plan_speed.py docs/benchmarks/h200-lanes-fix/long-inst4-lanes1-bench.json bert_base 52

Chat-like lengths (the synthetic sample), ``rows`` per call (the run's average batch at its knee), 400
calls, timed 3 times: prints the median milliseconds per call of ``plan`` and ``plan_packed`` (what the
engine runs with packing, the default), with the range. The served model pays this once per execute().
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tritonbundle.runtimes.pytorch.engine import LAUNCH_OVERHEAD_S  # noqa: E402
from tritonbundle.runtimes.pytorch.launch import LaunchPlanner  # noqa: E402
from tritonbundle.traffic import synthetic  # noqa: E402


def main(report: str, model: str, rows: int) -> None:
    bench = json.loads(Path(report).read_text())
    info = bench["models"][model]["systems"]["bundle"]["encoder_instances"][0]
    cost = {(int(b), int(s)): ms / 1000 + LAUNCH_OVERHEAD_S
            for b, s, ms in ((*k.split("x"), v) for k, v in info["timings_ms"].items())}
    planner = LaunchPlanner(sorted({s for _, s in cost}), sorted({b for b, _ in cost}), cost)
    lengths = np.minimum(512, synthetic("chat", n=10000).lengths)
    rng = np.random.default_rng(0)
    calls = [rng.choice(lengths, size=rows) for _ in range(400)]
    for name, plan in (("plan", planner.plan), ("plan_packed", planner.plan_packed)):
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            for call in calls:
                plan(call)
            times.append(1000 * (time.perf_counter() - t0) / len(calls))
        print(f"{name}: {statistics.median(times):.3f} ms per call of {rows} rows "
              f"[{min(times):.3f}-{max(times):.3f}], 3 x {len(calls)} calls")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
