"""``tritonbundle gateway``: the OpenAI embeddings API (``/v1/embeddings``, ``/v1/models``) in front of a
running Triton, for the tools that speak it (the ``openai`` client, LangChain, LlamaIndex, LiteLLM);
``tritonbundle tenants``: keys for the gateway's tenants file; ``tritonbundle usage``: who used what,
from the gateway's usage log."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from tritonbundle.cli import args as shared
from tritonbundle.cli import defaults
from tritonbundle.errors import ConfigError
from tritonbundle.gateway.metering import USAGE_LOG_MAX_BYTES

if TYPE_CHECKING:
    from tritonbundle.gateway.app import Backend

#: The tenants file, when --tenants is not given (compose and Helm set it).
TENANTS_ENV = "TRITONBUNDLE_TENANTS"


def cmd_gateway(args: argparse.Namespace) -> int:
    try:
        import prometheus_client  # noqa: F401
        import uvicorn
    except ImportError as e:
        raise ConfigError("the gateway needs its extra: pip install 'tritonbundle[gateway]' (starlette, uvicorn, "
                          "prometheus-client)") from e
    from tritonbundle.gateway import tenants as tenants_file
    from tritonbundle.gateway.app import Backend, create_app
    from tritonbundle.gateway.metering import Meter

    backend = Backend(args.url, args.model or [defaults.MODEL], timeout_s=args.timeout_s, missing=args.missing_models)
    tenants = tenants_file.load(args.tenants) if args.tenants else None
    served, warnings = asyncio.run(_check(backend))  # a missing or wrong model stops here, in one line
    for line in warnings:
        print(f"warning: {line}", flush=True)
    backend.names = served
    meter = Meter(args.usage_log, max_bytes=args.usage_log_max_mb << 20)
    if args.metrics_port:
        meter.serve(args.metrics_port, args.metrics_host or args.host)
    who = f"{len(tenants.tenants)} tenants from {args.tenants}" if tenants else "no tenants: open to every caller"
    print(f"OpenAI embeddings API on http://{args.host}:{args.port}/v1 for {backend.names} (Triton gRPC {args.url}); "
          f"{who}" + (f"; metrics on :{args.metrics_port}/metrics" if args.metrics_port else ""), flush=True)
    for line in tenants.unserved(backend.names) if tenants is not None else ():
        print(f"warning: {line}", flush=True)
    if tenants is not None and tenants.plain_keys:
        print(f"warning: {args.tenants} holds {tenants.plain_keys} plain keys: store their sha256 instead "
              "(tritonbundle tenants key)", flush=True)
    # lifespan="on": a model that is missing or is not a text-embedding model stops the start, naming it.
    try:
        uvicorn.run(create_app(backend, tenants, meter), host=args.host, port=args.port, log_level="warning",
                    lifespan="on", access_log=False)
    finally:
        meter.close()
    return 0


async def _check(backend: Backend) -> tuple[list[str], list[str]]:
    from tritonbundle.gateway.app import Backend as Probe

    probe = Probe(backend.url, backend.names, timeout_s=backend.timeout_s, missing=backend.missing)
    try:
        await probe.start()
    finally:
        await probe.close()
    return probe.names, probe.warnings


def cmd_tenants_key(args: argparse.Namespace) -> int:
    """A new random key, once, and the line the tenants file keeps (its hash)."""
    from tritonbundle.gateway.tenants import key_hash

    key = "tb-" + secrets.token_urlsafe(32)
    print(f"key (give it to the tenant; it is not stored anywhere): {key}")
    print(f"tenants file entry:\n  - name: {args.name}\n    keys: [\"{key_hash(key)}\"]")
    return 0


def cmd_tenants_check(args: argparse.Namespace) -> int:
    from tritonbundle.gateway.tenants import load

    tenants = load(args.file)
    for t in tenants.tenants:
        models = ", ".join(sorted(t.models)) or "every served model"
        limits = ", ".join(f"{k} {v:g}" for k, v in vars(t.limits).items() if v is not None) or "no limits"
        print(f"{t.name}: {sum(1 for n in tenants.by_key.values() if n == t.name)} keys; {models}; {limits}")
    return 0


_AGO = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")


def when(text: str) -> float:
    """``30m``, ``2h``, ``1d`` ago, or an ISO 8601 time (UTC unless it says), as epoch seconds."""
    m = _AGO.match(text)
    if m:
        return time.time() - float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"{text!r} is neither a duration (30m, 2h, 1d) nor an ISO 8601 time") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()


def cmd_usage(args: argparse.Namespace) -> int:
    from tritonbundle.gateway.metering import format_report, read, report

    since = when(args.since) if args.since else None
    until = when(args.until) if args.until else None
    try:
        rows = report(read(args.log, since, until))
    except OSError as e:
        raise ConfigError(f"usage log {args.log}: {e.strerror or e}") from e
    print(json.dumps(rows, indent=2) if args.json else format_report(rows))
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = shared.parser(sub, "gateway", help="serve the OpenAI embeddings API (/v1/embeddings, /v1/models) in front of Triton")
    p.add_argument("--url", default=defaults.GRPC_URL, help="Triton's gRPC address host:port")
    p.add_argument("--model", action="append", help=f"a text-embedding model to serve (repeat for more; default {defaults.MODEL})")
    p.add_argument("--host", default=defaults.ADDRESS, help="address to bind (0.0.0.0 exposes the gateway)")
    p.add_argument("--port", type=int, default=defaults.GATEWAY_PORT, help="port to listen on")
    p.add_argument("--timeout-s", type=float, default=defaults.TIMEOUT_S, help="deadline per call to Triton, and for connecting at start")
    p.add_argument("--missing-models", choices=("fail", "warn"), default="fail",
                   help="a --model Triton does not serve as a text-embedding model: stop the start, or leave it out "
                        "with a warning and serve the others (compose: a stack whose manifest has none)")
    p.add_argument("--tenants", default=os.environ.get(TENANTS_ENV) or None,
                   help=f"tenants file (YAML: keys, models, limits; docs/tenants.md; default ${TENANTS_ENV}); without it every "
                        "caller is served")
    p.add_argument("--usage-log", help="append one JSON line per request here (tritonbundle usage reads it)")
    p.add_argument("--usage-log-max-mb", type=shared.above(0, whole=True), default=USAGE_LOG_MAX_BYTES >> 20,
                   help="move the usage log aside to <log>.1 (replacing the one before) at this size, and begin "
                        "again: at most twice this on disk")
    p.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus /metrics on this port (0: off)")
    p.add_argument("--metrics-host", help="address the metrics bind to (default: --host's)")
    p.set_defaults(func=cmd_gateway)

    p = shared.parser(sub, "tenants", help="make a key for the gateway's tenants file, or check the file")
    tsub = p.add_subparsers(dest="tenants_command", required=True, metavar="ACTION")
    k = shared.parser(tsub, "key", help="print a new random key and the tenants file entry with its hash")
    k.add_argument("--name", default="my-team", help="the tenant's name in the printed entry")
    k.set_defaults(func=cmd_tenants_key)
    c = shared.parser(tsub, "check", help="read a tenants file and print each tenant's keys, models and limits")
    c.add_argument("file", help="the tenants file (YAML)")
    c.set_defaults(func=cmd_tenants_check)

    p = shared.parser(sub, "usage", help="per tenant and model: requests, refusals, texts, tokens, latency, from a usage log")
    p.add_argument("--log", required=True, help="the gateway's --usage-log file")
    p.add_argument("--since", help="from this time: 30m, 2h, 1d ago, or an ISO 8601 time (default: the start)")
    p.add_argument("--until", help="up to this time, same forms (default: now)")
    p.add_argument("--json", action="store_true", help="JSON rows instead of the table")
    p.set_defaults(func=cmd_usage)
