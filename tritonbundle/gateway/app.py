"""``tritonbundle gateway``: an ASGI service (Starlette, served by uvicorn) that speaks the OpenAI
embeddings API and calls Triton over gRPC with the project's :class:`~tritonbundle.clients.AsyncGrpcClient`.

Each request calls the text model (texts) or its encoder (token rows), split by ``max_batch_size`` like
every client call; usage is the sum of the ``tokens`` output, the counts of the tokenizer that fed the
encoder. Token-id requests name the encoder version the model's ensemble is pinned to, so a release's
candidate loaded beside it never answers them (``tritonbundle release``). Errors keep OpenAI's shape
and status codes, every path included (unknown routes, anything unexpected): 400 for bad input
(Triton's own reason), 404 for a model the gateway does not serve, 413 for a body over
:data:`MAX_BODY_BYTES`, 429 with ``Retry-After`` when Triton's queue is full, 503 when Triton cannot be
reached or has lost the model, 504 when the deadline passes (the client's or Triton's queue timeout). JSON in and out is decoded and encoded off the event loop.

With tenants (:mod:`.tenants`), every ``/v1`` request needs ``Authorization: Bearer <key>`` (401
otherwise), sees only its tenant's models (another model is a 404, as one that does not exist), and is
held to its tenant's limits (429 with ``Retry-After``); the tenant's name goes to Triton in the request
header ``tritonbundle-tenant`` (whatever a caller sent under that name is dropped: only the key counts).
Every ``/v1/embeddings`` request is metered (:mod:`.metering`).

``GET /internal/authorize`` answers the edge's question for each KServe ``/v2`` inference request (nginx
``auth_request``; docker/edge/nginx.conf): 204 with ``X-Tritonbundle-Tenant`` for a key that may go on,
401 for a missing or unknown key, 403 with ``X-Tritonbundle-Refusal`` (``model``, ``rate``, ``tokens``) and
``Retry-After`` otherwise, with the reason in ``X-Tritonbundle-Message`` (the edge turns rate and tokens
into 429 / RESOURCE_EXHAUSTED). The edge never passes ``/internal/`` to callers.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import urllib.parse
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from tritonbundle.clients.aio import AsyncGrpcClient
from tritonbundle.clients.core import RetryPolicy
from tritonbundle.contract import TENANT_HEADER, TOKENS_OUTPUT
from tritonbundle.errors import (
    QUEUE_FULL,
    QUEUE_TIMEOUT,
    ClientBusyError,
    ClientError,
    ConfigError,
    DeadlineExceededError,
    InvalidInputError,
    MetadataMismatchError,
    ModelNotFoundError,
    ServerUnavailableError,
)
from tritonbundle.gateway.metering import ANONYMOUS, UNAUTHENTICATED, Meter, Usage
from tritonbundle.gateway.openai_api import (
    ApiError,
    EmbeddingsRequest,
    embeddings_response,
    invalid,
    model_object,
    models_response,
    parse,
)
from tritonbundle.gateway.tenants import Admission, Refused, Tenant, Tenants, TooLarge

#: Larger bodies are refused before they are read (2,048 texts of ~8 KB each).
MAX_BODY_BYTES = 16 << 20


class Backend:
    """The served embedding models, one gRPC client each (connected and checked at start)."""

    def __init__(self, url: str, models: Sequence[str], *, timeout_s: float = 30.0, missing: str = "fail") -> None:
        if not models:
            raise ConfigError("the gateway needs at least one model (--model)")
        self.url, self.names, self.timeout_s = url, list(dict.fromkeys(models)), timeout_s
        #: "fail": a model that is not served (or is no text-embedding model) stops the start; "warn": it is
        #: left out with a warning, and the gateway serves the rest (none: /v1/models is empty).
        self.missing = missing
        self.warnings: list[str] = []
        self.clients: dict[str, AsyncGrpcClient] = {}
        #: The embedding's size per model (None when its config leaves it dynamic).
        self.dims: dict[str, int | None] = {}
        #: The longest token sequence per model (its encoder's ``max_sequence_length``; None: not known).
        self.max_lengths: dict[str, int | None] = {}
        #: The token ids each model's encoder takes, [0, n) (None: not known).
        self.vocab: dict[str, int | None] = {}
        #: Why a model's encoder cannot take token rows (None: it can), known at start.
        self.token_refusal: dict[str, str | None] = {}
        self.created = int(time.time())

    async def start(self) -> None:
        for name in list(self.names):
            client = AsyncGrpcClient(self.url, model=name, timeout_s=self.timeout_s, retry=RetryPolicy(max_attempts=1),
                                     connect_timeout_s=self.timeout_s)
            try:
                await client.connect()
                info = await client.model_info(name)
                outputs = {t.name: t for t in info.outputs}
                if info.task != "text-embedding" or TOKENS_OUTPUT not in outputs:
                    raise ConfigError(f"model {name!r} at {self.url} is not a text-embedding model with token counts "
                                      f"(task {info.task!r}, outputs {sorted(outputs)}): serve one the build stage wrote "
                                      "(rebuild older repositories)")
            except (ConfigError, ModelNotFoundError, MetadataMismatchError) as e:
                await client.close()
                if self.missing != "warn":
                    raise
                self.names.remove(name)
                self.warnings.append(f"left out: {e}")
                continue
            except BaseException:
                await client.close()
                raise
            size = int(info.outputs[0].shape[-1])
            self.dims[name] = size if size > 0 else None
            self.max_lengths[name], self.vocab[name], self.token_refusal[name] = await self._encoder_limits(client)
            self.clients[name] = client

    @staticmethod
    async def _encoder_limits(client: AsyncGrpcClient) -> tuple[int | None, int | None, str | None]:
        """The encoder's longest sequence and vocabulary size (None where it does not say), and why it
        cannot take token rows (None: it can)."""
        try:
            info = await client.model_info(client.token_model)
        except ClientError:  # an encoder that does not say: texts are estimated by their bytes alone
            return None, None, None
        takes = {t.name for t in info.inputs}
        others, refusal = sorted(takes - set(client.token_inputs)), None
        if others:
            refusal = f"its encoder {info.name!r} also takes {others}: send texts, not token ids"
        elif not takes >= set(client.token_inputs):
            refusal = (f"its encoder {info.name!r} takes {sorted(takes)}, not {list(client.token_inputs)}: send texts, "
                       "not token ids")
        return info.max_sequence_length or None, info.vocab_sizes.get(client.token_inputs[0]) or None, refusal

    async def close(self) -> None:
        for client in self.clients.values():
            await client.close()

    def check(self, request: EmbeddingsRequest) -> None:
        """:class:`ApiError` for a request this model cannot answer, before it takes anything from a limit."""
        if request.model not in self.clients:
            raise not_found(request.model, self.names)
        refusal = self.token_refusal.get(request.model)
        if request.token_rows and refusal:
            raise invalid(f"model {request.model!r} takes texts only: {refusal}")
        cap = self.max_lengths.get(request.model)
        longest = max((len(r) for r in request.token_rows), default=0)
        if cap and longest > cap:  # refused here, before a limit is charged for what Triton never sees
            i = next(i for i, r in enumerate(request.token_rows) if len(r) == longest)
            raise invalid(f"'input' item {i} has {longest} tokens; model {request.model!r} takes at most {cap}")
        vocab = self.vocab.get(request.model)
        if vocab:  # a TensorRT plan indexes its table with whatever it is sent
            for i, row in enumerate(request.token_rows):
                bad = next((t for t in row if t >= vocab), None)  # parse refused negative ids
                if bad is not None:
                    raise invalid(f"'input' item {i} holds the token id {bad}: model {request.model!r} takes ids in "
                                  f"[0, {vocab}) (its own tokenizer's vocabulary, not tiktoken's)")
        size = self.dims[request.model]
        if request.dimensions is not None and size is not None and request.dimensions != size:
            raise invalid(f"model {request.model!r} returns {size} dimensions; it cannot return {request.dimensions}",
                          "dimensions")

    async def embed(self, request: EmbeddingsRequest, headers: Mapping[str, str] | None = None,
                    ) -> tuple[np.ndarray[Any, Any], int]:
        """(vectors, tokens used) for a request :meth:`check` passed; :class:`ApiError` for anything that fails."""
        client = self.clients[request.model]
        try:
            if request.texts:
                vectors, counts = await client.embed_counted(list(request.texts), headers=headers)
                used = int(counts.sum())
            else:
                # the encoder version the ensemble pins (a release's candidate never answers: clients/core.py)
                vectors = await client.embed_tokens([list(r) for r in request.token_rows], headers=headers)
                used = sum(len(r) for r in request.token_rows)
        except ClientError as e:
            raise api_error(e) from e
        if request.dimensions is not None and vectors.shape[-1] != request.dimensions:  # a size left dynamic
            error = invalid(f"model {request.model!r} returned {vectors.shape[-1]} dimensions; it cannot return "
                            f"{request.dimensions}", "dimensions")
            error.tokens_used = used  # what the tenant is charged, not the whole reservation
            raise error
        return vectors, used


def not_found(model: str, served: Sequence[str]) -> ApiError:
    return ApiError(404, f"the model {model!r} does not exist here or this key may not use it; served to it: "
                         f"{list(served)}", code="model_not_found", param="model")


def api_error(e: ClientError) -> ApiError:
    """Triton's answer as OpenAI's error (module docstring)."""
    text = str(e)
    if isinstance(e, InvalidInputError):
        return invalid(text)
    if isinstance(e, MetadataMismatchError):  # e.g. token ids for a model whose encoder takes token type ids too
        return invalid(f"this model cannot take that input: {text}")
    if isinstance(e, ClientBusyError) or QUEUE_FULL in text or e.status == "RESOURCE_EXHAUSTED":
        return ApiError(429, f"the server is at capacity, retry later: {text}", kind="rate_limit_error",
                        code="server_at_capacity", retry_after_s=1.0, reason="server_busy")
    if isinstance(e, DeadlineExceededError) or QUEUE_TIMEOUT in text:
        return ApiError(504, f"the model did not answer in time: {text}", kind="server_error", code="timeout")
    if isinstance(e, ServerUnavailableError | ModelNotFoundError):
        return ApiError(503, f"the model server cannot serve the model now: {text}", kind="server_error",
                        code="unavailable", retry_after_s=1.0)
    return ApiError(500, f"the model server failed the request: {text}", kind="server_error")


#: The model of a KServe HTTP inference path (the edge's X-Original-URI).
KSERVE_MODEL = re.compile(r"^/v2/models/([^/?]+)")
#: What may go into a header the edge echoes into its JSON answers unescaped.
UNSAFE = re.compile(r'[^ !#-\[\]-~]')


def header_text(text: str) -> str:
    return UNSAFE.sub("?", text)[:400]


def outcome(e: ApiError) -> str:
    """A failed request's outcome in the metering: refused (a key or a limit), invalid or error."""
    if e.reason:
        return "refused"
    return "error" if e.status >= 500 else "invalid"


