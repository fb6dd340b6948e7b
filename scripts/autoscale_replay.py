"""Replay load steps against the chart's autoscaling rule with the target a tune run measured, and print
when pods are added and whether any pod runs past its capacity at the SLO (tritonbundle.tune.capacity).

    .venv/bin/python scripts/autoscale_replay.py docs/tuning/h200-bert-base-packed/tune.json \\
        --steps 0:2000,120:3500,240:5000,360:6500,480:8000,600:9500,720:11000,840:12500,960:14000
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    from tritonbundle.tune.capacity import (
        DEFAULT_HEADROOM,
        DEFAULT_READY_S,
        Rule,
        autoscaling_values,
        capacity_of,
        replay,
        summary,
    )
    from tritonbundle.tune.result import TuneResult

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tune_json", type=Path)
    ap.add_argument("--steps", required=True, help="second:requests_per_s,... (the offered load from that second on)")
    ap.add_argument("--headroom", type=float, default=DEFAULT_HEADROOM)
    ap.add_argument("--ready-s", type=float, default=DEFAULT_READY_S, help="seconds from a scale-out to a serving pod")
    ap.add_argument("--max-replicas", type=int, default=4)
    args = ap.parse_args()
    result = TuneResult.from_json(json.loads(args.tune_json.read_text()))
    capacity = capacity_of(result)
    target = float(autoscaling_values(result, headroom=args.headroom)["autoscaling"]["requestsPerSecond"])
    steps = [(float(a), float(b)) for a, b in (s.split(":") for s in args.steps.split(","))]
    rule = Rule(target_per_pod=target, max_replicas=args.max_replicas, ready_s=args.ready_s)
    moments = replay(steps, rule, capacity)
    print(f"capacity {capacity:,.1f} req/s per pod at p99 <= {result.slo_p99_ms} ms; target {target:,.0f} "
          f"(headroom {args.headroom}); a new pod serves {args.ready_s:.0f} s after the decision")
    print(" second  offered  serving  decided  per pod")
    last = None
    for m in moments:
        row = (m.offered, m.serving, m.desired)
        if row != last:
            print(f"{m.t:7.0f} {m.offered:8,.0f} {m.serving:8d} {m.desired:8d} {m.per_pod:8,.0f}{'  past capacity' if m.over else ''}")
            last = row
    print(summary(moments, rule))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
