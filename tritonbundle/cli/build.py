"""The build stage's commands: ``init``, ``export``, ``traffic``, ``plan``, ``repo``, ``build``, ``fingerprint``."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tritonbundle import runtimes
from tritonbundle.cli import args as shared
from tritonbundle.cli import defaults
from tritonbundle.contract import TASKS
from tritonbundle.manifest import PRECISIONS, TARGETS
from tritonbundle.traffic import SHAPES

if TYPE_CHECKING:
    from tritonbundle.build.stage import BuildOptions



def options(args: argparse.Namespace, *, export: bool = True, reexport: bool = False) -> BuildOptions:
    from tritonbundle.build.stage import BuildOptions

    overrides = {key: getattr(args, key) for key in ("target", "runtime", "precision") if getattr(args, key, None)}
    return BuildOptions(
        manifest=args.manifest, repository=getattr(args, "repository", defaults.REPOSITORY), artifacts=args.artifacts,
        traffic=args.traffic, models=tuple(args.model or ()), overrides=overrides,
        force=getattr(args, "force", False), export=export,
        reexport=reexport or getattr(args, "reexport", False),
    )


def cmd_init(args: argparse.Namespace) -> int:
    """Describe an ONNX graph as a manifest entry and add it to the manifest."""
    import yaml

    from tritonbundle import traffic
    from tritonbundle.build import describe
    from tritonbundle.build.stage import BuildOptions, plan_all
    from tritonbundle.errors import ConfigError
    from tritonbundle.manifest import BATCH, SEQUENCE

    axes = {}
    for item in args.axis or ():
        axis, _, size = item.partition("=")
        if not size.isdigit() or int(size) < 1:
            raise ConfigError(f"--axis {item}: give NAME=LARGEST_SIZE, like height=1024")
        axes[axis] = int(size)
    manifest = args.manifest
    name = args.name or "".join(c if c.isalnum() or c in "_-" else "_" for c in args.onnx.stem)
    entry = describe.describe(args.onnx, name=name, task=args.task, tokenizer=args.tokenizer, axes=axes,
                              relative_to=manifest.parent)
    if BATCH not in {d for t in entry["inputs"] for d in t["shape"]}:  # said first: it may explain an axis asked for
        import onnx

        why = describe.unbatched_why(onnx.load(str(args.onnx), load_external_data=False).graph,
                                     text=entry["task"] != "tensor")
        print(f"{args.onnx}: not batched (no dynamic batching): {why}")
    existing = yaml.safe_load(manifest.read_text()) if manifest.exists() else {}
    sample_path = args.traffic or ((manifest.parent / existing["traffic"]) if existing.get("traffic") else None)
    if args.traffic is not None:
        entry["traffic"] = str(Path(args.traffic).resolve().relative_to(manifest.parent.resolve())) \
            if Path(args.traffic).resolve().is_relative_to(manifest.parent.resolve()) else str(Path(args.traffic).resolve())
    named = {d for t in entry["inputs"] for d in t["shape"] if isinstance(d, str)}
    if SEQUENCE in named and sample_path is None:
        sample_path = manifest.parent / "traffic" / "chat.jsonl"
        if not sample_path.exists():
            traffic.dump(traffic.synthetic("chat", n=5000, seed=0), sample_path)
            print(f"wrote {sample_path}: a synthetic chat sample (token counts); replace it with your own traffic")
        entry["traffic"] = str(sample_path.relative_to(manifest.parent))
    sample_axes = traffic.load(sample_path).axes() if sample_path is not None and Path(sample_path).exists() else ()
    missing = describe.missing_sizes(entry, sample_axes)
    if missing:
        raise ConfigError(
            f"{args.onnx}: the dynamic axes {', '.join(missing)} need their largest size (--axis {missing[0]}=1024) or "
            f"a traffic sample whose lines give shape.{missing[0]} (--traffic FILE; build/traffic/README.md)")
    created = not manifest.exists()
    block = describe.append_model(manifest, entry)
    print(f"added model {name!r} ({entry['task']}) to {manifest}:\n{block}", end="")
    try:  # what `plan` and `build` will do with it
        for spec, plan in plan_all(BuildOptions(manifest=manifest, artifacts=args.artifacts, models=(name,))):
            print(f"planned: {len(plan.profiles)} profile(s), max batch {spec.max_batch_size}; next: "
                  f"tritonbundle build --manifest {manifest} --model {name}")
    except ConfigError:
        if created:
            manifest.unlink()
        else:
            text = manifest.read_text()
            manifest.write_text(text[: len(text) - len(block)])  # leave the manifest as it was
        raise
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from tritonbundle.build.stage import export_all

    for name, artifacts in export_all(options(args, reexport=args.force)).items():
        print(f"{name}: {artifacts.onnx_path or '(no ONNX: its runtime does not serve one)'}")
    return 0


def cmd_traffic(args: argparse.Namespace) -> int:
    from tritonbundle import traffic

    sample = traffic.synthetic(
        args.traffic_shape, n=args.n, max_tokens=args.max_tokens, seed=args.seed, batch_max=args.batch_max,
        rate_per_s=args.rate, fixed_tokens=args.tokens,
    )
    path = traffic.dump(sample, args.out)
    summary = sample.summary()
    print(f"wrote {path}: {len(sample.requests)} requests, mean {summary['mean_tokens']:.1f} tokens, "
          f"P95 {summary['p95_tokens']:.0f}, max {summary['max_tokens']:.0f}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from tritonbundle.build.report import write_report
    from tritonbundle.build.stage import plan_all

    build_options = options(args)
    for spec, plan in plan_all(build_options):
        files = write_report(spec, plan, build_options, args.out / spec.name)
        print(files.table)
        print(f"report: {files.json} {files.png or ''}".rstrip())
    return 0


def cmd_repo(args: argparse.Namespace) -> int:
    from tritonbundle.build.stage import build

    names = build(options(args, export=False))
    print(f"{args.repository}: {', '.join(sorted(names))}")
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    from tritonbundle.build.stage import build, check_repository

    if args.check:
        problems = check_repository(options(args))
        for line in problems:
            print(line)
        return 1 if problems else 0
    names = build(options(args))
    print(f"{args.repository}: {', '.join(sorted(names))}")
    return 0


def cmd_fingerprint(args: argparse.Namespace) -> int:
    from tritonbundle.runtimes.tensorrt.engine import current_platform

    platform = current_platform()
    data: dict[str, Any] = {**dataclasses.asdict(platform), "fingerprint": platform.fingerprint}
    print(json.dumps(data) if args.json else platform.fingerprint)
    return 0


def _inputs(p: argparse.ArgumentParser, *, repository: bool = True) -> None:
    p.add_argument("--manifest", type=Path, default=defaults.MANIFEST, help="models manifest (YAML)")
    p.add_argument("--artifacts", type=Path, default=defaults.ARTIFACTS, help="ONNX files, plans, logs")
    p.add_argument("--traffic", type=Path, help="traffic sample (JSON Lines); overrides the manifest's")
    p.add_argument("--model", action="append", help="only this model (repeatable)")
    p.add_argument("--target", choices=TARGETS, help="override the manifest's target server")
    p.add_argument("--runtime", choices=runtimes.names(), help="override every model's runtime")
    p.add_argument("--precision", choices=PRECISIONS, help="override every model's precision")
    if repository:
        p.add_argument("--repository", type=Path, default=defaults.REPOSITORY, help="model repository to write")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = shared.parser(sub, "init", help="describe an ONNX model (inputs, outputs, dynamic axes) and add it to the manifest")
    p.add_argument("onnx", type=Path, help="the ONNX file")
    p.add_argument("--name", help="the model's name (default: the file's name without .onnx)")
    p.add_argument("--task", choices=TASKS,
                   help="what it takes and returns (default: a text task when a tokenizer is found, else tensor)")
    p.add_argument("--tokenizer", type=Path, help="tokenizer.json of a text model (default: one next to the ONNX file)")
    p.add_argument("--axis", action="append", metavar="NAME=MAX",
                   help="largest size of a dynamic axis the traffic sample does not give (repeatable)")
    p.add_argument("--traffic", type=Path, help="traffic sample for this model (default: the manifest's)")
    p.add_argument("--manifest", type=Path, default=defaults.MANIFEST, help="manifest to add it to (created if missing)")
    p.add_argument("--artifacts", type=Path, default=defaults.ARTIFACTS, help="where the check's plan is written")
    p.set_defaults(func=cmd_init)

    p = shared.parser(sub, "export", help="export the manifest's models to ONNX and check parity with PyTorch")
    _inputs(p, repository=False)
    p.add_argument("--force", action="store_true", help="export again even when the export is up to date")
    p.set_defaults(func=cmd_export)

    p = shared.parser(sub, "traffic", help="write a synthetic traffic sample (JSON Lines)")
    p.add_argument("--traffic-shape", choices=SHAPES, default="chat",
                   help="lengths like chat turns, chat + documents, uniform, fixed")
    shared.hidden(p, "--shape", dest="traffic_shape", choices=SHAPES)
    p.add_argument("--n", type=int, default=5000, help="number of requests")
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--tokens", type=int, default=128, help="length for --traffic-shape fixed")
    p.add_argument("--batch-max", type=int, default=1, help="batch sizes uniform over [1, N]")
    p.add_argument("--rate", type=float, help="add Poisson arrival times at this many requests/s")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=defaults.TRAFFIC)
    p.set_defaults(func=cmd_traffic)

    p = shared.parser(sub, "plan", help="plan buckets and profiles from the traffic sample; write a report")
    _inputs(p, repository=False)
    p.add_argument("--out", type=Path, default=defaults.PLAN_REPORT, help="report folder")
    p.set_defaults(func=cmd_plan)

    p = shared.parser(sub, "repo", help="write the model repository from existing exports (no export)")
    _inputs(p)
    p.add_argument("--force", action="store_true", help="rebuild engines and weights even when up to date")
    p.set_defaults(func=cmd_repo)

    p = shared.parser(sub, "build", help="export, plan, build engines and write the model repository")
    _inputs(p)
    p.add_argument("--force", action="store_true",
                   help="rebuild engines and weights even when up to date (uses the existing ONNX export)")
    p.add_argument("--reexport", action="store_true", help="export ONNX again even when up to date (needs torch)")
    p.add_argument("--check", action="store_true",
                   help="only check that the repository is what this build would write (configs, files, and "
                        "engines that fit this GPU and TensorRT); print what differs and exit 1 if anything does")
    p.set_defaults(func=cmd_build)

    p = shared.parser(sub, "fingerprint", help="print this node's GPU + TensorRT fingerprint (engine cache key)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_fingerprint)
