"""``tritonbundle``: one command, one subcommand per stage.

A user error (:class:`TritonBundleError`) prints one line and exits non-zero; anything else is a
bug and keeps its traceback. Heavy imports (torch, tensorrt, locust) happen inside the commands that
need them, so ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tritonbundle import __version__
from tritonbundle.errors import TritonBundleError
from tritonbundle.log import LOG, setup, step

if TYPE_CHECKING:
    from tritonbundle.build.stage import BuildOptions
    from tritonbundle.clients.sync import _BaseClient

Handler = Callable[[argparse.Namespace], int]


# -- build stage ------------------------------------------------------------------------------------
def _build_options(args: argparse.Namespace) -> BuildOptions:
    from tritonbundle.build.stage import BuildOptions

    overrides = {
        key: getattr(args, key, None)
        for key in ("target", "runtime", "precision")
        if getattr(args, key, None) is not None
    }
    return BuildOptions(
        manifest=args.manifest,
        repository=getattr(args, "repository", Path("model_repository")),
        artifacts=args.artifacts,
        traffic=getattr(args, "traffic", None),
        models=tuple(getattr(args, "model", None) or ()),
        overrides=overrides,
        force=getattr(args, "force", False),
    )


def cmd_export(args: argparse.Namespace) -> int:
    from tritonbundle.build.stage import export_all

    for name, artifacts in export_all(_build_options(args)).items():
        print(f"{name}: {artifacts.onnx_path}")
    return 0


def cmd_traffic(args: argparse.Namespace) -> int:
    from tritonbundle import traffic

    sample = traffic.synthetic(
        args.shape, n=args.n, max_tokens=args.max_tokens, seed=args.seed, batch_max=args.batch_max,
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

    options = _build_options(args)
    for spec, plan in plan_all(options):
        files = write_report(spec, plan, options, args.out / spec.name)
        print(files.table)
        print(f"report: {files.json} {files.png or ''}".rstrip())
    return 0


def cmd_repo(args: argparse.Namespace) -> int:
    from tritonbundle.build.stage import build

    options = _build_options(args)
    options.export = False
    names = build(options)
    print(f"{args.repository}: {', '.join(sorted(names))}")
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    from tritonbundle.build.stage import build, check_repository

    options = _build_options(args)
    if args.check:
        problems = check_repository(options)
        for line in problems:
            print(line)
        return 1 if problems else 0
    names = build(options)
    print(f"{args.repository}: {', '.join(sorted(names))}")
    return 0


# -- server -----------------------------------------------------------------------------------------
def cmd_fingerprint(args: argparse.Namespace) -> int:
    from tritonbundle.build.tensorrt_engine import current_platform

    platform = current_platform()
    print(platform.fingerprint if not args.json else json.dumps({**platform.__dict__, "fingerprint": platform.fingerprint}))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from tritonbundle.server import ServerOptions, TritonServer, supervise

    key = os.environ.get(args.api_key_env) if args.api_key_env else None
    if not key:
        LOG.info("$%s is not set: the model-repository, shared-memory, trace and logging APIs are locked with "
                 "a random key (set the variable to use them)", args.api_key_env)
    server = TritonServer(
        ServerOptions(
            model_repository=args.repository, http_port=args.http_port, grpc_port=args.grpc_port,
            metrics_port=args.metrics_port, address=args.address, log_path=args.log_file,
            model_control_mode=args.model_control_mode, load_models=args.load_model or (),
            exit_timeout_s=args.exit_timeout_s, restricted_api_key=key, log_verbose=args.log_verbose,
            tritonserver=args.tritonserver,
        )
    )
    stop = threading.Event()

    def _on_signal(signum: int, _frame: object) -> None:
        LOG.info("received %s: stopping tritonserver (drains in-flight requests for up to %d s)",
                 signal.Signals(signum).name, args.exit_timeout_s)
        stop.set()

    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    step(f"starting {server.installation.description if server.installation else 'tritonserver'}")
    server.start(wait=False)
    server.wait_ready(timeout_s=args.ready_timeout_s)
    LOG.info("ready: HTTP %s  gRPC %s  metrics %s%s", server.http_url, server.grpc_url, server.metrics_url,
             f"  (log: {args.log_file})" if args.log_file else "")
    if args.ready_file:
        args.ready_file.write_text(json.dumps({"http": server.http_url, "grpc": server.grpc_url, "metrics": server.metrics_url}))
    return supervise(server, restart=args.restart, max_restarts=args.max_restarts, stop_event=stop,
                     ready_timeout_s=args.ready_timeout_s, already_started=True)


# -- clients ----------------------------------------------------------------------------------------
def _client(args: argparse.Namespace) -> _BaseClient:
    from tritonbundle.clients import connect

    return connect(
        args.url, protocol=args.protocol, model=args.model, timeout_s=args.timeout_s,
        check_model=getattr(args, "check_model", True), api_key=os.environ.get(args.api_key_env) or None,
    )


def _default_url(protocol: str) -> str:
    return os.environ.get("TRITON_URL") or ("127.0.0.1:8001" if protocol == "grpc" else "127.0.0.1:8000")


def cmd_infer(args: argparse.Namespace) -> int:
    texts = list(args.texts) or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not texts:
        raise TritonBundleError("no texts: pass them as arguments or one per line on stdin")
    with _client(args) as client:
        embeddings = client.embed(texts)
    out = [{"text": t, "embedding": [round(float(x), 6) for x in e]} for t, e in zip(texts, embeddings)]
    json.dump(out if not args.compact else [o["embedding"] for o in out], sys.stdout)
    sys.stdout.write("\n")
    return 0


def cmd_load(args: argparse.Namespace) -> int:
    """Load or unload a model on a server running with explicit model control."""
    args.check_model = False
    with _client(args) as client:
        for name in args.names:
            if args.command == "load":
                client.load_model(name)
            else:
                client.unload_model(name)
            print(f"{args.command}ed {name}")
    return 0


def cmd_health(args: argparse.Namespace) -> int:
    args.check_model = False
    with _client(args) as client:
        health = client.health()
    print(json.dumps(health))
    return 0 if health["live"] and health["ready"] else 1


def cmd_models(args: argparse.Namespace) -> int:
    args.check_model = False
    with _client(args) as client:
        models = client.models()
    if args.json:
        print(json.dumps(models, indent=2))
        return 0
    print(f"{'model':<24} {'version':<8} {'state':<12} {'max batch':<10} {'batching'}")
    for m in models:
        print(f"{m['name']:<24} {m.get('version') or '-':<8} {m.get('state') or '-':<12} "
              f"{m.get('max_batch_size', '-')!s:<10} {m.get('batching', '-')}")
    return 0


# -- parser -----------------------------------------------------------------------------------------
def _add_build_args(p: argparse.ArgumentParser, *, repository: bool = True) -> None:
    p.add_argument("--manifest", type=Path, default=Path("build/models.yaml"), help="models manifest (YAML)")
    p.add_argument("--artifacts", type=Path, default=Path("build/artifacts"), help="ONNX files, plans, logs")
    p.add_argument("--traffic", type=Path, help="traffic sample (JSON Lines); overrides the manifest's")
    p.add_argument("--model", action="append", help="only this model (repeatable)")
    p.add_argument("--target", choices=("cpu", "gpu"), help="override the manifest's target server")
    p.add_argument("--runtime", choices=("onnxruntime", "tensorrt", "pytorch"), help="override every model's runtime")
    p.add_argument("--precision", choices=("fp32", "fp16", "bf16", "int8"), help="override every model's precision")
    if repository:
        p.add_argument("--repository", type=Path, default=Path("model_repository"), help="model repository to write")
    p.add_argument("--force", action="store_true", help="redo exports and engines even when up to date")


def _add_client_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="server address host:port (default 127.0.0.1:8000 for http, :8001 for grpc; $TRITON_URL)")
    p.add_argument("--protocol", choices=("http", "grpc"), default="http")
    p.add_argument("--model", default="minilm", help="model to call (default: the minilm ensemble)")
    p.add_argument("--timeout-s", type=float, default=30.0, help="deadline per call, in seconds")
    p.add_argument("--api-key-env", default="TRITONBUNDLE_API_KEY",
                   help="environment variable holding the key for the restricted APIs (repository index, model control)")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tritonbundle", description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--version", action="version", version=f"tritonbundle {__version__}")
    ap.add_argument("-v", "--verbose", action="store_true", help="log every external command and debug detail")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("export", help="export the manifest's models to ONNX and check parity with PyTorch")
    _add_build_args(p, repository=False)
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("traffic", help="write a synthetic traffic sample (JSON Lines)")
    p.add_argument("--shape", choices=("chat", "bimodal", "uniform", "fixed"), default="chat")
    p.add_argument("--n", type=int, default=5000, help="number of requests")
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--tokens", type=int, default=128, help="length for --shape fixed")
    p.add_argument("--batch-max", type=int, default=1, help="batch sizes uniform over [1, N]")
    p.add_argument("--rate", type=float, help="add Poisson arrival times at this many requests/s")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("build/traffic/chat.jsonl"))
    p.set_defaults(func=cmd_traffic)

    p = sub.add_parser("plan", help="plan buckets and profiles from the traffic sample; write a report")
    _add_build_args(p, repository=False)
    p.add_argument("--out", type=Path, default=Path("reports/plan"), help="report folder")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("repo", help="write the model repository from existing exports (no engine builds)")
    _add_build_args(p)
    p.set_defaults(func=cmd_repo)

    p = sub.add_parser("build", help="export, plan, build engines and write the model repository")
    _add_build_args(p)
    p.add_argument("--check", action="store_true",
                   help="only check that the repository's engines fit this GPU and TensorRT; exit 1 if not")
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("fingerprint", help="print this node's GPU + TensorRT fingerprint (engine cache key)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_fingerprint)

    p = sub.add_parser("serve", help="run tritonserver on a model repository until Ctrl-C/SIGTERM")
    p.add_argument("--repository", type=Path, default=Path("model_repository"))
    p.add_argument("--address", default="127.0.0.1", help="address to bind (0.0.0.0 exposes the server)")
    p.add_argument("--http-port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--grpc-port", type=int, default=8001, help="0 picks a free port")
    p.add_argument("--metrics-port", type=int, default=8002, help="0 picks a free port")
    p.add_argument("--log-file", type=Path, help="write the server log here")
    p.add_argument("--log-verbose", type=int, default=0)
    p.add_argument("--model-control-mode", choices=("none", "poll", "explicit"), default="none")
    p.add_argument("--load-model", action="append", help="with explicit control: load this model at start")
    p.add_argument("--exit-timeout-s", type=int, default=30, help="how long Triton drains in-flight requests on stop")
    p.add_argument("--ready-timeout-s", type=float, default=180.0)
    p.add_argument("--restart", action="store_true", help="restart the server when it crashes (with backoff)")
    p.add_argument("--max-restarts", type=int, default=10)
    p.add_argument("--api-key-env", default="TRITONBUNDLE_API_KEY",
                   help="environment variable holding the key that unlocks the repository/shared-memory APIs")
    p.add_argument("--tritonserver", help="tritonserver binary (default: $TRITONSERVER, else the nvidia-pytriton wheel's)")
    p.add_argument("--ready-file", type=Path, help="write the server's addresses as JSON here once ready")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("infer", help="embed texts (arguments, or one per line on stdin); prints JSON")
    _add_client_args(p)
    p.add_argument("texts", nargs="*")
    p.add_argument("--compact", action="store_true", help="print only the embeddings")
    p.set_defaults(func=cmd_infer)

    for verb, text in (("load", "load (or reload, picking up a new version) models; needs explicit model control "
                                "and the API key"), ("unload", "unload models; needs explicit model control and the API key")):
        p = sub.add_parser(verb, help=text)
        _add_client_args(p)
        p.add_argument("names", nargs="+", metavar="MODEL")
        p.set_defaults(func=cmd_load)

    p = sub.add_parser("health", help="server liveness and readiness")
    _add_client_args(p)
    p.set_defaults(func=cmd_health)

    p = sub.add_parser("models", help="models in the repository: versions, states, batching")
    _add_client_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_models)

    # Later stages (demo, loadtest, bench) register their subcommands in tritonbundle.commands.
    from tritonbundle import commands

    for register in commands.REGISTER:
        register(sub)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    setup(verbose=args.verbose)
    if getattr(args, "url", "x") is None:
        args.url = _default_url(args.protocol)
    try:
        return int(args.func(args))
    except TritonBundleError as e:
        print(f"tritonbundle {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
