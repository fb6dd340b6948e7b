"""``tritonbundle tune``: the serving configuration from the traffic sample and an SLO."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from tritonbundle import runtimes
from tritonbundle.cli import args as shared
from tritonbundle.cli import defaults
from tritonbundle.errors import ConfigError
from tritonbundle.manifest import PRECISIONS, TARGETS, tunables_schema
from tritonbundle.tune.options import TuneOptions
from tritonbundle.tune.space import ORDER

#: The options' own defaults: the flags below show and pass these, so each default has one home.
_DEFAULT = TuneOptions(out=defaults.TUNE_REPORT, manifest=defaults.MANIFEST, artifacts=defaults.ARTIFACTS)


def _knobs(text: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    unknown = [n for n in names if n not in ORDER]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown knob(s) {', '.join(unknown)}; known: {', '.join(ORDER)}")
    return names


def _start(text: str) -> dict[str, Any]:
    """``instances=1,max_queue_delay_us=0,batch_buckets=[1]``: YAML values, as in the manifest, checked
    against the manifest's schema for that key."""
    import jsonschema

    schemas = tunables_schema()
    out: dict[str, Any] = {}
    for item in _split_top(text):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or name not in schemas:
            raise argparse.ArgumentTypeError(f"--start: {item!r} is not <manifest key>=<value> (keys: {', '.join(ORDER)}, ...)")
        parsed = yaml.safe_load(value)
        try:
            jsonschema.validate(parsed, schemas[name])
        except jsonschema.ValidationError as e:
            raise argparse.ArgumentTypeError(f"{name}: {e.message}") from None
        out[name] = tuple(parsed) if isinstance(parsed, list) else parsed
    return out


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    return [p for p in (*parts, current) if p.strip()]


def cmd_tune(args: argparse.Namespace) -> int:
    from tritonbundle.tune.run import run_tune

    overrides = {key: getattr(args, key) for key in ("target", "runtime", "precision") if getattr(args, key, None)}
    manifest, artifacts, tuned = args.manifest, args.artifacts, None
    server_args: tuple[str, ...] = ()
    if args.bench_model:
        manifest, artifacts, server_args = _bench_workspace(args)
    elif args.write:
        tuned = args.manifest
    else:
        tuned = args.manifest.with_name(f"{args.manifest.stem}.tuned{args.manifest.suffix}")
    options = TuneOptions(
        out=args.out, manifest=manifest, artifacts=artifacts, slo_ms=args.slo_p99_ms, budget_s=args.budget_s,
        model=args.model, traffic=args.traffic, overrides=overrides, start=args.start, knobs=args.knobs,
        window_s=args.window_s, load_procs=args.load_procs or 1, start_rate=args.start_rate, work=args.work,
        rate_factor=args.rate_factor, refine=args.refine, max_rate=args.max_rate,
        max_failure_ratio=args.max_failure_ratio, repeat=args.repeat,
        tuned_manifest=tuned, extra_server_args=server_args, resume=args.resume, versus=args.versus,
    )
    result = run_tune(options)
    print(f"report: {args.out}/tune.md {args.out}/tune.json {args.out}/tune.png")
    if result.verdict is not None and result.verdict.reason:
        print(f"why: {result.verdict.reason}")
    if not result.winner:
        print("no configuration met the SLO: see tune.md for what each one did")
        return 1
    print(f"winner: {args.out}/winner.yaml" + (f"; manifest with it: {tuned}" if tuned else ""))
    return 0


