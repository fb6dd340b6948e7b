"""Client commands: ``infer``, ``health``, ``models``, ``load``, ``unload``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tritonbundle.cli import defaults
from tritonbundle.errors import ClientError, ConfigError, TritonBundleError

if TYPE_CHECKING:
    from tritonbundle.clients.sync import _BaseClient



def url(args: argparse.Namespace) -> str:
    """``--url``, else ``$TRITON_URL``, else the protocol's default address."""
    return str(args.url or os.environ.get(defaults.URL_ENV)
               or (defaults.GRPC_URL if args.protocol == "grpc" else defaults.HTTP_URL))


def client(args: argparse.Namespace, *, check_model: bool = True) -> _BaseClient:
    from tritonbundle.clients import connect

    return connect(
        url(args), protocol=args.protocol, model=args.model, timeout_s=args.timeout_s, check_model=check_model,
        api_key=os.environ.get(args.api_key_env) or None,
    )


def cmd_infer(args: argparse.Namespace) -> int:
    texts = list(args.texts) or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not texts:
        raise TritonBundleError("no texts: pass them as arguments or one per line on stdin")
    with client(args) as c:
        embeddings = c.embed(texts)
    out = [{"text": t, "embedding": [round(float(x), 6) for x in e]} for t, e in zip(texts, embeddings)]
    json.dump(out if not args.compact else [o["embedding"] for o in out], sys.stdout)
    sys.stdout.write("\n")
    return 0


def cmd_load(args: argparse.Namespace) -> int:
    """Load or unload a model on a server running with explicit model control."""
    with client(args, check_model=False) as c:
        for name in args.names:
            if args.command == "unload":
                c.unload_model(name)
            else:
                try:
                    c.load_model(name)
                except ClientError as e:
                    if args.repository is None:
                        raise
                    _quarantine_refused(c, args.repository, name, e)
                    return 1
            print(f"{args.command}ed {name}")
    return 0


def _quarantine_refused(c: Any, repository: Path, name: str, error: ClientError) -> None:
    """Move the versions the server refused out of ``repository`` and load what is left (the version
    that was serving), so that neither this server nor its next start tries the broken one again."""
    import re

    from tritonbundle.build.repository import quarantine

    # Only what this load refused, as Triton names it ("version 11 is at UNAVAILABLE state: <why>"):
    # the index also lists retired versions (unloaded) and versions refused before, as UNAVAILABLE.
    refused = {v: str(error) for v in re.findall(r"version (\d+) is at UNAVAILABLE state", str(error))}
    moved = [quarantine(repository, name, v, reason) for v, reason in sorted(refused.items())
             if (repository / name / v).is_dir()]
    if moved:
        c.load_model(name)
    serving = c.model_info(name).version if moved else "?"
    print(f"tritonbundle load: {name}: the server refused version(s) {', '.join(sorted(refused)) or '?'} "
          f"({str(error).splitlines()[0]}); moved to {', '.join(map(str, moved)) or 'nothing (not found)'}; "
          f"serving version {serving}", file=sys.stderr)


def cmd_health(args: argparse.Namespace) -> int:
    with client(args, check_model=False) as c:
        health: dict[str, object] = dict(c.health())
    if args.canary:
        from tritonbundle.canary import Canary, served_models

        if args.protocol != "http":
            raise ConfigError("--canary sends its requests over HTTP: pass the HTTP address")
        models = served_models(args.repository) if args.repository else [args.model]
        url = args.url or os.environ.get(defaults.URL_ENV) or defaults.HTTP_URL
        problems = Canary(f"http://{url}", models, timeout_s=args.timeout_s).check()
        health["answers"] = not any(p.fatal for p in problems)
        health["problems"] = [str(p) for p in problems]
    print(json.dumps(health))
    return 0 if health["live"] and health["ready"] and health.get("answers", True) else 1


def cmd_models(args: argparse.Namespace) -> int:
    with client(args, check_model=False) as c:
        models = c.models()
    if args.json:
        print(json.dumps(models, indent=2))
        return 0
    print(f"{'model':<24} {'version':<8} {'state':<12} {'max batch':<10} {'batching'}")
    for m in models:
        print(f"{m['name']:<24} {m.get('version') or '-':<8} {m.get('state') or '-':<12} "
              f"{m.get('max_batch_size', '-')!s:<10} {m.get('batching', '-')}")
    return 0


def _connection(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help=f"server address host:port (default ${defaults.URL_ENV}, else {defaults.HTTP_URL} "
                   f"for http, {defaults.GRPC_URL} for grpc)")
    p.add_argument("--protocol", choices=("http", "grpc"), default="http")
    p.add_argument("--model", default=defaults.MODEL, help=f"model to call (default: the {defaults.MODEL} ensemble)")
    p.add_argument("--timeout-s", type=float, default=defaults.TIMEOUT_S, help="deadline per call, in seconds")
    p.add_argument("--api-key-env", default=defaults.API_KEY_ENV,
                   help="environment variable holding the key for the restricted APIs (repository index, model control)")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("infer", help="embed texts (arguments, or one per line on stdin); prints JSON")
    _connection(p)
    p.add_argument("texts", nargs="*")
    p.add_argument("--compact", action="store_true", help="print only the embeddings")
    p.set_defaults(func=cmd_infer)

    for verb, text in (("load", "load (or reload, picking up a new version) models; needs explicit model control "
                                "and the API key"), ("unload", "unload models; needs explicit model control and the API key")):
        p = sub.add_parser(verb, help=text)
        _connection(p)
        p.add_argument("names", nargs="+", metavar="MODEL")
        if verb == "load":
            p.add_argument("--repository", type=Path,
                           help="the server's repository folder: a version the server refuses is moved out of it "
                                "(to <repository>.quarantine/, with its error) and the model is loaded again")
        p.set_defaults(func=cmd_load)

    p = sub.add_parser("health", help="server liveness and readiness (--canary: and that the models answer)")
    _connection(p)
    p.add_argument("--canary", action="store_true",
                   help="also send the smallest real request to --model (or every model of --repository): "
                        "Triton 2.51 says ready while a model's Python stub is dead")
    p.add_argument("--repository", type=Path, help="with --canary: probe every model of this repository folder")
    p.set_defaults(func=cmd_health)

    p = sub.add_parser("models", help="models in the repository: versions, states, batching")
    _connection(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_models)
