"""What the pytorch runtime's launch planner does with a set of batch buckets, offline: computed/useful
tokens, GPU time per row and launches per ``execute()``, for calls of ``--rows`` rows (Poisson, at most
``--max-rows``) drawn from the chat traffic, planned as the runtime plans them (``LaunchPlanner.plan_packed``: packing tried,
the cheaper plan kept, each launch priced at its graph's time plus the engine's ``LAUNCH_OVERHEAD_S``)
with launch costs measured on a GPU: a bench report's ceiling (graph replay times per batch x padding
target), its bundle's engine table, or a tune report's engine timings (``launch_ms_by_shape``: what the
serving planner prices launches with). The GPU time per row sums the graphs' times alone. Batch sizes not timed are interpolated linearly between the
nearest that were: an assumption (on BERT-base's engine timings, interpolating 2, 4 and 16 from 1, 8 and
32 lands within -3 % to +7 % of their measured times), so the figures are estimates, not measurements.

    .venv/bin/python scripts/launch_plan_sim.py --report docs/benchmarks/h200-minilm.json --rows 46 \\
        --buckets 1,2,4,8,16,32,64 --buckets 1,2,3,4,6,8,10,12,14,16,20,24,28,32,40,48,56,64
    .venv/bin/python scripts/launch_plan_sim.py --report docs/tuning/h200-bert-base-plain-text/tune.json ...

With a bench report of the bundle (no ceiling in it) the costs are its served engine's own table, and
``--scale-from`` a report with a ceiling adds batch sizes above the table's largest (an estimate).
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from tritonbundle.runtimes.pytorch.engine import LAUNCH_OVERHEAD_S
from tritonbundle.runtimes.pytorch.launch import LaunchPlanner, launch_tokens
from tritonbundle.traffic import synthetic


def _launch_ms(data: object) -> dict[str, float] | None:
    """The first ``launch_ms_by_shape`` of a tune report (each point's engine timings)."""
    if isinstance(data, dict):
        if data.get("launch_ms_by_shape"):
            return dict(data["launch_ms_by_shape"])
        data = list(data.values())
    if isinstance(data, list):
        for item in data:
            found = _launch_ms(item)
            if found:
                return found
    return None


def costs(report: str) -> tuple[list[int], dict[tuple[int, int], float], list[int]]:
    """Padding targets, seconds per measured (batch, target), and the batch sizes measured: a bench
    report's ceiling (graph replays alone, unpacked), else its bundle's first encoder instance (the served
    engine's own table: packed graphs, each timed alone at start-up, what its planner prices launches
    with), or a tune report's engine timings (``launch_ms_by_shape``)."""
    data = json.load(open(report))
    if "models" in data:
        systems = next(iter(data["models"].values()))["systems"]
        if "ceiling" in systems:
            shapes = systems["ceiling"]["timings_ms"]
        else:
            shapes = next(i["timings_ms"] for i in systems["bundle"]["encoder_instances"] if i.get("timings_ms"))
    else:
        shapes = _launch_ms(data)
        if not shapes:
            raise SystemExit(f"{report}: no ceiling timings and no launch_ms_by_shape")
    timed = {(int(b), int(s)): ms / 1000.0 for b, s, ms in ((*k.split("x"), v) for k, v in shapes.items())}
    return sorted({s for _, s in timed}), timed, sorted({b for b, _ in timed})


def scale_up(timed: dict[tuple[int, int], float], report: str) -> None:
    """Add to ``timed`` the batch sizes only ``report``'s ceiling timed (above ``timed``'s largest): the
    ceiling's time there x ``timed``'s over the ceiling's at ``timed``'s largest batch, per target. An
    estimate: the packed graphs' overhead over the unpacked ones taken as the same share at every size."""
    _, ceiling, _ = costs(report)
    top = max(b for b, _ in timed)
    for (batch, target), seconds in ceiling.items():
        if batch > top and (top, target) in ceiling and (top, target) in timed:
            timed[(batch, target)] = seconds * timed[(top, target)] / ceiling[(top, target)]


def shape_cost(batch: int, target: int, timed: dict[tuple[int, int], float], measured: list[int]) -> float:
    if (batch, target) in timed:
        return timed[(batch, target)]
    if not measured[0] < batch < measured[-1]:
        raise SystemExit(f"batch {batch} is outside the timed batch sizes {measured}: nothing to interpolate from")
    low = max(b for b in measured if b < batch)
    high = min(b for b in measured if b > batch)
    a, z = timed[(low, target)], timed[(high, target)]
    return a + (z - a) * (batch - low) / (high - low)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--report", default="docs/benchmarks/h200-minilm.json", help="a bench.json with a ceiling")
    parser.add_argument("--rows", default="20,46", help="mean rows per execute() (Poisson), comma-separated")
    parser.add_argument("--buckets", action="append", help="batch buckets, comma-separated (repeat to compare)")
    parser.add_argument("--max-rows", type=int, default=64, help="rows a call holds at most (the model's max batch)")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--scale-from", help="a bench.json with a ceiling: batch sizes above the report's largest, "
                        "scaled from it (see scale_up)")
    args = parser.parse_args()
    targets, timed, measured = costs(args.report)
    if args.scale_from:
        scale_up(timed, args.scale_from)
        measured = sorted({b for b, _ in timed})
    lengths = np.array(synthetic("chat", n=20_000, seed=1).clipped(max(targets)).lengths)
    for spec in args.buckets or ["1,2,4,8,16,32,64"]:
        buckets = [int(b) for b in spec.split(",")]
        gpu_s = {(b, s): shape_cost(b, s, timed, measured) for b in buckets for s in targets}
        planner = LaunchPlanner(targets, buckets, {shape: t + LAUNCH_OVERHEAD_S for shape, t in gpu_s.items()})
        for mean in (int(r) for r in args.rows.split(",")):
            rng = np.random.default_rng(0)
            useful = computed = launches = rows = 0
            gpu = worst = 0.0
            for _ in range(args.calls):
                call = rng.choice(lengths, min(args.max_rows, max(1, int(rng.poisson(mean)))))
                _units, plan = planner.plan_packed(call)
                useful += int(call.sum())
                computed += launch_tokens(plan)
                cost = sum(gpu_s[(batch, target)] for batch, target, _ in plan)
                gpu, worst = gpu + cost, max(worst, cost)
                launches += len(plan)
                rows += call.size
            print(f"buckets {spec:<32} rows ~{mean:>3}: computed/useful {computed / useful:.3f}, "
                  f"GPU {1000 * gpu / rows:.4f} ms per row, {launches / args.calls:.2f} launches per call, "
                  f"the longest call's launches {1000 * worst:.1f} ms")


if __name__ == "__main__":
    main()
