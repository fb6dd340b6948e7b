"""Subcommands of later stages, registered on the CLI parser (kept out of cli.py to keep it short)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

REGISTER: list[Callable[[argparse._SubParsersAction], None]] = []


def _demo(sub: argparse._SubParsersAction) -> None:
    from pathlib import Path

    p = sub.add_parser("demo", help="export, write the repository, serve, embed sentences over HTTP and gRPC, stop")
    p.add_argument("--manifest", type=Path, default=Path("build/models.yaml"))
    p.add_argument("--repository", type=Path, default=Path("model_repository"))
    p.add_argument("--artifacts", type=Path, default=Path("build/artifacts"))
    p.add_argument("--log-file", type=Path, default=Path("reports/demo/tritonserver.log"))

    def run(args: argparse.Namespace) -> int:
        from tritonbundle.demo import run_demo

        return run_demo(manifest=args.manifest, repository=args.repository, artifacts=args.artifacts, log_file=args.log_file)

    p.set_defaults(func=run)


REGISTER.append(_demo)


def _loadtest(sub: argparse._SubParsersAction) -> None:
    from pathlib import Path

    p = sub.add_parser("loadtest", help="run a bounded Locust load test (HTTP and gRPC) and write a report with SLO gates")
    p.add_argument("--protocol", choices=("http", "grpc", "both"), default="both")
    p.add_argument("--http-url", default="127.0.0.1:8000")
    p.add_argument("--grpc-url", default="127.0.0.1:8001")
    p.add_argument("--metrics-url", help="Triton's metrics endpoint, scraped for the server-side view "
                   "(e.g. http://127.0.0.1:8002/metrics)")
    p.add_argument("--model", default="minilm")
    p.add_argument("--input", choices=("text", "tokens", "both"), default="text",
                   help="text through the ensemble, tokens to the encoder, or both")
    p.add_argument("--traffic", type=Path, default=None,
                   help="traffic sample the requests are drawn from (default build/traffic/chat.jsonl when present)")
    p.add_argument("--synthetic", choices=("chat", "bimodal", "uniform", "fixed"), default="chat",
                   help="synthetic traffic when no sample is given")
    p.add_argument("--mode", choices=("closed", "open"), default="closed",
                   help="closed: USERS send back-to-back; open: Poisson arrivals at RATE requests/s")
    p.add_argument("--users", type=int, default=8)
    p.add_argument("--rate", type=float, default=20.0, help="open model: requests per second")
    p.add_argument("--spawn-rate", type=float, default=100.0)
    p.add_argument("--duration-s", type=float, default=20.0)
    p.add_argument("--shape", choices=("constant", "step", "spike", "soak"), default="constant")
    p.add_argument("--timeout-s", type=float, default=10.0, help="deadline per request")
    p.add_argument("--retries", type=int, default=1, help="attempts per request (1: report raw failures)")
    p.add_argument("--slo-p95-ms", type=float)
    p.add_argument("--slo-p99-ms", type=float)
    p.add_argument("--max-failure-ratio", type=float, default=0.0)
    p.add_argument("--sweep", help="comma-separated levels (users, or requests/s with --mode open); "
                   "reports the highest throughput that meets the SLO")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("reports/loadtest"), help="report folder")

    def run(args: argparse.Namespace) -> int:
        from tritonbundle.loadtests import runner
        from tritonbundle.loadtests.settings import LoadSettings, Slo

        traffic = args.traffic
        if traffic is None and Path("build/traffic/chat.jsonl").exists():
            traffic = Path("build/traffic/chat.jsonl")
        settings = LoadSettings(
            http_url=args.http_url if args.protocol in ("http", "both") else None,
            grpc_url=args.grpc_url if args.protocol in ("grpc", "both") else None,
            metrics_url=args.metrics_url, model=args.model, input=args.input,
            traffic=str(traffic) if traffic else None, synthetic=args.synthetic, seed=args.seed, mode=args.mode,
            users=args.users, rate=args.rate, spawn_rate=args.spawn_rate, duration_s=args.duration_s,
            shape=args.shape, timeout_s=args.timeout_s, retries=args.retries, report_dir=str(args.out),
            slo=Slo(p95_ms=args.slo_p95_ms, p99_ms=args.slo_p99_ms, max_failure_ratio=args.max_failure_ratio),
        )
        if args.sweep:
            levels = [float(x) for x in args.sweep.split(",") if x.strip()]
            code, results, best = runner.sweep(settings, levels)
            for r in results:
                print(f"level {r['level']:g}: {r['total']['throughput_rps']:.1f} req/s, p99 {r['total']['p99_ms']} ms, "
                      f"SLO {'met' if r['gates']['passed'] else 'missed'}")
            print(f"best: level {best['level']:g} at {best['total']['throughput_rps']:.1f} req/s" if best
                  else "no level met the SLO")
            print(f"report: {args.out}/sweep.json {args.out}/sweep.png")
            return code
        result = runner.run(settings)
        print(runner.describe(result.summary))
        print(f"report: {result.report_dir}")
        return 0 if result.summary["gates"]["passed"] else 1

    p.set_defaults(func=run)


REGISTER.append(_loadtest)


def _bench(sub: argparse._SubParsersAction) -> None:
    from pathlib import Path

    p = sub.add_parser("bench", help="serving benchmark: naive PyTorch vs the bundle vs the engine ceiling (GPU)")
    bench_sub = p.add_subparsers(dest="bench_command", required=True, metavar="BENCH")

    g = bench_sub.add_parser(
        "gpu", help="naive / bundle / ceiling on one GPU, same traffic, in one run; writes bench.json/.md/.png",
        description="Measure three systems in turn on the same request stream: naive (aiohttp + PyTorch FP32, one "
                    "request at a time), the bundle (tritonserver + the pytorch runtime: dynamic batching, padding "
                    "targets, CUDA graphs, over gRPC) and the ceiling (the same FP16 engine in-process). Prints the "
                    "table and, last, the bundle/naive and bundle/ceiling ratios.",
    )
    g.add_argument("--out", type=Path, default=Path("reports/bench"), help="report folder (bench.json, bench.md, bench.png, logs.tar.gz)")
    g.add_argument("--budget-s", type=float, default=420.0, help="wall-time budget for the whole run; sweeps scale to it")
    g.add_argument("--models", default="minilm,bert-base", help="comma-separated: minilm, bert-base")
    g.add_argument("--systems", default="naive,bundle,ceiling", help="comma-separated: naive, bundle, ceiling")
    g.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the same run on the CPU (smoke test)")
    g.add_argument("--slo-ms", type=float, default=50.0, help="p99 latency SLO")
    g.add_argument("--traffic", type=Path, help="traffic sample (JSON Lines); default: synthetic chat, 10,000 requests, seed 0")
    g.add_argument("--sequence-buckets", type=int, default=16, help="padding targets planned from the traffic (max 16)")
    g.add_argument("--batch-buckets", default="1,2,4,8,16,32,64,128", help="batch sizes CUDA graphs are captured for")
    g.add_argument("--queue-delay-us", type=int, default=1000, help="dynamic batcher max queue delay")
    g.add_argument("--instances", type=int, default=0, help="encoder instances (default: 2 on cuda, 1 on cpu)")
    g.add_argument("--load-procs", type=int, default=0, help="load generator processes for the bundle (default: cores/2 - 1, at most 8)")
    g.add_argument("--ladder-start", type=float, default=50.0, help="first offered load (req/s)")
    g.add_argument("--ladder-factor", type=float, default=4.0, help="ladder multiplier until the SLO is missed")
    g.add_argument("--refine", type=int, default=3, help="bisection steps after the ladder")
    g.add_argument("--max-rate", type=float, default=60000.0)
    g.add_argument("--ceiling-batches", default="1,8,32,64,128,256", help="batch sizes the ceiling is timed at")
    g.add_argument("--shares", default="naive=0.28,bundle=0.52,ceiling=0.20",
                   help="each system's share of a model's time (unused time rolls over)")
    g.add_argument("--timeout-s", type=float, default=0.0, help="client deadline per request (default: 20 x the SLO, at least 1 s)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--work", type=Path, help="keep the work folder here (repositories, logs); default: a temporary folder")

    def run_gpu(args: argparse.Namespace) -> int:
        from tritonbundle.bench.report import print_summary
        from tritonbundle.bench.runner import BenchOptions, run_bench

        def ints(text: str) -> tuple[int, ...]:
            return tuple(int(x) for x in text.split(",") if x.strip())

        options = BenchOptions(
            out=args.out, work=args.work, budget_s=args.budget_s,
            models=tuple(m.strip() for m in args.models.split(",") if m.strip()),
            systems=tuple(s.strip() for s in args.systems.split(",") if s.strip()),
            device=args.device, slo_ms=args.slo_ms, traffic=args.traffic, sequence_buckets=args.sequence_buckets,
            batch_buckets=ints(args.batch_buckets), queue_delay_us=args.queue_delay_us,
            instances=args.instances or (2 if args.device == "cuda" else 1), load_procs=args.load_procs,
            ladder_start=args.ladder_start, ladder_factor=args.ladder_factor, refine=args.refine, max_rate=args.max_rate,
            ceiling_batches=ints(args.ceiling_batches), timeout_s=args.timeout_s, seed=args.seed,
            shares={k.strip(): float(v) for k, v in (x.split("=", 1) for x in args.shares.split(",") if x.strip())},
        )
        result = run_bench(options)
        print_summary(result)
        print(f"report: {args.out}/bench.md {args.out}/bench.json {args.out}/bench.png {args.out}/logs.tar.gz")
        failed = [f"{m} {s}" for m, e in result.get("models", {}).items() for s, r in e.get("systems", {}).items()
                  if r.get("status") != "ok"]
        if failed:
            print(f"not measured: {', '.join(failed)} (see bench.json)")
        return 0 if result.get("status") == "done" and not failed else 1

    g.set_defaults(func=run_gpu)

    k = bench_sub.add_parser("pack", help="build the folders a GPU machine without network needs (server, wheels, weights)")
    k.add_argument("--out", type=Path, default=Path(".device"), help="staging folder (git-ignored)")
    k.add_argument("--parts", default="server,stubs,grpc,model", help="comma-separated: server, stubs, grpc, model")

    def run_pack(args: argparse.Namespace) -> int:
        from tritonbundle.bench.pack import pack_all

        sizes = pack_all(args.out, parts=tuple(x.strip() for x in args.parts.split(",") if x.strip()))
        for part, size in sizes.items():
            print(f"{args.out / part}: {size / 2**20:.1f} MiB")
        return 0

    k.set_defaults(func=run_pack)


REGISTER.append(_bench)
