"""``tritonbundle bench gpu``: the serving benchmark (naive / bundle / ceiling on one GPU)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from pathlib import Path

from tritonbundle.bench.options import BenchOptions
from tritonbundle.cli import args as shared
from tritonbundle.cli import defaults

#: The options' own defaults: the flags below show and pass these, so each default has one home.
_DEFAULT = BenchOptions(out=defaults.BENCH_REPORT)


def _csv(values: Iterable[object] | Mapping[str, float]) -> str:
    """A default as its flag spells it: ``1,2,4`` or ``naive=0.15,peer=0.25``."""
    if isinstance(values, Mapping):
        return ",".join(f"{k}={v}" for k, v in values.items())
    return ",".join(str(v) for v in values)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _start_rates(text: str) -> tuple[float, dict[str, float]]:
    """``--start-rate``: ``6400`` or ``6400,peer=200`` -> (every system's start, the starts named per system)."""
    default, named = None, {}
    for part in (x.strip() for x in str(text).split(",") if x.strip()):
        if "=" in part:
            system, rate = part.split("=", 1)
            named[system.strip()] = float(rate)
        else:
            default = float(part)
    return (_DEFAULT.ladder_start if default is None else default), named


def options_from(args: argparse.Namespace) -> BenchOptions:
    """The command line as the benchmark's options."""
    from tritonbundle.tune.run import winner_overrides

    start, start_rates = _start_rates(args.start_rate)
    return BenchOptions(
        out=args.out, work=args.work, budget_s=args.budget_s, models=_names(args.models), systems=_names(args.systems),
        device=args.device, slo_ms=args.slo_p99_ms, max_failure_ratio=args.max_failure_ratio, traffic=args.traffic,
        sequence_buckets=args.sequence_buckets,
        batch_buckets=_ints(args.batch_buckets), queue_delay_us=args.queue_delay_us,
        tokenizer_instances=args.tokenizer_instances, tokenizer_queue_delay_us=args.tokenizer_queue_delay_us,
        instances=args.instances or (2 if args.device == "cuda" else 1), load_procs=args.load_procs,
        ladder_start=start, start_rates=start_rates, ladder_factor=args.rate_factor, refine=args.refine,
        max_rate=args.max_rate,
        ceiling_batches=_ints(args.ceiling_batches), timeout_s=args.timeout_s, seed=args.seed,
        shares={k.strip(): float(v) for k, v in (x.split("=", 1) for x in args.shares.split(",") if x.strip())},
        tuned=winner_overrides(args.tuned) if args.tuned else {}, repeat=args.repeat, input=args.input,
    )


def cmd_gpu(args: argparse.Namespace) -> int:
    from tritonbundle.bench.report import print_summary
    from tritonbundle.bench.run import run_bench

    options = options_from(args)
    result = run_bench(options)
    print_summary(result)
    print(f"report: {args.out}/bench.md {args.out}/bench.json {args.out}/bench.png {args.out}/logs.tar.gz")
    failed = [f"{m} {s}" for m, e in result.models.items() for s, r in e.systems.items() if r.status != "ok"]
    if failed:
        print(f"not measured: {', '.join(failed)} (see bench.json)")
    return 0 if result.status == "done" and not failed else 1


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = shared.parser(sub, "bench", help="serving benchmark: naive PyTorch vs the bundle vs the engine ceiling (GPU)")
    bench_sub = p.add_subparsers(dest="bench_command", required=True, metavar="BENCH")
    g = shared.parser(bench_sub,
        "gpu", help="naive / bundle / ceiling on one GPU, same traffic, in one run; writes bench.json/.md/.png",
        description="Measure the systems in turn on the same request stream: naive (aiohttp + PyTorch FP32, one "
                    "request at a time), the peer (LitServe, FP16, its own dynamic batching), the bundle (tritonserver + the pytorch runtime: dynamic batching, padding "
                    "targets, CUDA graphs, over gRPC) and the ceiling (the same FP16 engine in-process). Prints the "
                    "table and, last, the ratios.",
    )
    g.add_argument("--out", type=Path, default=defaults.BENCH_REPORT, help="report folder (bench.json, bench.md, bench.png, logs.tar.gz)")
    g.add_argument("--budget-s", type=float, default=_DEFAULT.budget_s, help="wall-time budget for the whole run; sweeps scale to it")
    g.add_argument("--models", default=_csv(_DEFAULT.models), help="comma-separated: minilm, bert-base")
    g.add_argument("--systems", default=_csv(_DEFAULT.systems),
                   help="comma-separated: naive, peer (LitServe), bundle, ceiling")
    g.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the same run on the CPU (smoke test)")
    shared.slo(g, p99_ms=_DEFAULT.slo_ms, p95=False)
    shared.traffic(g, sample="default: synthetic chat, 10,000 requests, seed 0", shape=False)
    shared.request_input(g)
    g.add_argument("--sequence-buckets", type=int, default=_DEFAULT.sequence_buckets, help="padding targets planned from the traffic (max 16)")
    g.add_argument("--batch-buckets", default=_csv(_DEFAULT.batch_buckets), help="batch sizes CUDA graphs are captured for")
    g.add_argument("--queue-delay-us", type=int, default=_DEFAULT.queue_delay_us,
                   help="encoder batcher's max queue delay (default: a twentieth of the SLO)")
    g.add_argument("--instances", type=int, default=0, help="encoder instances (default: 2 on cuda, 1 on cpu)")
    g.add_argument("--tokenizer-instances", type=int, default=_DEFAULT.tokenizer_instances, help="tokenizer model instances")
    g.add_argument("--tokenizer-queue-delay-us", type=int, default=_DEFAULT.tokenizer_queue_delay_us, help="tokenizer batcher max queue delay")
    g.add_argument("--load-procs", type=int, default=_DEFAULT.load_procs, help="load generator processes for the bundle (default: the CPUs this process may use / 2 - 1, at most 8)")
    shared.rate_search(g, start=_DEFAULT.ladder_start, factor=_DEFAULT.ladder_factor, refine=_DEFAULT.refine,
                       max_rate=_DEFAULT.max_rate, per_system=True)
    g.add_argument("--ceiling-batches", default=_csv(_DEFAULT.ceiling_batches), help="batch sizes the ceiling is timed at")
    g.add_argument("--repeat", type=int, default=_DEFAULT.repeat,
                   help="rounds: every system measured this many times, in turn; figures are the median, with the range "
                        "(the GPU machine's knee moves ~15%% between runs: use 3 for a claim)")
    g.add_argument("--shares", default=_csv(_DEFAULT.shares),
                   help="each system's share of a model's time (unused time rolls over)")
    g.add_argument("--timeout-s", type=float, default=_DEFAULT.timeout_s, help="client deadline per request (default: 20 x the SLO, at least 1 s)")
    g.add_argument("--seed", type=int, default=_DEFAULT.seed)
    g.add_argument("--tuned", type=Path,
                   help="a tune run's tune.json: its winner's settings replace the hand-set ones above (every model)")
    g.add_argument("--work", type=Path, help="keep the work folder here (repositories, logs); default: a temporary folder")
    g.set_defaults(func=cmd_gpu)
