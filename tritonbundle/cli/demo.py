"""``tritonbundle demo`` (what ``make demo`` runs)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tritonbundle.cli import args as shared
from tritonbundle.cli import defaults


def cmd_demo(args: argparse.Namespace) -> int:
    from tritonbundle.demo import run_demo

    return run_demo(manifest=args.manifest, repository=args.repository, artifacts=args.artifacts, log_file=args.log_file)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = shared.parser(sub, "demo", help="export, write the repository, serve, embed sentences over HTTP and gRPC, stop")
    p.add_argument("--manifest", type=Path, default=defaults.MANIFEST)
    p.add_argument("--repository", type=Path, default=defaults.REPOSITORY)
    p.add_argument("--artifacts", type=Path, default=defaults.ARTIFACTS)
    p.add_argument("--log-file", type=Path, default=defaults.DEMO_LOG)
    p.set_defaults(func=cmd_demo)
