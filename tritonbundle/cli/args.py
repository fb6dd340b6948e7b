"""Argument groups the commands share: one flag name, one default and one help text per concept.

=====================  =================================  ============================================
concept                flags                              commands
=====================  =================================  ============================================
server address         --url ($TRITON_URL), --protocol    infer, health, models, load, unload
the restricted key     --api-key-env, --api-key-file      infer, health, models, load, unload (serve:
                                                          --api-key-env only)
SLO                    --slo-p99-ms, --slo-p95-ms,        loadtest, tune, bench gpu
                       --max-failure-ratio (1 %)
rate search            --start-rate, --rate-factor,       loadtest (--search), tune, bench gpu
                       --refine, --max-rate
measurement window     --window-s                         loadtest (its length), tune, bench gpu
traffic                --traffic, --traffic-shape         traffic, loadtest, tune, bench gpu
what the clients send  --input (text, tokens)             loadtest (also both), bench gpu
=====================  =================================  ============================================

Spellings of earlier releases stay as hidden aliases for one release (``--slo-ms``, ``--ladder-start``,
``--ladder-factor``, ``--duration-s``, ``--synthetic``, loadtest's ``--shape`` and ``--search START``,
traffic's ``--shape``). Every command's ``--help`` shows the defaults (:class:`Formatter`).
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tritonbundle.cli import defaults
from tritonbundle.measure.latency import FAILURE_BUDGET, Slo
from tritonbundle.traffic import SHAPES


class Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` shows every option's default (not for flags, nor where there is none)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if text == argparse.SUPPRESS or action.default in (None, False, argparse.SUPPRESS, [], ()) \
                or "%(default)" in text or "(default: " in text or not action.option_strings:
            return text
        if isinstance(action.default, (tuple, list)):  # as it is typed: a,b,c, not a Python tuple
            return f"{text} (default: {','.join(map(str, action.default)).replace('%', '%%')})".strip()
        return f"{text} (default: %(default)s)".strip()


class Once(argparse.Action):
    """A flag that takes one value: given twice it is an error, not the last one silently winning
    (``tune --model a --model b`` tuned b alone)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if getattr(namespace, self.dest, None) not in (None, self.default):
            parser.error(f"{option_string} given twice: it takes one value")
        setattr(namespace, self.dest, values)


def parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, **kwargs: object) -> argparse.ArgumentParser:
    """A subcommand's parser, with defaults shown in its help."""
    return sub.add_parser(name, formatter_class=Formatter, **kwargs)  # type: ignore[arg-type]


def hidden(p: argparse.ArgumentParser, *flags: str, **kwargs: object) -> None:
    """An earlier spelling, accepted and not shown."""
    p.add_argument(*flags, help=argparse.SUPPRESS, **kwargs)  # type: ignore[arg-type]


# -- the server --------------------------------------------------------------------------------------------
def server(p: argparse.ArgumentParser, *, model: bool = True) -> None:
    p.add_argument("--url", help=f"server address host:port (${defaults.URL_ENV}, else {defaults.HTTP_URL} for http, "
                   f"{defaults.GRPC_URL} for grpc)")
    p.add_argument("--protocol", choices=("http", "grpc"), default="http", help="protocol to the server")
    if model:
        p.add_argument("--model", default=defaults.MODEL, help="model to call")
    p.add_argument("--timeout-s", type=float, default=defaults.TIMEOUT_S, help="deadline per call, in seconds")
    api_key(p)


def url(args: argparse.Namespace) -> str:
    """``--url``, else ``$TRITON_URL``, else the protocol's default address."""
    return str(args.url or os.environ.get(defaults.URL_ENV)
               or (defaults.GRPC_URL if args.protocol == "grpc" else defaults.HTTP_URL))


def api_key(p: argparse.ArgumentParser) -> None:
    p.add_argument("--api-key-env", default=defaults.API_KEY_ENV,
                   help="environment variable holding the key of the restricted APIs (repository index, model control)")
    p.add_argument("--api-key-file", type=Path,
                   help="file holding that key (default: the one `tritonbundle serve` wrote for this address, "
                        f"under {defaults.KEY_DIR})")


def key_dir() -> Path:
    state = os.environ.get("XDG_STATE_HOME")
    return Path(state) / "tritonbundle" / "keys" if state else defaults.KEY_DIR.expanduser()


def key_file(address: str) -> Path:
    """Where the key of the server at ``address`` (host:port) is kept."""
    return key_dir() / (address.replace(":", "_").replace("/", "_") + ".key")


