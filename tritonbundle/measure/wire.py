"""Requests as bytes on the wire: the load generator's gRPC path without the client library's work per
request.

A load generator shares the host with the server it measures (the bench runs both on one machine), so
what it spends per request is taken from the server. Through the project's asyncio client each request
is built again (tritonclient's ``InferInput``s and protobuf message, the retry wrapper) and its answer
decoded into arrays; on the development machine the load generator's CPU per request fell by a quarter
to a third without that (``scripts/loadgen_cost.py``; docs/benchmarks.md, "The load generator's
requests on the wire"). So the load generators build each request of their pool once, *with the client's own code*
(:class:`_Recorder`: the task's method, its checks, its splitting into the model's batch limit, its
headers and server-side timeout, stopped where the client would send), and then send those bytes on a
plain gRPC channel (Triton's ``inference.GRPCInferenceService/ModelInfer``), as NVIDIA's C++
perf_analyzer sends prepared requests. An answer is not decoded: a failed request comes back as a gRPC
status, which :class:`WireSender` raises as :class:`WireError` with its code and message; answers
are checked through the client before any measurement (the worker's ``setup`` call, and the bench's
correctness check).

``TRITONBUNDLE_LOAD_SENDER=client`` sends through the client instead (every request built and decoded
again: what a caller of the client spends). ``TRITONBUNDLE_LOAD_SENDER=http`` sends the same calls over
Triton's HTTP endpoint (KServe v2 ``POST /v2/models/<model>/infer``, binary tensors), each request built
once by :class:`~tritonbundle.clients.aio.AsyncHttpClient`'s own code (its tensors, headers and
server-side timeout; ``tritonclient.http``'s request body) and written on kept-alive HTTP/1.1
connections, one request per connection at a time (:class:`HttpSender`). On the development machine, at
1,000 req/s against a model that does nothing (``scripts/loadgen_cost.py --identity``), the load
generator spent 0.115 ms of CPU per request this way against 0.236 as gRPC bytes, and tritonserver 0.21
against 0.26 (docs/benchmarks.md, "HTTP on the wire"); on the H200 the load generators are about two
fifths of the host's CPU per request at MiniLM's knee.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from tritonbundle.clients import core
from tritonbundle.clients.aio import AsyncGrpcClient, grpc_tensors, http_tensors
from tritonbundle.clients.core import RetryPolicy

T = TypeVar("T")

#: The environment variable naming the sender; its values.
SENDER_ENV = "TRITONBUNDLE_LOAD_SENDER"
SENDERS = ("wire", "client", "http")
#: Triton's unary inference method (grpc_service.proto, ``service GRPCInferenceService``).
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


def sender() -> str:
    """The load generators' sender: ``wire`` (the default), ``client`` or ``http``."""
    name = os.environ.get(SENDER_ENV, "wire").strip() or "wire"
    if name not in SENDERS:
        raise ValueError(f"{SENDER_ENV}={name!r}: expected one of {', '.join(SENDERS)}")
    return name


@dataclass(frozen=True)
class WireRequest:
    """One serialized ``ModelInferRequest`` and the metadata (headers) it goes with; over HTTP, the whole
    request (request line, headers and body) and no metadata."""

    body: bytes
    metadata: tuple[tuple[str, str], ...] = ()


class WireError(RuntimeError):
    """A request the server answered with a gRPC error status: ``"<CODE>: <message>"``."""


class _Captured(Exception):
    """Raised by :class:`_Recorder` where the client would send; the requests are on the recorder."""


