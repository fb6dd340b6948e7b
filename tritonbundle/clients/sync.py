"""Blocking clients: :class:`HttpClient` (binary tensors over HTTP/REST) and :class:`GrpcClient`.

Both sit on ``tritonclient`` and behave the same::

    from tritonbundle.clients import HttpClient

    with HttpClient("127.0.0.1:8000", model="minilm", timeout_s=5) as client:
        vectors = client.embed(["a sentence", "another one"])   # float32 [2, 384]

    with HttpClient("127.0.0.1:8000", model="mlp") as client:
        outputs = client.infer({"features": features})          # {"logits": float32 [N, 4]}

On connect the client checks that the server is live and ready and that the model exists; each
method checks that the model's task and tensors are what it sends and reads (``embed`` on a tensor
model names ``infer`` instead). Each call has a deadline (``timeout_s``) that bounds the
transport and is passed to Triton as the request's server-side timeout; calls are retried with
jittered exponential backoff only when that is safe (see :class:`RetryPolicy`). Inputs larger than
the model's ``max_batch_size`` are split and the results put back together in order.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from tritonbundle.clients import core, modelinfo, pin
from tritonbundle.clients.core import RetryPolicy
from tritonbundle.clients.modelinfo import Classification, ModelInfo
from tritonbundle.contract import PIN_SETTLE_S, SCORE_OUTPUT
from tritonbundle.errors import ClientError, ModelNotFoundError, ServerUnavailableError

T = TypeVar("T")


class _BaseClient(core.ClientBase):
    _client: Any  # the protocol's tritonclient InferenceServerClient, set by _open()

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self._lock = threading.Lock()
        self._closed = False
        self._connected = False

    # -- transport hooks (per protocol) ---------------------------------------------------------
    def _open(self) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError

    def _is_live(self) -> bool:
        raise NotImplementedError

    def _is_ready(self) -> bool:
        raise NotImplementedError

    def _describe(self, model: str) -> ModelInfo:
        raise NotImplementedError

    def _index(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _infer(
        self, model: str, arrays: Mapping[str, np.ndarray[Any, Any]], outputs: Sequence[str], timeout_s: float,
        version: str = "",
    ) -> dict[str, np.ndarray[Any, Any]]:
        raise NotImplementedError

    # -- lifecycle --------------------------------------------------------------------------------
    def connect(self, *, wait: bool = True) -> _BaseClient:
        """Open connections, wait (up to ``connect_timeout_s``) for a live, ready server, and check
        the model; raise :class:`MetadataMismatchError` when it is not what this client expects. With
        ``wait=False`` only open them (health checks: a server that is down is the answer, not an error)."""
        if self._connected:  # `with connect(...) as c:` enters a client connect() already opened
            return self
        self._open()
        self._connected = True
        if not wait:
            return self
        deadline = time.monotonic() + self.connect_timeout_s

        def probe() -> bool:
            if not (self._is_live() and self._is_ready()):
                raise self._not_ready()
            return True

        self._call(self.model, probe, deadline=deadline, retry=core.until_deadline(self.retry))
        if self.check_model:
            try:
                self.model_info(self.model)
            except ModelNotFoundError as e:
                raise self._unknown_model(self._safe_model_names()) from e
        return self

    def _safe_model_names(self) -> list[str] | None:
        try:
            return sorted(str(m["name"]) for m in self._index())
        except Exception:  # noqa: BLE001 - the index API may be restricted
            return None

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._pin.stop.set()
            self._close()

    def __enter__(self: T) -> T:
        try:
            return self.connect()  # type: ignore[attr-defined,no-any-return]
        except BaseException:  # `with` calls no __exit__ when entering fails
            self.close()  # type: ignore[attr-defined]
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- public API -------------------------------------------------------------------------------
    def health(self) -> dict[str, bool]:
        try:
            return {"live": self._is_live(), "ready": self._is_ready()}
        except Exception as e:  # noqa: BLE001
            err = core.classify(e, model=self.model, protocol=self.protocol)
            if isinstance(err, ServerUnavailableError):
                return {"live": False, "ready": False}
            raise err from e

    def models(self) -> list[dict[str, Any]]:
        """Every model in the repository: name, version, state, max batch size, batching settings."""
        rows = []
        for entry in self._call("(repository)", self._index, deadline=time.monotonic() + self.timeout_s):
            row = {"name": entry.get("name"), "version": entry.get("version"), "state": entry.get("state"),
                   "reason": entry.get("reason", "")}
            if entry.get("state") == "READY":
                try:
                    cfg = self._config_json(entry["name"])
                    row["max_batch_size"] = int(cfg.get("max_batch_size", 0) or 0)
                    row["batching"] = core.batching_summary(cfg)
                    row["platform"] = cfg.get("platform") or cfg.get("backend")
                except ClientError:
                    pass
            rows.append(row)
        return rows

    def load_model(self, model: str, *, timeout_s: float | None = None) -> None:
        """Load (or reload: a new version) ``model`` with explicit model control. Restricted API:
        needs the server's key (``api_key``). In-flight requests on the old version finish first."""
        seconds = timeout_s or max(self.timeout_s, 120.0)
        self._call(model, lambda: self._load(model, seconds), deadline=time.monotonic() + seconds, retry=core.NO_RETRY)
        with self._lock:
            self._infos.pop(model, None)

    def unload_model(self, model: str) -> None:
        self._call(model, lambda: self._unload(model, self.timeout_s), deadline=time.monotonic() + self.timeout_s,
                   retry=core.NO_RETRY)
        with self._lock:
            self._infos.pop(model, None)

    def _load(self, model: str, timeout_s: float) -> None:
        raise NotImplementedError

    def _unload(self, model: str, timeout_s: float) -> None:
        raise NotImplementedError

    def model_info(self, model: str) -> ModelInfo:
        with self._lock:
            if model in self._infos:
                return self._infos[model]
        info = self._call(model, lambda: self._describe(model), deadline=time.monotonic() + self.timeout_s)
        with self._lock:
            return self._remember(model, info)

    def embed(self, texts: Sequence[str | bytes], *, timeout_s: float | None = None) -> np.ndarray[Any, Any]:
        """Embed texts through the server-side ensemble (tokenizer + encoder). Returns [N, dim].

        Raises :class:`MetadataMismatchError` (naming the method to use) for a model of another task."""
        info = self.model_info(self.model)
        arrays, output = self._embed_request(info, texts)
        return self._batched(self.model, arrays, [output], info.max_batch_size, timeout_s)[output]

    def classify(self, texts: Sequence[str | bytes], *, timeout_s: float | None = None) -> list[Classification]:
        """Classify texts with a text-classification model: one :class:`Classification` (label, its
        probability, the logits) per text, in order."""
        info = self.model_info(self.model)
        arrays, outputs, logits = self._classify_request(info, texts)
        return modelinfo.classifications(self._batched(self.model, arrays, outputs, info.max_batch_size, timeout_s), logits)

    def rerank(self, query: str | bytes, passages: Sequence[str | bytes], *, timeout_s: float | None = None) -> np.ndarray[Any, Any]:
        """Score each passage's relevance to ``query`` with a text-pair model (a cross-encoder): float32
        [len(passages)], in the passages' order (sort them yourself: ``np.argsort(-scores)``)."""
        info = self.model_info(self.model)
        arrays, outputs = self._rerank_request(info, query, passages)
        out = self._batched(self.model, arrays, outputs, info.max_batch_size, timeout_s)
        return out[SCORE_OUTPUT].reshape(-1).astype(np.float32, copy=False)

    def embed_tokens(
        self, ids: Sequence[Sequence[int]] | np.ndarray[Any, Any], mask: Sequence[Sequence[int]] | np.ndarray[Any, Any] | None = None,
        *, timeout_s: float | None = None, version: str | None = None,
    ) -> np.ndarray[Any, Any]:
        """Embed pre-tokenized rows with the encoder model directly.

        Rows are padded to the repository's padding targets (the build stage's plan, read from the
        model config) so that requests meet in the dynamic batcher. ``version``: that version of the
        encoder; by default (None) the version the text model's ensemble pins, so that a release's
        candidate does not answer (:mod:`tritonbundle.clients.pin`, docs/releases.md)."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        info = self.model_info(self.token_model)
        arrays, output = self._token_request(info, ids, mask)

        def send(named: str) -> np.ndarray[Any, Any]:
            left = self._remaining(deadline)
            return self._batched(self.token_model, arrays, [output], info.max_batch_size, left, named)[output]

        if version is not None:
            return send(version)
        if self._pin.start():
            pin.follow(self, self._pin)
        self._pin.first.wait(max(0.0, deadline - time.monotonic()))
        named = self._pin.version
        try:
            return send(named)
        except ModelNotFoundError:
            if not named:
                raise
            pin.wait_for_read(self._pin, time.monotonic(), max(0.0, deadline - time.monotonic()))
            if self._pin.version == named:
                raise
        return send(self._pin.version)

    def _pin_config(self) -> dict[str, Any]:
        """The text model's configuration for the pin's thread (pin.follow), bounded by about PIN_SETTLE_S."""
        raise NotImplementedError

    def infer(
        self, inputs: Mapping[str, np.ndarray[Any, Any]], *, model: str | None = None, outputs: Sequence[str] | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, np.ndarray[Any, Any]]:
        """Any model, any tensors: one request (no splitting), with deadline and retries. Returns the
        named ``outputs``, or every output the model returns when none are named."""
        model = model or self.model
        if self.check_model:
            self.model_info(model)  # an unknown model fails here, naming the models there are
        names = list(outputs or ())
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        return self._call(
            model, lambda: self._infer(model, inputs, names, self._remaining(deadline)), deadline=deadline
        )

    # -- internals ------------------------------------------------------------------------------
    def _batched(
        self, model: str, arrays: Mapping[str, np.ndarray[Any, Any]], outputs: Sequence[str], max_batch_size: int,
        timeout_s: float | None, version: str = "",
    ) -> dict[str, np.ndarray[Any, Any]]:
        """Send the rows in chunks of at most ``max_batch_size``, one after another, to ``model`` (its
        ``version``: "" the newest); each output's chunks put back together in order."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        n = next(iter(arrays.values())).shape[0]
        parts = []
        for rows in core.chunks(n, max_batch_size):
            part = {k: v[rows] for k, v in arrays.items()}
            def request(part: Mapping[str, np.ndarray[Any, Any]] = part) -> dict[str, np.ndarray[Any, Any]]:
                return self._infer(model, part, outputs, self._remaining(deadline), version)

            parts.append(self._call(model, request, deadline=deadline))
        return {name: np.concatenate([p[name] for p in parts], axis=0) for name in outputs}

    def _call(self, model: str, fn: Callable[[], T], *, deadline: float, retry: RetryPolicy | None = None) -> T:
        """Run ``fn`` with retries on safe errors, never past ``deadline``."""
        delays = itertools.chain((retry or self.retry).delays(self._rng), [None])
        attempts = 0
        while True:
            attempts += 1
            try:
                return fn()
            except Exception as e:  # noqa: BLE001 - classified below
                delay = next(delays)
                final = self._retry_or_raise(e, model, attempts, delay, deadline)
                if final is not None:
                    raise final from e
                time.sleep(delay or 0.0)

    def _config_json(self, model: str) -> dict[str, Any]:
        raise NotImplementedError

