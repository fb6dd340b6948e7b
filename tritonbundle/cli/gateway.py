"""``tritonbundle gateway``: the OpenAI embeddings API (``/v1/embeddings``, ``/v1/models``) in front of a
running Triton, for the tools that speak it (the ``openai`` client, LangChain, LlamaIndex, LiteLLM)."""

from __future__ import annotations

import argparse
import asyncio
from typing import TYPE_CHECKING

from tritonbundle.cli import args as shared
from tritonbundle.cli import defaults
from tritonbundle.errors import ConfigError

if TYPE_CHECKING:
    from tritonbundle.gateway.app import Backend


def cmd_gateway(args: argparse.Namespace) -> int:
    try:
        import uvicorn
    except ImportError as e:
        raise ConfigError("the gateway needs its extra: pip install 'tritonbundle[gateway]' (starlette, uvicorn)") from e
    from tritonbundle.gateway.app import Backend, create_app

    backend = Backend(args.url, args.model or [defaults.MODEL], timeout_s=args.timeout_s)
    asyncio.run(_check(backend))  # a missing or wrong model stops here, in one line, before uvicorn starts
    print(f"OpenAI embeddings API on http://{args.host}:{args.port}/v1 for {backend.names} (Triton gRPC {args.url})",
          flush=True)
    # lifespan="on": a model that is missing or is not a text-embedding model stops the start, naming it.
    uvicorn.run(create_app(backend), host=args.host, port=args.port, log_level="warning", lifespan="on",
                access_log=False)
    return 0


async def _check(backend: Backend) -> None:
    from tritonbundle.gateway.app import Backend as Probe

    probe = Probe(backend.url, backend.names, timeout_s=backend.timeout_s)
    try:
        await probe.start()
    finally:
        await probe.close()


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = shared.parser(sub, "gateway", help="serve the OpenAI embeddings API (/v1/embeddings, /v1/models) in front of Triton")
    p.add_argument("--url", default=defaults.GRPC_URL, help="Triton's gRPC address host:port")
    p.add_argument("--model", action="append", help=f"a text-embedding model to serve (repeat for more; default {defaults.MODEL})")
    p.add_argument("--host", default=defaults.ADDRESS, help="address to bind (0.0.0.0 exposes the gateway)")
    p.add_argument("--port", type=int, default=defaults.GATEWAY_PORT, help="port to listen on")
    p.add_argument("--timeout-s", type=float, default=defaults.TIMEOUT_S, help="deadline per call to Triton, and for connecting at start")
    p.set_defaults(func=cmd_gateway)
