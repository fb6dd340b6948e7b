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
