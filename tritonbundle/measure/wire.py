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
again: what a caller of the client spends).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from tritonbundle.clients import core
from tritonbundle.clients.aio import AsyncGrpcClient, grpc_tensors
from tritonbundle.clients.core import RetryPolicy

T = TypeVar("T")

#: The environment variable naming the sender; its values.
SENDER_ENV = "TRITONBUNDLE_LOAD_SENDER"
SENDERS = ("wire", "client")
#: Triton's unary inference method (grpc_service.proto, ``service GRPCInferenceService``).
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


def sender() -> str:
    """The load generators' sender: ``wire`` (the default) or ``client``."""
    name = os.environ.get(SENDER_ENV, "wire").strip() or "wire"
    if name not in SENDERS:
        raise ValueError(f"{SENDER_ENV}={name!r}: expected one of {', '.join(SENDERS)}")
    return name


@dataclass(frozen=True)
class WireRequest:
    """One serialized ``ModelInferRequest`` and the metadata (headers) it goes with."""

    body: bytes
    metadata: tuple[tuple[str, str], ...] = ()


class WireError(RuntimeError):
    """A request the server answered with a gRPC error status: ``"<CODE>: <message>"``."""


class _Captured(Exception):
    """Raised by :class:`_Recorder` where the client would send; the requests are on the recorder."""


class _Recorder(AsyncGrpcClient):
    """A connected client's settings and model descriptions, building requests without sending them."""

    def __init__(self, live: AsyncGrpcClient) -> None:
        # Not the base's __init__: the live client's attributes as they are (settings, model descriptions).
        # The model descriptions stay shared: one this fetches (a token model's) is the live client's too.
        self.__dict__.update(vars(live))
        self.requests: list[WireRequest] = []

    async def _call(self, model: str, fn: Callable[[], Awaitable[T]], *, deadline: float,
                    retry: RetryPolicy | None = None) -> T:
        return await fn()

    async def _batched(self, model: str, arrays: Mapping[str, np.ndarray[Any, Any]], outputs: Sequence[str],
                       max_batch_size: int, timeout_s: float | None,
                       headers: Mapping[str, str] | None = None) -> dict[str, np.ndarray[Any, Any]]:
        n = next(iter(arrays.values())).shape[0]
        for rows in core.chunks(n, max_batch_size):
            self._record(model, {k: v[rows] for k, v in arrays.items()}, outputs, timeout_s or self.timeout_s, headers)
        raise _Captured

    async def _infer(self, model: str, arrays: Mapping[str, np.ndarray[Any, Any]], outputs: Sequence[str],
                     timeout_s: float, headers: Mapping[str, str] | None = None) -> dict[str, np.ndarray[Any, Any]]:
        self._record(model, arrays, outputs, timeout_s, headers)
        raise _Captured

    def _record(self, model: str, arrays: Mapping[str, np.ndarray[Any, Any]], outputs: Sequence[str],
                timeout_s: float, headers: Mapping[str, str] | None) -> None:
        # The message tritonclient.grpc.aio's infer() builds, with the arguments AsyncGrpcClient._infer gives it.
        from tritonclient.grpc._utils import _get_inference_request

        inputs, requested = grpc_tensors(arrays, outputs)
        message = _get_inference_request(
            model_name=model, inputs=inputs, model_version="", request_id="", outputs=requested or None,
            sequence_id=0, sequence_start=False, sequence_end=False, priority=0,
            timeout=core.server_timeout_us(timeout_s), parameters=None)
        metadata = tuple({**self._request_headers(), **(headers or {})}.items())
        self.requests.append(WireRequest(message.SerializeToString(), metadata))


async def capture(client: AsyncGrpcClient, send: Callable[[Any], Awaitable[Any]]) -> tuple[WireRequest, ...]:
    """The requests ``send(client)`` would make (one per part of the model's batch limit), built by the
    client's own code from its settings and the model descriptions it holds, without sending them."""
    recorder = _Recorder(client)
    try:
        await send(recorder)
    except _Captured:
        return tuple(recorder.requests)
    raise RuntimeError("the call finished without building a request")


class WireSender:
    """Sends prepared requests on one gRPC channel; ``send`` returns when every part is answered."""


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

    async def send(self, requests: Sequence[WireRequest]) -> list[bytes]:
        """The serialized ``ModelInferResponse`` of each part, undecoded."""
        if len(requests) == 1:
            return [await self._one(requests[0])]
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    async def _one(self, request: WireRequest) -> bytes:
        try:
            answer: bytes = await self._infer(request.body, metadata=request.metadata or None, timeout=self.timeout_s)
        except self._rpc_error as e:
            raise WireError(f"{e.code().name}: {e.details()}") from None
        return answer

    async def close(self) -> None:
        await self._channel.close()
