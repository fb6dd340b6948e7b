"""asyncio clients: :class:`AsyncHttpClient` (aiohttp) and :class:`AsyncGrpcClient` (grpc.aio).

They behave like the blocking clients (same checks, deadlines, retries, splitting and errors);
chunks of a large input are sent concurrently::

    async with AsyncGrpcClient("127.0.0.1:8001") as client:
        vectors = await client.embed(texts, timeout_s=2.0)
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from tritonbundle.clients import core, modelinfo, pin
from tritonbundle.clients.core import RetryPolicy
from tritonbundle.clients.modelinfo import Classification, ModelInfo
from tritonbundle.contract import SCORE_OUTPUT, TOKENS_OUTPUT
from tritonbundle.errors import ClientBusyError, ModelNotFoundError, ServerUnavailableError

T = TypeVar("T")

#: Chunks of one call in flight at once over gRPC, which has no window of its own: a 2,048-text request
#: is 64 chunks of 32, and sent all at once they filled the bundled encoder's queue (64) by themselves,
#: and on a failure cancelled 63 calls at once (the cancellations Triton 2.51's gRPC frontend crashes on).
#: Four keep 128 rows of a call in the dynamic batcher (four of its batches of 32) without that.
GRPC_CHUNKS_AT_ONCE = 4


class _AsyncBaseClient(core.ClientBase):
    _client: Any  # the protocol's tritonclient asyncio InferenceServerClient, set by _open()

    def __init__(self, url: str, **options: Any) -> None:
        options.setdefault("pool_size", 8)
        super().__init__(url, **options)
        #: Following the release pin (pin.afollow, from the first token call) and its first read answered.
        self._pin_task: asyncio.Future[None] | None = None
        self._pin_answered: asyncio.Event | None = None

    # -- transport hooks ------------------------------------------------------------------------
    async def _open(self) -> None:
        raise NotImplementedError

    async def _close(self) -> None:
        client = getattr(self, "_client", None)
        if client is not None:
            await client.close()

    async def _is_live(self) -> bool:
        return bool(await self._within(self._client.is_server_live(headers=self.headers), self.connect_timeout_s))

    async def _is_ready(self) -> bool:
        return bool(await self._within(self._client.is_server_ready(headers=self.headers), self.connect_timeout_s))

    @staticmethod
    async def _within(call: Awaitable[T], timeout_s: float) -> T:
        """``call``, or :class:`TimeoutError` after ``timeout_s``. Every call is bounded here, not by the
        transports: aiohttp's session timeout is one total for any call (it cut inferences longer than the
        connect timeout), and grpc.aio's calls wait forever unless given one."""
        return await asyncio.wait_for(call, timeout=max(timeout_s, 1e-3))

    async def _describe(self, model: str) -> ModelInfo:
        raise NotImplementedError

    async def _config_json(self, model: str) -> dict[str, Any]:
        raise NotImplementedError

    async def _infer(
        self, model: str, arrays: Mapping[str, np.ndarray[Any, Any]], outputs: Sequence[str], timeout_s: float,
        headers: Mapping[str, str] | None = None, version: str = "",
    ) -> dict[str, np.ndarray[Any, Any]]:
        raise NotImplementedError

    # -- lifecycle ------------------------------------------------------------------------------
    async def connect(self) -> _AsyncBaseClient:
        await self._open()
        deadline = time.monotonic() + self.connect_timeout_s

        async def probe() -> bool:
            if not (await self._is_live() and await self._is_ready()):
                raise self._not_ready()
            return True

        await self._call(self.model, probe, deadline=deadline, retry=core.until_deadline(self.retry))
        if self.check_model:
            try:
                await self.model_info(self.model)
            except ModelNotFoundError as e:
                raise self._unknown_model(None) from e
        return self

    async def close(self) -> None:
        self._pin.stop.set()  # no follower is started after this
        try:
            await self._stop_following()
        finally:
            await self._close()

    async def __aenter__(self: T) -> T:
        try:
            return await self.connect()  # type: ignore[attr-defined,no-any-return]
        except BaseException:  # `async with` calls no __aexit__ when entering fails
            await self.close()  # type: ignore[attr-defined]
            raise

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- public API -----------------------------------------------------------------------------
    async def health(self) -> dict[str, bool]:
        try:
            return {"live": await self._is_live(), "ready": await self._is_ready()}
        except Exception as e:  # noqa: BLE001
            err = core.classify(e, model=self.model, protocol=self.protocol)
            if isinstance(err, ServerUnavailableError):
                return {"live": False, "ready": False}
            raise err from e

    async def model_info(self, model: str) -> ModelInfo:
        if model in self._infos:
            return self._infos[model]
        deadline = time.monotonic() + self.timeout_s
        info = await self._call(model, lambda: self._within(self._describe(model), self._remaining(deadline)),
                                deadline=deadline)
        return self._remember(model, info)

    async def embed(self, texts: Sequence[str | bytes], *, timeout_s: float | None = None) -> np.ndarray[Any, Any]:
        info = await self.model_info(self.model)
        arrays, output = self._embed_request(info, texts)
        return (await self._batched(self.model, arrays, [output], info.max_batch_size, timeout_s))[output]

    async def embed_counted(
        self, texts: Sequence[str | bytes], *, timeout_s: float | None = None, headers: Mapping[str, str] | None = None,
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """The embeddings and each text's token count (the text model's ``tokens`` output): what the
        OpenAI gateway reports as usage. ``headers`` go with this call's requests only."""
        info = await self.model_info(self.model)
        arrays, output = self._embed_request(info, texts)
        counts = modelinfo.check_output(info, TOKENS_OUTPUT, protocol=self.protocol, url=self.url)
        out = await self._batched(self.model, arrays, [output, counts], info.max_batch_size, timeout_s, headers)
        return out[output], out[counts].reshape(-1)

    async def classify(self, texts: Sequence[str | bytes], *, timeout_s: float | None = None) -> list[Classification]:
        info = await self.model_info(self.model)
        arrays, outputs, logits = self._classify_request(info, texts)
        out = await self._batched(self.model, arrays, outputs, info.max_batch_size, timeout_s)
        return modelinfo.classifications(out, logits)

    async def rerank(
        self, query: str | bytes, passages: Sequence[str | bytes], *, timeout_s: float | None = None
    ) -> np.ndarray[Any, Any]:
        info = await self.model_info(self.model)
        arrays, outputs = self._rerank_request(info, query, passages)
        out = await self._batched(self.model, arrays, outputs, info.max_batch_size, timeout_s)
        return out[SCORE_OUTPUT].reshape(-1).astype(np.float32, copy=False)

    async def embed_tokens(
        self, ids: Sequence[Sequence[int]] | np.ndarray[Any, Any], mask: Sequence[Sequence[int]] | np.ndarray[Any, Any] | None = None,
        *, timeout_s: float | None = None, headers: Mapping[str, str] | None = None, version: str | None = None,
    ) -> np.ndarray[Any, Any]:
        """The token model's embeddings of ``ids``, from its ``version``, or (None) from the version the
        text model's ensemble pins, as :meth:`HttpClient.embed_tokens <tritonbundle.clients.HttpClient.embed_tokens>`."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        info = await self.model_info(self.token_model)
        arrays, output = self._token_request(info, ids, mask)

        async def send(named: str) -> np.ndarray[Any, Any]:
            left = self._remaining(deadline)
            return (await self._batched(self.token_model, arrays, [output], info.max_batch_size, left, headers,
                                        named))[output]

        if version is not None:
            return await send(version)
        named = await self._pinned(deadline)
        try:
            return await send(named)
        except ModelNotFoundError:
            if not named:
                raise
            await pin.await_read(self._pin, time.monotonic(), max(0.0, deadline - time.monotonic()))
            if self._pin.version == named:
                raise
        return await send(self._pin.version)

    async def _pinned(self, deadline: float) -> str:
        """The pinned version (pin.py), followed by a task of this event loop from the first call on, which
        waits for the first read; a task of a loop that has ended (``asyncio.run`` again) is started anew."""
        loop, task = asyncio.get_running_loop(), self._pin_task
        idle = self._pin.final or self._pin.stop.is_set()
        if not idle and (task is None or task.done() or task.get_loop() is not loop):
            await self._stop_following()
            self._pin_answered = asyncio.Event()
            self._pin_task = loop.create_task(pin.afollow(weakref.ref(self), self._pin, self._pin_answered))
        if self._pin_answered is not None and not self._pin_answered.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._pin_answered.wait(), max(1e-3, deadline - time.monotonic()))
        return self._pin.version

    async def _stop_following(self) -> None:
        """Cancel the pin's task: awaited in its own loop, handed to its loop where that one runs elsewhere,
        left alone where its loop has closed (cancelling there raises)."""
        task, self._pin_task = self._pin_task, None
        if task is None or task.done() or task.get_loop().is_closed():
            return
        if task.get_loop() is asyncio.get_running_loop():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        else:
            task.get_loop().call_soon_threadsafe(task.cancel)

    async def infer(
        self, inputs: Mapping[str, np.ndarray[Any, Any]], *, model: str | None = None, outputs: Sequence[str] | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, np.ndarray[Any, Any]]:
        """Any model, any tensors: the named ``outputs``, or every output the model returns."""
        model = model or self.model
        if self.check_model:
            await self.model_info(model)
        names = list(outputs or ())
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        return await self._call(model, lambda: self._infer(model, inputs, names, self._remaining(deadline)),
                                deadline=deadline)

    # -- internals ------------------------------------------------------------------------------
    async def _batched(
        self, model: str, arrays: Mapping[str, np.ndarray[Any, Any]], outputs: Sequence[str], max_batch_size: int,
        timeout_s: float | None, headers: Mapping[str, str] | None = None, version: str = "",
    ) -> dict[str, np.ndarray[Any, Any]]:
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        n = next(iter(arrays.values())).shape[0]

        # The HTTP client refuses calls past its window (max_in_flight): one call's chunks take half of it at
        # most, so a large input is not refused by its own chunks. gRPC has no window: GRPC_CHUNKS_AT_ONCE.
        window = getattr(self, "max_in_flight", 0)
        room = asyncio.Semaphore(max(1, window // 2) if window else GRPC_CHUNKS_AT_ONCE)

        async def one(rows: slice) -> dict[str, np.ndarray[Any, Any]]:
            part = {k: v[rows] for k, v in arrays.items()}
            async with room:
                return await self._call(
                    model, lambda: self._infer(model, part, outputs, self._remaining(deadline), headers, version),
                    deadline=deadline,
                )

        tasks = [asyncio.ensure_future(one(rows)) for rows in core.chunks(n, max_batch_size)]
        try:
            parts = await asyncio.gather(*tasks)
        except BaseException:  # the call has failed: its other chunks are not left running
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        return {name: np.concatenate([p[name] for p in parts], axis=0) for name in outputs}

    async def _call(
        self, model: str, fn: Callable[[], Awaitable[T]], *, deadline: float, retry: RetryPolicy | None = None
    ) -> T:
        delays = itertools.chain((retry or self.retry).delays(self._rng), [None])
        attempts = 0
        while True:
            attempts += 1
            try:
                return await fn()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001
                delay = next(delays)
                final = self._retry_or_raise(e, model, attempts, delay, deadline)
                if final is not None:
                    raise final from e
                await asyncio.sleep(delay or 0.0)


class AsyncHttpClient(_AsyncBaseClient):
    """asyncio HTTP client. At most ``max_in_flight`` calls are in flight (default 64); one more is
    refused at once with :class:`ClientBusyError`, as the server refuses overload, instead of
    waiting in the connection pool's queue where neither its deadline nor the server's metrics see
    it (at 200 req/s against a saturated server, a third of the calls used to wait out their 30 s)."""

    protocol = "http"

    def __init__(self, url: str, *, max_in_flight: int = 64, **options: Any) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        super().__init__(url, **options)
        self.max_in_flight = max_in_flight
        self._in_flight = 0

    async def _open(self) -> None:
        import tritonclient.http.aio as aiohttpclient

        # One connection per call in flight: the pool never queues what the window admitted. No session
        # timeout (conn_timeout is aiohttp's total for every call): each call is bounded by its own deadline.
        self._client = aiohttpclient.InferenceServerClient(
            self.url, conn_limit=max(self.pool_size, self.max_in_flight), conn_timeout=None
        )

    async def _config_json(self, model: str) -> dict[str, Any]:
        return dict(await self._within(self._client.get_model_config(model, headers=self.headers), self.timeout_s))

    async def _describe(self, model: str) -> ModelInfo:
        metadata = await self._client.get_model_metadata(model, headers=self.headers)
        config = await self._client.get_model_config(model, headers=self.headers)
        return modelinfo.model_info(metadata, config)

    async def _infer(
        self, model: str, arrays: Mapping[str, np.ndarray[Any, Any]], outputs: Sequence[str], timeout_s: float,
        headers: Mapping[str, str] | None = None, version: str = "",
    ) -> dict[str, np.ndarray[Any, Any]]:
        inputs, requested = http_tensors(arrays, outputs)
        if self._in_flight >= self.max_in_flight:
            raise ClientBusyError(
                f"model {model!r} over http: {self._in_flight} calls already in flight (max_in_flight="
                f"{self.max_in_flight}): refused without sending; the server is not keeping up",
                model=model, protocol="http", status="RESOURCE_EXHAUSTED")
        self._in_flight += 1
        try:
            result = await asyncio.wait_for(
                self._client.infer(model, inputs, model_version=version, outputs=requested or None,
                                   timeout=core.server_timeout_us(timeout_s),
                                   headers={**self._request_headers(), **(headers or {})}),
                timeout=timeout_s,
            )
        except asyncio.TimeoutError as e:
            raise self._deadline_error(model, timeout_s) from e
        finally:
            self._in_flight -= 1
        return self._outputs(result, outputs, model)


class AsyncGrpcClient(_AsyncBaseClient):
    protocol = "grpc"

    async def _open(self) -> None:
        import tritonclient.grpc.aio as aiogrpcclient

        self._client = aiogrpcclient.InferenceServerClient(self.url)

    async def _config_json(self, model: str) -> dict[str, Any]:
        config = await self._within(self._client.get_model_config(model, headers=self.headers, as_json=True), self.timeout_s)
        return dict(config["config"])

    async def model_config(self, model: str) -> dict[str, Any]:
        """``model``'s configuration as Triton serves it now (JSON; never cached, unlike :meth:`model_info`)."""
        return await self._config_json(model)

    async def _describe(self, model: str) -> ModelInfo:
        metadata = await self._client.get_model_metadata(model, headers=self.headers, as_json=True)
        config = await self._client.get_model_config(model, headers=self.headers, as_json=True)
        return modelinfo.model_info(metadata, config)

    async def _infer(
        self, model: str, arrays: Mapping[str, np.ndarray[Any, Any]], outputs: Sequence[str], timeout_s: float,
        headers: Mapping[str, str] | None = None, version: str = "",
    ) -> dict[str, np.ndarray[Any, Any]]:
        inputs, requested = grpc_tensors(arrays, outputs)
        result = await self._client.infer(
            model, inputs, model_version=version, outputs=requested or None, client_timeout=timeout_s,
            timeout=core.server_timeout_us(timeout_s),
            headers={**self._request_headers(), **(headers or {})},
        )
        return self._outputs(result, outputs, model)


def grpc_tensors(arrays: Mapping[str, np.ndarray[Any, Any]], outputs: Sequence[str]) -> tuple[list[Any], list[Any]]:
    """tritonclient's gRPC ``InferInput``s holding ``arrays`` and ``InferRequestedOutput``s for ``outputs``:
    what :class:`AsyncGrpcClient` sends, and what the load generator's requests on the wire are built from
    (:mod:`tritonbundle.measure.wire`)."""
    import tritonclient.grpc.aio as aiogrpcclient
    from tritonclient.utils import np_to_triton_dtype

    inputs = []
    for name, array in arrays.items():
        inp = aiogrpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        inp.set_data_from_numpy(array)
        inputs.append(inp)
    return inputs, [aiogrpcclient.InferRequestedOutput(name) for name in outputs]


def http_tensors(arrays: Mapping[str, np.ndarray[Any, Any]], outputs: Sequence[str]) -> tuple[list[Any], list[Any]]:
    """tritonclient's HTTP ``InferInput``s holding ``arrays`` as binary data and ``InferRequestedOutput``s
    (binary) for ``outputs``: what :class:`AsyncHttpClient` sends, and what the load generator's HTTP
    requests on the wire are built from (:mod:`tritonbundle.measure.wire`)."""
    import tritonclient.http.aio as aiohttpclient
    from tritonclient.utils import np_to_triton_dtype

    inputs = []
    for name, array in arrays.items():
        inp = aiohttpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        inp.set_data_from_numpy(array, binary_data=True)
        inputs.append(inp)
    return inputs, [aiohttpclient.InferRequestedOutput(name, binary_data=True) for name in outputs]


async def aconnect(url: str, *, protocol: str = "http", **options: Any) -> _AsyncBaseClient:
    """A connected asyncio client for ``protocol`` ("http" or "grpc")."""
    if protocol not in core.PROTOCOLS:
        raise ValueError(f"protocol must be one of {core.PROTOCOLS}, not {protocol!r}")
    cls = AsyncHttpClient if protocol == "http" else AsyncGrpcClient
    client = cls(url, **options)
    try:
        return await client.connect()
    except BaseException:
        await client.close()
        raise