class HttpClient(_BaseClient):
    """HTTP/REST client; tensors travel as binary data, not JSON.

    Safe to share between threads: tritonclient's HTTP client runs on geventhttpclient, whose
    connections belong to the gevent hub of the thread that made them (used from another thread,
    calls failed, hung to their deadline, or came back corrupted), so each thread gets its own
    connection pool, made on its first call and closed with the client; a pool whose thread has
    ended is closed when the next one is made. Each thread that calls also keeps gevent's hub
    (an event loop, two file descriptors) until the process ends: call from long-lived threads
    (a thread pool), not from a new thread per request.

    A pool's socket timeout bounds each wait for the server, so a call with a longer deadline than
    ``timeout_s`` (a per-call ``timeout_s``, a model load) gets a pool whose timeout covers it.
    """

    protocol = "http"

    def _open(self) -> None:
        self._pin_http = pin.PlainHttp(self.url)  # the pin thread's (_pin_config)
        self._local = threading.local()
        self._pools: list[tuple[threading.Thread, Any]] = []
        self._pools_lock = threading.Lock()

    @property
    def _client(self) -> Any:
        return self._pool(self.timeout_s)

    def _pool(self, timeout_s: float) -> Any:
        """This thread's pool whose socket timeout covers a call of ``timeout_s`` (the time a call has
        left): the client's own, else the next power of two seconds, so a long call's chunks and retries
        share one pool whatever is left of its deadline."""
        seconds = self.timeout_s if timeout_s <= self.timeout_s else float(2 ** math.ceil(math.log2(timeout_s)))
        pools: dict[float, Any] = self._local.__dict__.setdefault("pools", {})
        pool = pools.get(seconds)
        if pool is None:
            import tritonclient.http as httpclient

            pool = httpclient.InferenceServerClient(
                self.url, concurrency=self.pool_size, connection_timeout=self.connect_timeout_s,
                network_timeout=seconds + 5.0, verbose=self.verbose,
            )
            pools[seconds] = pool
            with self._pools_lock:
                ended = [p for thread, p in self._pools if not thread.is_alive()]
                self._pools = [(t, p) for t, p in self._pools if t.is_alive()] + [(threading.current_thread(), pool)]
            self._close_pools(ended)
        return pool

    def _close(self) -> None:
        with self._pools_lock:
            pools, self._pools = [p for _, p in getattr(self, "_pools", [])], []
        self._close_pools(pools)
        if hasattr(self, "_pin_http"):
            self._pin_http.close()

    @staticmethod
    def _close_pools(pools: list[Any]) -> None:
        for pool in pools:
            with contextlib.suppress(Exception):  # another thread's pool: its hub may be gone
                pool.close()

    def _load(self, model: str, timeout_s: float) -> None:
        self._pool(timeout_s).load_model(model, headers=self._restricted_headers())

    def _unload(self, model: str, timeout_s: float) -> None:
        self._pool(timeout_s).unload_model(model, headers=self._restricted_headers())

    def _is_live(self) -> bool:
        return bool(self._client.is_server_live(headers=self.headers))

    def _is_ready(self) -> bool:
        return bool(self._client.is_server_ready(headers=self.headers))

    def _config_json(self, model: str) -> dict[str, Any]:
        return self._call(model, lambda: self._client.get_model_config(model, headers=self.headers),
                          deadline=time.monotonic() + self.timeout_s)

    def _pin_config(self) -> dict[str, Any]:
        """On the pin thread's own plain HTTP connection (pin.PlainHttp), not a pool."""
        return self._pin_http.config(self.model, self.headers)

    def _describe(self, model: str) -> ModelInfo:
        metadata = self._client.get_model_metadata(model, headers=self.headers)
        config = self._client.get_model_config(model, headers=self.headers)
        return modelinfo.model_info(metadata, config)

    def _index(self) -> list[dict[str, Any]]:
        return list(self._client.get_model_repository_index(headers=self._restricted_headers()))

    def _infer(
        self, model: str, arrays: Mapping[str, np.ndarray[Any, Any]], outputs: Sequence[str], timeout_s: float,
        version: str = "",
    ) -> dict[str, np.ndarray[Any, Any]]:
        import tritonclient.http as httpclient
        from tritonclient.utils import InferenceServerException, np_to_triton_dtype

        from tritonbundle.clients.shm import SharedMemoryInputs

        inputs = []
        for name, array in arrays.items():
            inp = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            inputs.append(inp)
        requested = [httpclient.InferRequestedOutput(name, binary_data=True) for name in outputs]
        with SharedMemoryInputs.maybe(self, inputs, arrays) as shm:
            if shm is None:
                for inp, array in zip(inputs, arrays.values()):
                    inp.set_data_from_numpy(array, binary_data=True)
            pending = self._pool(timeout_s).async_infer(
                model, inputs, model_version=version, outputs=requested or None, timeout=core.server_timeout_us(timeout_s),
                headers=self._request_headers(),
            )
            try:
                result = pending.get_result(block=True, timeout=timeout_s)
            except InferenceServerException as e:
                if "failed to obtain inference response" in (e.message() or ""):
                    raise self._deadline_error(model, timeout_s) from e
                raise
            return self._outputs(result, outputs, model)