def write_keys(key: str, addresses: list[str]) -> list[Path]:
    """Write ``key`` for each address, readable and writable by this user only; return the files."""
    folder = key_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    written = []
    for address in addresses:
        path = key_file(address)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key + "\n")
        os.chmod(path, 0o600)
        written.append(path)
    return written


def read_key(args: argparse.Namespace, address: str) -> str | None:
    """The restricted-API key: $<--api-key-env>, else --api-key-file, else the file `serve` wrote for
    ``address``."""
    if os.environ.get(args.api_key_env):
        return str(os.environ[args.api_key_env])
    path = args.api_key_file or key_file(address)
    try:
        return path.read_text().strip() or None
    except OSError:
        if args.api_key_file:
            raise
        return None


# -- SLO, rate search, window ---------------------------------------------------------------------------------
def above(low: float, *, whole: bool = False, at_least: bool = False) -> Callable[[str], Any]:
    """An argparse type: a number over ``low`` (or equal to it, ``at_least``), a whole one when ``whole``;
    anything else is a one-line usage error naming the flag, not a traceback."""
    def parse(text: str) -> float | int:
        try:
            value = int(text) if whole else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {'whole ' if whole else ''}number") from None
        if not math.isfinite(value) or not (value >= low if at_least else value > low):
            raise argparse.ArgumentTypeError(f"{text} must be {'at least' if at_least else 'more than'} {low:g}")
        return value
    return parse


def slo(p: argparse.ArgumentParser, *, p99_ms: float | None = None, p95: bool = True) -> None:
    p.add_argument("--slo-p99-ms", type=above(0), default=p99_ms, help="p99 latency objective, milliseconds")
    hidden(p, "--slo-ms", dest="slo_p99_ms", type=above(0))
    if p95:
        p.add_argument("--slo-p95-ms", type=above(0), help="p95 latency objective, milliseconds")
    p.add_argument("--max-failure-ratio", type=above(0, at_least=True), default=FAILURE_BUDGET,
                   help="failed requests a level may have and still meet the SLO (a failed request counts as an "
                        "infinitely slow one in the percentiles: above 1 %% of failures p99 misses any SLO)")


def slo_from(args: argparse.Namespace) -> Slo:
    return Slo(p95_ms=getattr(args, "slo_p95_ms", None), p99_ms=args.slo_p99_ms,
               max_failure_ratio=args.max_failure_ratio)


def rate_search(p: argparse.ArgumentParser, *, start: float, factor: float = 2.0, refine: int = 2,
                max_rate: float = 100_000.0, per_system: bool = False) -> None:
    """``per_system``: ``--start-rate`` may also name a rate per system (``6400,peer=200``: the peer from
    200, every other system from 6400), kept as text for the command to parse."""
    kind: Any = str if per_system else float
    what = "; or RATE,SYSTEM=RATE,... for a start per system" if per_system else ""
    p.add_argument("--start-rate", type=kind, default=start, help=f"first offered load of the rate search, req/s{what}")
    hidden(p, "--ladder-start", dest="start_rate", type=kind)
    p.add_argument("--rate-factor", type=above(1), default=factor, help="the search multiplies the rate by this until "
                   "the SLO is missed")
    hidden(p, "--ladder-factor", dest="rate_factor", type=above(1))
    p.add_argument("--refine", type=above(0, whole=True, at_least=True), default=refine, help="bisection steps after that")
    p.add_argument("--max-rate", type=above(0), default=max_rate, help="the ladder's last rung (tried when the next would pass it), req/s")


def window(p: argparse.ArgumentParser, *, default: float, what: str = "measured seconds per load level") -> None:
    p.add_argument("--window-s", type=above(0), default=default, help=what)


# -- traffic ----------------------------------------------------------------------------------------------------
def traffic(p: argparse.ArgumentParser, *, sample: str, shape: bool = True) -> None:
    p.add_argument("--traffic", type=Path, help=f"traffic sample (JSON Lines) the requests are drawn from ({sample})")
    if shape:
        p.add_argument("--traffic-shape", choices=SHAPES, default="chat",
                       help="synthetic traffic when there is no sample: lengths like chat turns, chat + documents, "
                            "uniform, fixed")
        hidden(p, "--synthetic", dest="traffic_shape", choices=SHAPES)


def request_input(p: argparse.ArgumentParser, *, both: bool = False) -> None:
    """What the clients send a text model: its own requests, or token rows tokenized on the client side."""
    p.add_argument("--input", choices=("text", "tokens", "both") if both else ("text", "tokens"), default="text",
                   help="text: the model's own requests (texts for a text model, tensors of its declared shapes for "
                        "a tensor model); tokens: token rows straight to a text-embedding model's encoder, as a "
                        "client that tokenizes on its side sends them" + ("; both: alternate" if both else ""))