def _bench_workspace(args: argparse.Namespace) -> tuple[Path, Path, tuple[str, ...]]:
    """The benchmark's manifest for ``--bench-model`` (pytorch runtime, its hand-set serving settings,
    the synthetic chat traffic) written under the work folder: how the tuner runs on the GPU machine."""
    from tritonbundle import traffic
    from tritonbundle.bench.options import BenchOptions
    from tritonbundle.bench.workspace import (
        SERVER_ARGS,
        load_procs,
        prepare_process_env,
        tokenizer_file,
        write_manifest,
    )
    from tritonbundle.recipes import BENCH_MODELS

    if args.work is None:
        raise ConfigError("--bench-model needs --work (the benchmark's manifest, weights and repositories go there)")
    if args.bench_model not in BENCH_MODELS:
        raise ConfigError(f"--bench-model: known: {', '.join(BENCH_MODELS)}")
    prepare_process_env()
    args.work.mkdir(parents=True, exist_ok=True)
    bench = BenchOptions(out=args.out, device=args.device, slo_ms=args.slo_p99_ms, models=(args.bench_model,),
                         instances=2 if args.device == "cuda" else 1)
    sample = traffic.load(args.traffic) if args.traffic else traffic.synthetic("chat", n=10_000, seed=0)
    traffic_path = traffic.dump(sample, args.work / "traffic.jsonl")
    recipe = BENCH_MODELS[args.bench_model]
    manifest = write_manifest(recipe, bench, args.work / "bench", traffic_path, tokenizer_file())
    args.model = recipe.model_name
    args.load_procs = load_procs(args.load_procs)
    return manifest, args.work / "bench" / "artifacts", SERVER_ARGS if args.device == "cuda" else ()


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = shared.parser(sub,
        "tune", help="pick instances, queue delays, batch sizes from the traffic sample and a p99 SLO, on the real server",
        description="Measure candidate serving configurations on the real tritonserver: each is written by the "
                    "build stage (the manifest plus overrides), served, and driven by the traffic sample at rising "
                    "rates until p99 misses the SLO. A coordinate descent over the knobs picks the next candidate. "
                    "Writes tune.md/.json/.png and winner.yaml to --out and the manifest with the winner beside "
                    "the manifest (<name>.tuned.yaml, or the manifest itself with --write).",
    )
    shared.slo(p, p99_ms=_DEFAULT.slo_ms, p95=False)
    p.add_argument("--budget-s", type=float, default=_DEFAULT.budget_s, help="wall time for the whole search; results are kept as it goes")
    p.add_argument("--manifest", type=Path, default=defaults.MANIFEST, help="models manifest (YAML)")
    p.add_argument("--artifacts", type=Path, default=defaults.ARTIFACTS, help="ONNX files, plans, logs")
    p.add_argument("--model", action=shared.Once, help="the model to tune (default: the manifest's first; one per run)")
    shared.traffic(p, sample="default: the manifest's", shape=False)
    p.add_argument("--target", choices=TARGETS, help="override the manifest's target server")
    p.add_argument("--runtime", choices=runtimes.names(), help="override the model's runtime")
    p.add_argument("--precision", choices=PRECISIONS, help="override the model's precision")
    p.add_argument("--start", type=_start, default={},
                   help="where the search starts, as manifest keys: 'instances=1,max_queue_delay_us=0,batch_buckets=[1]' "
                        "(default: the manifest's values)")
    p.add_argument("--knobs", type=_knobs, default=_DEFAULT.knobs, help="knobs to search, in this order")
    shared.window(p, default=_DEFAULT.window_s)
    shared.rate_search(p, start=_DEFAULT.start_rate, factor=_DEFAULT.rate_factor, refine=_DEFAULT.refine,
                       max_rate=_DEFAULT.max_rate)
    p.add_argument("--repeat", type=int, default=_DEFAULT.repeat,
                   help="the two best configurations are measured this many times in all, in turns, and the winner is "
                        "the better median (1: the best single measurement wins; one search moves 15-40%% on a GPU); "
                        "the search keeps time for it, a third of --budget-s at most")
    p.add_argument("--load-procs", type=shared.above(0, whole=True, at_least=True), default=0, help="load generator processes (default: 1; --bench-model: cores/2 - 1)")
    p.add_argument("--out", type=Path, default=defaults.TUNE_REPORT, help="report folder")
    p.add_argument("--write", action="store_true", help="write the winner into the manifest itself (keeps <manifest>.bak)")
    p.add_argument("--resume", type=Path, metavar="TUNE_JSON",
                   help="go on from an earlier run's tune.json (same model, SLO, overrides, GPU sharing): the "
                        "configurations it measured are not measured again")
    p.add_argument("--versus", type=Path, metavar="TUNED_JSON",
                   help="settings to measure beside the search (a tune.json, or {\"winner\": {\"config\": {...}}} "
                        "as bench --tuned reads): measured after the defaults, then in turns with the winner "
                        "(--repeat times each); the report says which is faster")
    p.add_argument("--work", type=Path, help="keep each point's repository and server log here (default: a temporary folder)")
    p.add_argument("--bench-model", help="tune the benchmark's model (minilm, bert-base) with its manifest: the GPU machine's run")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="with --bench-model: where the encoder runs")
    p.set_defaults(func=cmd_tune)
