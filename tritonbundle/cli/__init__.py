"""``tritonbundle``: one command, one subcommand per stage.

Each stage's arguments live in their own module (``cli/build.py``, ``cli/serve.py``, ...); defaults
and environment variables in ``cli/defaults.py``. A user error (:class:`TritonBundleError`) prints
one line and exits non-zero; anything else is a bug and keeps its traceback. Heavy imports (torch,
tensorrt, locust) happen inside the commands that need them, so ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tritonbundle import __version__
from tritonbundle.cli import bench, build, client, demo, gateway, loadtest, release, serve, tune
from tritonbundle.errors import TritonBundleError
from tritonbundle.log import setup

#: Argument groups, in the order ``--help`` lists them.
STAGES = (build, serve, client, gateway, release, demo, loadtest, tune, bench)


def parser() -> argparse.ArgumentParser:
    from tritonbundle.cli.args import Formatter

    ap = argparse.ArgumentParser(prog="tritonbundle", description=__doc__.splitlines()[0] if __doc__ else None,
                                 formatter_class=Formatter)
    ap.add_argument("--version", action="version", version=f"tritonbundle {__version__}")
    ap.add_argument("-v", "--verbose", action="store_true", help="log every external command and debug detail")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for stage in STAGES:
        stage.register(sub)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    setup(verbose=args.verbose)
    try:
        return int(args.func(args))
    except BrokenPipeError:  # `tritonbundle infer ... | head`: the reader has gone; so does the output
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command stopped by a closed pipe
    except TritonBundleError as e:
        print(f"tritonbundle {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
