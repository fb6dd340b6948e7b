"""``tritonbundle gateway``: an ASGI service (Starlette, served by uvicorn) that speaks the OpenAI
embeddings API and calls Triton over gRPC with the project's :class:`~tritonbundle.clients.AsyncGrpcClient`.

Each request becomes one call of the text model (texts) or of its encoder (token rows); usage is the
sum of the ``tokens`` output, the counts of the tokenizer that fed the encoder. Errors keep OpenAI's
shape and status codes: 400 for bad input (Triton's own reason), 404 for a model the gateway does not
serve, 429 with ``Retry-After`` when Triton refuses for load, 503 when it cannot be reached, 504 when
the deadline passes.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np

from tritonbundle.clients.aio import AsyncGrpcClient
from tritonbundle.clients.core import RetryPolicy
from tritonbundle.contract import TOKENS_OUTPUT
from tritonbundle.errors import (
    ClientBusyError,
    ClientError,
    ConfigError,
    DeadlineExceededError,
    InvalidInputError,
    ServerUnavailableError,
)
from tritonbundle.gateway.openai_api import (
    ApiError,
    EmbeddingsRequest,
    embeddings_response,
    invalid,
    model_object,
    models_response,
    parse,
)

#: Larger bodies are refused before they are read (2,048 texts of ~8 KB each).
MAX_BODY_BYTES = 16 << 20


class Backend:
    """The served embedding models, one gRPC client each (connected and checked at start)."""

    def __init__(self, url: str, models: Sequence[str], *, timeout_s: float = 30.0) -> None:
        if not models:
            raise ConfigError("the gateway needs at least one model (--model)")
        self.url, self.names, self.timeout_s = url, list(models), timeout_s
        self.clients: dict[str, AsyncGrpcClient] = {}
        self.dims: dict[str, int] = {}
        self.created = int(time.time())

    async def start(self) -> None:
        for name in self.names:
            client = AsyncGrpcClient(self.url, model=name, timeout_s=self.timeout_s, retry=RetryPolicy(max_attempts=1),
                                     connect_timeout_s=self.timeout_s)
            await client.connect()
            info = await client.model_info(name)
            outputs = {t.name: t for t in info.outputs}
            if info.task != "text-embedding" or TOKENS_OUTPUT not in outputs:
                await client.close()
                raise ConfigError(f"model {name!r} at {self.url} is not a text-embedding model with token counts "
                                  f"(task {info.task!r}, outputs {sorted(outputs)}): serve one the build stage wrote "
                                  "(rebuild older repositories)")
            embedding = info.outputs[0]
            self.dims[name] = int(embedding.shape[-1])
            self.clients[name] = client

    async def close(self) -> None:
        for client in self.clients.values():
            await client.close()

    async def embed(self, request: EmbeddingsRequest) -> tuple[np.ndarray[Any, Any], int]:
        """(vectors, tokens used) for a parsed request; :class:`ApiError` for anything that fails."""
        client = self.clients.get(request.model)
        if client is None:
            raise ApiError(404, f"the model {request.model!r} does not exist here; served: {self.names}",
                           code="model_not_found", param="model")
        if request.dimensions is not None and request.dimensions != self.dims[request.model]:
            raise invalid(f"model {request.model!r} returns {self.dims[request.model]} dimensions; it cannot return "
                          f"{request.dimensions}", "dimensions")
        try:
            if request.texts:
                vectors, counts = await client.embed_counted(list(request.texts))
                return vectors, int(counts.sum())
            vectors = await client.embed_tokens([list(r) for r in request.token_rows])
            return vectors, sum(len(r) for r in request.token_rows)
        except ClientError as e:
            raise api_error(e) from e


def api_error(e: ClientError) -> ApiError:
    """Triton's answer as OpenAI's error (module docstring)."""
    if isinstance(e, InvalidInputError):
        return invalid(str(e))
    if isinstance(e, ClientBusyError) or "queue" in str(e).lower() or e.status == "RESOURCE_EXHAUSTED":
        return ApiError(429, f"the server is at capacity, retry later: {e}", kind="rate_limit_error",
                        code="server_at_capacity", retry_after_s=1.0)
    if isinstance(e, DeadlineExceededError):
        return ApiError(504, f"the model did not answer in time: {e}", kind="server_error", code="timeout")
    if isinstance(e, ServerUnavailableError):
        return ApiError(503, f"the model server cannot be reached: {e}", kind="server_error", code="unavailable",
                        retry_after_s=1.0)
    return ApiError(500, f"the model server failed the request: {e}", kind="server_error")


def create_app(backend: Backend) -> Any:
    """The ASGI application (Starlette is imported here: the gateway's extra, not the base install)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    def error(e: ApiError) -> Response:
        headers = {"Retry-After": str(int(e.retry_after_s))} if e.retry_after_s else None
        return JSONResponse(e.body(), status_code=e.status, headers=headers)

    async def embeddings(request: Request) -> Response:
        try:
            length = int(request.headers.get("content-length") or 0)
            if length > MAX_BODY_BYTES:
                raise ApiError(413, f"the request body has {length} bytes; at most {MAX_BODY_BYTES}", param="input")
            try:
                body = await request.json()
            except ValueError as e:
                raise invalid(f"the request body is not JSON: {e}", param=None) from e  # type: ignore[arg-type]
            parsed = parse(body)
            vectors, tokens = await backend.embed(parsed)
        except ApiError as e:
            return error(e)
        return JSONResponse(embeddings_response(parsed.model, vectors, tokens, parsed.encoding))

    async def models(request: Request) -> Response:
        return JSONResponse(models_response(backend.names, backend.created))

    async def model(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in backend.clients:
            return error(ApiError(404, f"the model {name!r} does not exist here; served: {backend.names}",
                                  code="model_not_found", param="model"))
        return JSONResponse(model_object(name, backend.created))

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "models": backend.names})

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        await backend.start()
        try:
            yield
        finally:
            await backend.close()

    return Starlette(routes=[
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{name:path}", model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ], lifespan=lifespan)