def create_app(backend: Backend, tenants: Tenants | None = None, meter: Meter | None = None) -> Any:
    """The ASGI application (Starlette is imported here: the gateway's extra, not the base install)."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    def error(e: ApiError) -> Response:
        headers = {"Retry-After": str(int(e.retry_after_s))} if e.retry_after_s else None
        return JSONResponse(e.body(), status_code=e.status, headers=headers)

    async def read_body(request: Request) -> bytes:
        """The body, refused past MAX_BODY_BYTES whether it says its length or arrives chunked."""
        too_big = ApiError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes", param="input")
        if int(request.headers.get("content-length") or 0) > MAX_BODY_BYTES:
            raise too_big
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise too_big
            chunks.append(chunk)
        return b"".join(chunks)

    def decode(raw: bytes) -> Any:
        try:
            return json.loads(raw)
        except ValueError as e:
            raise invalid(f"the request body is not JSON: {e}", param=None) from e
        except RecursionError:  # arrays nested thousands deep: the caller's body, not the server's fault
            raise invalid("the request body nests deeper than JSON is read here", param=None) from None

    def encode(model: str, vectors: np.ndarray[Any, Any], tokens: int, encoding: str) -> bytes:
        if not np.isfinite(vectors).all():
            raise ApiError(500, f"model {model!r} returned a vector that is not finite", kind="server_error")
        return json.dumps(embeddings_response(model, vectors, tokens, encoding), separators=(",", ":")).encode()

    meter = meter or Meter()
    admission = Admission(tenants.tenants) if tenants is not None else None

    def authenticate(request: Request) -> Tenant | None:
        """The caller's tenant (None without tenants); :class:`ApiError` 401 for a missing or unknown key."""
        if tenants is None:
            return None
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise ApiError(401, "no API key: send it as 'Authorization: Bearer <key>'", code="invalid_api_key",
                           param=None, reason="unauthenticated")
        tenant = tenants.find(key.strip())
        if tenant is None:  # the key itself is never echoed or logged
            raise ApiError(401, "the API key is not known here", code="invalid_api_key", param=None,
                           reason="unauthenticated")
        return tenant

    @contextlib.contextmanager
    def refusals() -> Iterator[None]:
        """A tenant's limit refusing the request, as OpenAI's 429 (or 400 for one too large to ever fit)."""
        try:
            yield
        except Refused as r:
            raise ApiError(429, r.message, kind="rate_limit_error", code="rate_limit_exceeded", param=None,
                           retry_after_s=r.retry_after_s, reason=r.reason) from None
        except TooLarge as e:
            raise ApiError(400, str(e), code="request_too_large", param="input", reason="too_large") from None

    def visible(tenant: Tenant | None) -> list[str]:
        return [m for m in backend.names if tenant is None or tenant.may_use(m)]

    async def embeddings(request: Request) -> Response:
        start, name, model = time.perf_counter(), ANONYMOUS if tenants is None else UNAUTHENTICATED, ANONYMOUS
        tenant, admitted, answered, reserved, spent, tokens, texts = None, False, False, 0, 0, 0, 0
        try:
            tenant = authenticate(request)
            name = tenant.name if tenant is not None else name
            body = await read_body(request)
            # Parsing and checking a 16 MiB body takes ~1 s: off the event loop, which the edge's
            # /internal/authorize questions for every /v2 request share.
            parsed = await run_in_threadpool(lambda: parse(decode(body)))
            model = parsed.model if parsed.model in backend.clients else ANONYMOUS  # never a caller's string
            if parsed.model not in backend.clients or (tenant is not None and not tenant.may_use(parsed.model)):
                raise not_found(parsed.model, visible(tenant))  # the models this key may use, no others
            await run_in_threadpool(backend.check, parsed)
            if admission is not None and tenant is not None:
                cap = backend.max_lengths.get(parsed.model)
                with refusals():  # after the body is read, so that refusals are metered per model too
                    reserved = admission.admit(tenant, tokens=parsed.most_tokens(cap), least_tokens=parsed.least_tokens(cap))
                admitted = True
            headers = {TENANT_HEADER: tenant.name} if tenant is not None else None
            vectors, tokens = await backend.embed(parsed, headers)
            texts = parsed.count
            body = await run_in_threadpool(encode, parsed.model, vectors, tokens, parsed.encoding)
            answered = True
        except ApiError as e:
            if admitted and e.status == 400:  # input the server refused after taking it in: the tokens stay spent
                spent = reserved if e.tokens_used is None else e.tokens_used
            meter.record(Usage(time.time(), name, model, outcome(e), e.status, reason=e.reason,
                               latency_ms=(time.perf_counter() - start) * 1000))
            return error(e)
        except ClientDisconnect:  # the caller left mid-upload: no answer, nothing to meter
            raise
        except Exception:  # metered as the 500 that `unexpected` answers it with
            meter.record(Usage(time.time(), name, model, "error", 500, latency_ms=(time.perf_counter() - start) * 1000))
            raise
        finally:  # whatever ended the request (a cancellation too), its place in flight is given back
            if admitted and admission is not None and tenant is not None:
                admission.release(tenant, reserved, tokens if answered else spent)
        meter.record(Usage(time.time(), name, model, "ok", 200, texts, tokens, (time.perf_counter() - start) * 1000))
        return Response(body, media_type="application/json")

    async def authorize(request: Request) -> Response:
        """The edge's check of a KServe request (module docstring)."""
        if tenants is None or admission is None:
            return Response(status_code=204)
        start = time.perf_counter()
        match = KSERVE_MODEL.match(request.headers.get("x-original-uri", ""))
        asked = urllib.parse.unquote(match.group(1)) if match else ""
        model = asked if asked in backend.names or any(asked in t.models for t in tenants.tenants) else ANONYMOUS

        def answer(status: int, name: str, result: str, reason: str = "", message: str = "",
                   headers: dict[str, str] | None = None) -> Response:
            meter.record(Usage(time.time(), name, model, result, status, reason=reason,
                               latency_ms=(time.perf_counter() - start) * 1000))
            extra = {"X-Tritonbundle-Message": header_text(message)} if message else {}
            return Response(status_code=status, headers={**extra, **(headers or {})})

        try:
            tenant = authenticate(request)
        except ApiError as e:
            return answer(401, UNAUTHENTICATED, "refused", "unauthenticated", e.message,
                          {"X-Tritonbundle-Refusal": "unauthenticated"})
        assert tenant is not None
        if asked and not tenant.may_use(asked):
            return answer(403, tenant.name, "refused", "model",
                          f"this key may not use the model {header_text(asked)!r}; it may use {sorted(tenant.models)}",
                          {"X-Tritonbundle-Refusal": "model"})
        try:
            admission.admit(tenant, in_flight=False)
        except Refused as r:
            return answer(403, tenant.name, "refused", r.reason, r.message,
                          {"X-Tritonbundle-Refusal": r.reason, "Retry-After": str(int(r.retry_after_s))})
        return answer(204, tenant.name, "admitted", headers={"X-Tritonbundle-Tenant": tenant.name})

    async def models(request: Request) -> Response:
        try:
            tenant = authenticate(request)
        except ApiError as e:
            return error(e)
        return JSONResponse(models_response(visible(tenant), backend.created))

    async def model(request: Request) -> Response:
        name = request.path_params["name"]
        try:
            tenant = authenticate(request)
            if name not in visible(tenant):
                raise not_found(name, visible(tenant))
        except ApiError as e:
            return error(e)
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

    async def http_error(request: Request, e: Exception) -> Response:
        status = e.status_code if isinstance(e, HTTPException) else 500
        words = {404: "there is no such endpoint: the gateway serves /v1/embeddings and /v1/models",
                 405: "this endpoint does not take that method"}.get(status, f"HTTP {status}")
        return error(ApiError(status, f"{request.method} {request.url.path}: {words}", param=None))

    async def unexpected(request: Request, e: Exception) -> Response:
        return error(ApiError(500, f"the gateway failed the request: {type(e).__name__}: {e}", kind="server_error"))

    return Starlette(exception_handlers={HTTPException: http_error, Exception: unexpected}, routes=[
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{name:path}", model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/internal/authorize", authorize, methods=["GET", "POST"]),
    ], lifespan=lifespan)