class GrpcClient(_BaseClient):
    """gRPC client; ``pool_size`` channels are used round-robin (gRPC multiplexes each one)."""

    protocol = "grpc"

    def _open(self) -> None:
        import tritonclient.grpc as grpcclient

        self._clients = [
            grpcclient.InferenceServerClient(self.url, verbose=self.verbose) for _ in range(self.pool_size)
        ]
        self._next = itertools.cycle(self._clients)
        self._client = self._clients[0]

    def _close(self) -> None:
        for client in getattr(self, "_clients", []):
            client.close()

    def _is_live(self) -> bool:
        return bool(self._client.is_server_live(headers=self.headers, client_timeout=self.connect_timeout_s))

    def _is_ready(self) -> bool:
        return bool(self._client.is_server_ready(headers=self.headers, client_timeout=self.connect_timeout_s))

    def _config_json(self, model: str, retry: RetryPolicy | None = None, timeout_s: float | None = None) -> dict[str, Any]:
        seconds = timeout_s or self.timeout_s
        return self._call(
            model, lambda: self._client.get_model_config(model, headers=self.headers, as_json=True,
                                                         client_timeout=seconds)["config"],
            deadline=time.monotonic() + seconds, retry=retry,
        )

    def _pin_config(self) -> dict[str, Any]:
        """The text model's configuration for the pin's thread: no retries, bounded by the release's settle time."""
        return self._config_json(self.model, core.NO_RETRY, PIN_SETTLE_S)

    def _describe(self, model: str) -> ModelInfo:
        metadata = self._client.get_model_metadata(model, headers=self.headers, as_json=True, client_timeout=self.timeout_s)
        config = self._client.get_model_config(model, headers=self.headers, as_json=True, client_timeout=self.timeout_s)
        return modelinfo.model_info(metadata, config)

    def _index(self) -> list[dict[str, Any]]:
        index = self._client.get_model_repository_index(headers=self._restricted_headers(), as_json=True,
                                                        client_timeout=self.timeout_s)
        return list(index.get("models", []))

    def _load(self, model: str, timeout_s: float) -> None:
        self._client.load_model(model, headers=self._restricted_headers(), client_timeout=timeout_s)

    def _unload(self, model: str, timeout_s: float) -> None:
        self._client.unload_model(model, headers=self._restricted_headers(), client_timeout=timeout_s)

    def _infer(
        self, model: str, arrays: Mapping[str, np.ndarray[Any, Any]], outputs: Sequence[str], timeout_s: float,
        version: str = "",
    ) -> dict[str, np.ndarray[Any, Any]]:
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import np_to_triton_dtype

        from tritonbundle.clients.shm import SharedMemoryInputs

        inputs = [grpcclient.InferInput(n, list(a.shape), np_to_triton_dtype(a.dtype)) for n, a in arrays.items()]
        requested = [grpcclient.InferRequestedOutput(name) for name in outputs]
        with SharedMemoryInputs.maybe(self, inputs, arrays) as shm:
            if shm is None:
                for inp, array in zip(inputs, arrays.values()):
                    inp.set_data_from_numpy(array)
            with self._lock:
                client = next(self._next)
            result = client.infer(
                model, inputs, model_version=version, outputs=requested or None, client_timeout=timeout_s,
                timeout=core.server_timeout_us(timeout_s), headers=self._request_headers(),
            )
        return self._outputs(result, outputs, model)


def connect(url: str, *, protocol: str = "http", wait: bool = True, **options: Any) -> _BaseClient:
    """A connected client for ``protocol`` ("http" or "grpc"); use it as a context manager. ``wait``:
    see :meth:`_BaseClient.connect`."""
    if protocol not in core.PROTOCOLS:
        raise ValueError(f"protocol must be one of {core.PROTOCOLS}, not {protocol!r}")
    cls = HttpClient if protocol == "http" else GrpcClient
    client = cls(url, **options)
    try:
        return client.connect(wait=wait)
    except BaseException:
        client.close()
        raise