class _Recorder(AsyncGrpcClient):
    """A connected client's settings and model descriptions, building requests without sending them."""

    def __init__(self, live: AsyncGrpcClient, http_host: str | None = None) -> None:
        # Not the base's __init__: the live client's attributes as they are (settings, model descriptions).
        # The model descriptions stay shared: one this fetches (a token model's) is the live client's too.
        self.__dict__.update(vars(live))
        self.requests: list[WireRequest] = []
        #: host:port of Triton's HTTP endpoint: the requests are built as AsyncHttpClient's to it.
        self.http_host = http_host

    async def _call(self, model: str, fn: Callable[[], Awaitable[T]], *, deadline: float,
                    retry: RetryPolicy | None = None) -> T:
        return await fn()

    async def _pinned(self, deadline: float) -> str:
        """The live client's pin as it is, not followed: a recorder is made per call, and the servers bench
        and tune measure run no release (their token requests name no version)."""
        return self._pin.version

    async def _batched(self, model: str, arrays: Mapping[str, np.ndarray[Any, Any]], outputs: Sequence[str],
                       max_batch_size: int, timeout_s: float | None, headers: Mapping[str, str] | None = None,
                       version: str = "") -> dict[str, np.ndarray[Any, Any]]:
        n = next(iter(arrays.values())).shape[0]
        for rows in core.chunks(n, max_batch_size):
            self._record(model, {k: v[rows] for k, v in arrays.items()}, outputs, timeout_s or self.timeout_s, headers,
                         version)
        raise _Captured

    async def _infer(self, model: str, arrays: Mapping[str, np.ndarray[Any, Any]], outputs: Sequence[str],
                     timeout_s: float, headers: Mapping[str, str] | None = None,
                     version: str = "") -> dict[str, np.ndarray[Any, Any]]:
        self._record(model, arrays, outputs, timeout_s, headers, version)
        raise _Captured

    def _record(self, model: str, arrays: Mapping[str, np.ndarray[Any, Any]], outputs: Sequence[str],
                timeout_s: float, headers: Mapping[str, str] | None, version: str = "") -> None:
        if self.http_host is not None:
            self.requests.append(_http_request(self.http_host, model, arrays, outputs, timeout_s,
                                               {**self._request_headers(), **(headers or {})}, version))
            return
        # The message tritonclient.grpc.aio's infer() builds, with the arguments AsyncGrpcClient._infer gives it.
        from tritonclient.grpc._utils import _get_inference_request

        inputs, requested = grpc_tensors(arrays, outputs)
        message = _get_inference_request(
            model_name=model, inputs=inputs, model_version=version, request_id="", outputs=requested or None,
            sequence_id=0, sequence_start=False, sequence_end=False, priority=0,
            timeout=core.server_timeout_us(timeout_s), parameters=None)
        metadata = tuple({**self._request_headers(), **(headers or {})}.items())
        self.requests.append(WireRequest(message.SerializeToString(), metadata))


def _http_request(host: str, model: str, arrays: Mapping[str, np.ndarray[Any, Any]], outputs: Sequence[str],
                  timeout_s: float, headers: Mapping[str, str], version: str = "") -> WireRequest:
    """The request tritonclient.http.aio's ``infer()`` sends with the arguments AsyncHttpClient._infer
    gives it (its body and ``Inference-Header-Content-Length``; the path of the model, or of its ``version``)."""
    from urllib.parse import quote

    from tritonclient.http._utils import _get_inference_request

    inputs, requested = http_tensors(arrays, outputs)
    body, json_size = _get_inference_request(
        inputs=inputs, request_id="", outputs=requested or None, sequence_id=0, sequence_start=False,
        sequence_end=False, priority=0, timeout=core.server_timeout_us(timeout_s), custom_parameters=None)
    fields = {"Host": host, "Content-Type": "application/octet-stream", **dict(headers),
              **({"Inference-Header-Content-Length": str(json_size)} if json_size is not None else {}),
              "Content-Length": str(len(body))}
    path = f"/v2/models/{quote(model)}" + (f"/versions/{quote(version)}" if version else "")
    head = f"POST {path}/infer HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items())
    return WireRequest(head.encode("latin-1") + b"\r\n" + body)


async def capture(client: AsyncGrpcClient, send: Callable[[Any], Awaitable[Any]], *,
                  http_host: str | None = None) -> tuple[WireRequest, ...]:
    """The requests ``send(client)`` would make (one per part of the model's batch limit), built by the
    client's own code from its settings and the model descriptions it holds, without sending them; with
    ``http_host``, as the HTTP client would make them to that host:port."""
    recorder = _Recorder(client, http_host)
    try:
        await send(recorder)
    except _Captured:
        return tuple(recorder.requests)
    raise RuntimeError("the call finished without building a request")


class Sender:
    """Sends a call's prepared requests (its parts); ``send`` returns when every part is answered, with
    each answer undecoded."""

    async def send(self, requests: Sequence[WireRequest]) -> list[bytes]:
        if len(requests) == 1:
            return [await self._one(requests[0])]
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    async def _one(self, request: WireRequest) -> bytes:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


class WireSender(Sender):
    """Sends prepared requests on one gRPC channel; an answer is the serialized ``ModelInferResponse``."""

    def __init__(self, url: str, *, timeout_s: float) -> None:
        import grpc
        from tritonclient.grpc._client import MAX_GRPC_MESSAGE_SIZE  # the limits tritonclient's channels set

        self.timeout_s = timeout_s
        self._rpc_error = grpc.aio.AioRpcError
        self._channel = grpc.aio.insecure_channel(url, options=[
            ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_SIZE),
            ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_SIZE)])
        # No serializers: the request goes as the bytes given, the answer comes back as bytes.
        self._infer = self._channel.unary_unary(MODEL_INFER)

    async def _one(self, request: WireRequest) -> bytes:
        try:
            answer: bytes = await self._infer(request.body, metadata=request.metadata or None, timeout=self.timeout_s)
        except self._rpc_error as e:
            raise WireError(f"{e.code().name}: {e.details()}") from None
        return answer

    async def close(self) -> None:
        await self._channel.close()


