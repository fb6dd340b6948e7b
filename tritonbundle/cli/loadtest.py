"""``tritonbundle loadtest``: a bounded Locust load test with SLO gates, a level sweep or a rate search."""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tritonbundle.cli import args as shared
from tritonbundle.cli import defaults
from tritonbundle.errors import ConfigError

if TYPE_CHECKING:
    from tritonbundle.loadtests.runner import Stop
    from tritonbundle.loadtests.settings import LoadSettings


def cmd_loadtest(args: argparse.Namespace) -> int:
    from tritonbundle.loadtests import runner
    from tritonbundle.loadtests.settings import LoadSettings

    traffic = args.traffic or planned_traffic(args.model)
    from_env = os.environ.get(defaults.URL_ENV)
    if from_env and not args.http_url and args.grpc_url is None and args.protocol != "http" and not _local(from_env):
        raise ConfigError(f"${defaults.URL_ENV} ({from_env}) names the HTTP address only: the gRPC users would call "
                          f"{defaults.GRPC_URL}; give --grpc-url HOST:PORT (or --protocol http)")
    settings = LoadSettings(
        http_url=(args.http_url or from_env or defaults.HTTP_URL)
        if args.protocol in ("http", "both") else None,
        grpc_url=(args.grpc_url or defaults.GRPC_URL) if args.protocol in ("grpc", "both") else None,
        metrics_url=args.metrics_url, model=args.model, input=args.input,
        inputs=str(args.inputs.resolve()) if args.inputs else None,
        traffic=str(traffic) if traffic else None, synthetic=args.traffic_shape, seed=args.seed, mode=args.mode,
        users=args.users, rate=args.rate, spawn_rate=args.spawn_rate, duration_s=args.window_s,
        shape=args.load_shape, timeout_s=args.timeout_s, retries=args.retries, report_dir=str(args.out),
        slo=shared.slo_from(args),
    )
    if args.search is not None:  # every setting is checked before the server is waited for
        runner.check_search(settings)
    elif args.sweep:
        runner.sweep_levels(settings, args.sweep)
    runner.preflight(settings)
    with runner.stop_on_signals() as stop:
        return _run(args, settings, stop)


def _local(address: str) -> bool:
    """Whether ``[scheme://]host:port`` is this machine's loopback address."""
    return address.split("://")[-1].rsplit(":", 1)[0] in ("127.0.0.1", "localhost")


def planned_traffic(model: str) -> Path | None:
    """The traffic sample the build planned ``model`` from (the manifest's, ``build/models.yaml``), else the
    shipped chat sample when present: an image model's requests take the sizes of its own traffic."""
    from tritonbundle import manifest

    if defaults.MANIFEST.exists():
        try:
            sample = manifest.load(defaults.MANIFEST).model(model).traffic
        except ConfigError:  # not a model of this manifest (another server's), or no manifest to read
            sample = None
        if sample is not None and sample.exists():
            return sample
    return defaults.TRAFFIC if defaults.TRAFFIC.exists() else None


def _run(args: argparse.Namespace, settings: LoadSettings, stop: Stop) -> int:
    from tritonbundle.loadtests import runner

    if args.search is not None:
        start = args.start_rate if args.search is SEARCH_FROM_START_RATE else args.search  # `--search START`: earlier
        found = runner.search(settings, start=start, factor=args.rate_factor, refine=args.refine,
                              max_rate=args.max_rate, stop=stop)
        for s in found.steps:
            print(f"{s.offered_rps:9.1f} req/s offered: {s.achieved_rps:9.1f} answered/s, p99 {s.p99_ms:.1f} ms, "
                  f"SLO {'met' if s.passed else 'missed'}")
        print(f"best: {found.best_rps:.1f} req/s ({found.stopped})" if found.best_rps else f"no rate met the SLO ({found.stopped})")
        print(f"report: {args.out}/search.json")
        return 0 if found.best is not None else 1
    if args.sweep:
        code, results, best = runner.sweep(settings, args.sweep, stop)
        for r in results:
            print(f"level {r['level']:g}: {r['total']['throughput_rps']:.1f} req/s, p99 {r['total']['p99_ms']} ms, "
                  f"SLO {'met' if r['gates']['passed'] else 'missed'}")
        print(f"best: level {best['level']:g} at {best['total']['throughput_rps']:.1f} req/s" if best
              else "no level met the SLO")
        print(f"report: {args.out}/sweep.json {args.out}/sweep.png")
        return _stopped(stop, f"the sweep ran {len(results)} of its {len(args.sweep)} levels") if stop.is_set() else code
    result = runner.run(settings, stop)
    print(runner.describe(result.summary))
    print(f"report: {result.report_dir}")
    if result.stopped:
        return _stopped(stop, f"the report covers its first {result.summary['duration_s']:.1f} s of the "
                        f"{settings.duration_s:g}-s window")
    return 0 if result.summary["gates"]["passed"] else 1