class HttpStatusError(WireError):
    """A complete HTTP answer whose status is not 200 (its connection can serve the next request)."""


class _Connection(asyncio.Protocol):
    """One kept-alive HTTP/1.1 connection: one request at a time; its answer's body resolves ``answer``."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.answer: asyncio.Future[bytes] | None = None
        self.buffer = bytearray()
        #: The answer's status, where its body starts and its whole length (-1: its head not read yet).
        self.status, self.start, self.length, self.keep = 0, 0, -1, True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    @property
    def usable(self) -> bool:
        """Open, and not told to close: it may carry the next request."""
        return self.keep and self.transport is not None and not self.transport.is_closing()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.length < 0:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
            fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
            try:  # Triton answers with a length (evhtp); anything else is refused
                self.status, length = int(lines[0].split()[1]), int(fields["content-length"])
            except (IndexError, KeyError, ValueError):
                self._fail(WireError(f"UNAVAILABLE: an answer without a status or a Content-Length ({lines[0][:80]})"))
                return
            self.keep = fields.get("connection", "").lower() != "close"
            self.start, self.length = end + 4, end + 4 + length
        if len(self.buffer) >= self.length:
            body = bytes(self.buffer[self.start:self.length])
            self.buffer, self.length = bytearray(), -1
            answer, self.answer = self.answer, None
            if answer is not None and not answer.done():
                if self.status == 200:
                    answer.set_result(body)
                else:  # Triton's error body: {"error": "<message>"}
                    message = body[:300].decode("utf-8", "replace")
                    answer.set_exception(HttpStatusError(f"HTTP {self.status}: {message}"))

    def _fail(self, error: Exception) -> None:
        if self.answer is not None and not self.answer.done():
            self.answer.set_exception(error)
        self.keep = False
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.keep = False
        if self.answer is not None and not self.answer.done():
            self.answer.set_exception(WireError(f"UNAVAILABLE: the server closed the connection ({exc})"))


def _files_limit() -> int:
    """The process's limit on open files, its soft limit raised to the hard one first (as load generators
    do: a connection per request in flight)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


class HttpSender(Sender):
    """Sends prepared HTTP requests (:func:`capture` with ``http_host``) on kept-alive connections to
    ``url`` (host:port), opening one more whenever every open one has a request out; ``send`` returns
    when every part is answered, with each answer's body (Triton's JSON header, then the binary
    outputs), undecoded. A request not answered within ``timeout_s`` fails as ``DEADLINE_EXCEEDED`` and
    its connection is closed (a late answer must not reach the next request)."""

    def __init__(self, url: str, *, timeout_s: float) -> None:
        host, _, port = url.rpartition(":")
        self.host, self.port, self.timeout_s = host, int(port), timeout_s
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()
        #: Connections this process may hold (each is a file; past the knee thousands can be out at once).
        self.max_open = max(16, _files_limit() - 128)
        self._connecting = 0

    async def _one(self, request: WireRequest) -> bytes:
        loop = asyncio.get_running_loop()
        conn = await self._connection(loop)
        answer = conn.answer = loop.create_future()
        assert conn.transport is not None
        conn.transport.write(request.body)
        expire = loop.call_later(self.timeout_s, conn._fail, WireError(
            f"DEADLINE_EXCEEDED: no answer within {self.timeout_s:g} s"))
        try:
            body: bytes = await answer
        except HttpStatusError:  # answered in full: the connection goes on
            self._release(conn)
            raise
        except BaseException:  # timed out, lost or cancelled: the connection may still get an answer
            conn._fail(WireError("CANCELLED"))
            self._open.discard(conn)
            raise
        finally:
            expire.cancel()
        self._release(conn)
        return body

    async def _connection(self, loop: asyncio.AbstractEventLoop) -> _Connection:
        """An idle connection that is still open, else a new one (up to :attr:`max_open`, counting those
        being opened)."""
        while self._idle:
            conn = self._idle.pop()
            if conn.usable:
                return conn
            self._open.discard(conn)  # the server closed it while it was idle
        if len(self._open) + self._connecting >= self.max_open:
            raise WireError(f"RESOURCE_EXHAUSTED: {len(self._open) + self._connecting} connections already out "
                            "(this process's file limit): refused without sending")
        self._connecting += 1
        try:
            _transport, conn = await loop.create_connection(_Connection, self.host, self.port)
        finally:
            self._connecting -= 1
        self._open.add(conn)
        return conn

    def _release(self, conn: _Connection) -> None:
        if conn.usable:
            self._idle.append(conn)
        else:
            self._open.discard(conn)
            if conn.transport is not None:
                conn.transport.close()

    async def close(self) -> None:
        for conn in self._open:
            if conn.transport is not None:
                conn.transport.close()
        self._open.clear()
        self._idle.clear()