def _stopped(stop: Stop, what: str) -> int:
    """A run cut short by a signal is no verdict: say so, and exit as the signal asks (128 + its number)."""
    print(f"stopped by {stop.reason}: {what}; the SLO verdict above is not the full run's", file=sys.stderr)
    return stop.exit_code


#: ``--search`` without a value: start from --start-rate (not a string: argparse would convert it).
SEARCH_FROM_START_RATE = object()


def _levels(text: str) -> list[float]:
    """``--sweep`` levels, for argparse: comma-separated numbers > 0."""
    levels = []
    for part in (x.strip() for x in text.split(",")):
        if not part:
            continue
        try:
            value = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not a number: give comma-separated levels, e.g. 1,4,16 "
                                             "(users; requests/s with --mode open)") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"level {part!r}: every level must be above 0")
        levels.append(value)
    if not levels:
        raise argparse.ArgumentTypeError(f"{text!r} names no level: give comma-separated levels, e.g. 1,4,16")
    return levels


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = shared.parser(sub, "loadtest", help="run a bounded Locust load test (HTTP and gRPC) and write a report with SLO gates")
    p.add_argument("--protocol", choices=("http", "grpc", "both"), default="both", help="protocols the users speak")
    p.add_argument("--http-url", help=f"the server's HTTP address (${defaults.URL_ENV}, else {defaults.HTTP_URL})")
    p.add_argument("--grpc-url", help=f"the server's gRPC address (default {defaults.GRPC_URL})")
    p.add_argument("--metrics-url", help="Triton's metrics endpoint, scraped for the server-side view "
                   f"(e.g. http://127.0.0.1:{defaults.METRICS_PORT}/metrics)")
    p.add_argument("--model", default=defaults.MODEL, help="model to call")
    shared.request_input(p, both=True)
    p.add_argument("--inputs", type=Path, metavar="FILE.npz",
                   help="tensor model: recorded inputs (one array per input, first axis the samples) instead of "
                        "random ones")
    shared.traffic(p, sample=f"default: the model's own in {defaults.MANIFEST}, else {defaults.TRAFFIC} when present")
    p.add_argument("--mode", choices=("closed", "open"), default="closed",
                   help="closed: USERS send back-to-back; open: Poisson arrivals at RATE requests/s")
    p.add_argument("--users", type=shared.above(0, whole=True), default=8, help="concurrent users (open model: Poisson sources)")
    p.add_argument("--rate", type=shared.above(0), default=20.0, help="open model: requests per second")
    p.add_argument("--spawn-rate", type=float, default=100.0, help="users started per second")
    shared.window(p, default=20.0, what="seconds the test runs (each level of a sweep or search)")
    shared.hidden(p, "--duration-s", dest="window_s", type=float)
    p.add_argument("--load-shape", choices=("constant", "step", "spike", "soak"), default="constant",
                   help="how the users (or the rate) change over the run")
    shared.hidden(p, "--shape", dest="load_shape", choices=("constant", "step", "spike", "soak"))
    p.add_argument("--timeout-s", type=float, default=10.0, help="deadline per request")
    p.add_argument("--retries", type=int, default=1, help="attempts per request (1: report raw failures)")
    shared.slo(p)
    p.add_argument("--sweep", type=_levels, metavar="LEVELS", help="comma-separated levels (users, or requests/s with --mode open); "
                   "reports the highest throughput that meets the SLO")
    p.add_argument("--search", nargs="?", const=SEARCH_FROM_START_RATE, type=shared.above(0), metavar="START",
                   help="open model: find the highest rate that meets the SLO, from --start-rate (x --rate-factor, "
                        "then --refine bisections; one --window-s run per level)")
    shared.rate_search(p, start=10.0)
    p.add_argument("--seed", type=int, default=0, help="seed of the requests drawn")
    p.add_argument("--out", type=Path, default=defaults.LOADTEST_REPORT, help="report folder")
    p.set_defaults(func=cmd_loadtest)
