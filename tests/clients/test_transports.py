"""The clients over real sockets, against stand-in servers on 127.0.0.1 (stdlib HTTP; a gRPC server that
never answers): the timeouts the transports themselves impose (aiohttp's session total, geventhttpclient's
socket timeout, grpc's none), a large async call's fan-out, a dropped connection, and clients that fail to
connect. tritonserver itself: test_clients.py and test_any_model.py."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tritonbundle.clients import AsyncGrpcClient, AsyncHttpClient, GrpcClient, HttpClient
from tritonbundle.clients.core import text_array
from tritonbundle.errors import ClientError, ConfigError, DeadlineExceededError, ServerUnavailableError
from tritonbundle.proc import free_port

pytestmark = pytest.mark.timeout(60)


class Triton(BaseHTTPRequestHandler):
    """Model ``m``: a text-embedding model (TEXT -> embedding [N, 2]) of ``max_batch`` rows; each
    inference waits ``delay`` s; the next ``drop`` ones close the connection unanswered."""

    protocol_version = "HTTP/1.1"
    delay, drop, max_batch, load_delay = 0.0, 0, 4, 0.0
    in_flight = most_in_flight = 0
    lock = threading.Lock()

    def log_message(self, *args: object) -> None:
        pass

    def _json(self, body: object, code: int = 200) -> None:
        raw = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path = self.path.split("?")[0]
        if path.startswith("/v2/health/"):
            self._json({})
        elif path == "/v2/models/m":
            self._json({"name": "m", "versions": ["1"], "platform": "ensemble",
                        "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [-1, 1]}],
                        "outputs": [{"name": "embedding", "datatype": "FP32", "shape": [-1, 2]}]})
        elif path == "/v2/models/m/config":
            self._json({"name": "m", "max_batch_size": self.max_batch, "parameters": {"task": {"string_value": "text-embedding"}}})
        else:
            self._json({"error": "Request for unknown model: not found"}, 400)

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path.endswith("/load"):
            time.sleep(Triton.load_delay)
            self._json({})
            return
        with Triton.lock:
            if Triton.drop > 0:
                Triton.drop -= 1
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            Triton.in_flight += 1
            Triton.most_in_flight = max(Triton.most_in_flight, Triton.in_flight)
        try:
            time.sleep(Triton.delay)
            size = self.headers.get("Inference-Header-Content-Length")
            rows = json.loads(body[: int(size)] if size else body)["inputs"][0]["shape"][0]
            self._json({"model_name": "m", "outputs": [{"name": "embedding", "datatype": "FP32", "shape": [rows, 2],
                                                        "data": [1.0] * rows * 2}]})
        finally:
            with Triton.lock:
                Triton.in_flight -= 1


@pytest.fixture
def http_url() -> Iterator[str]:
    Triton.delay, Triton.drop, Triton.max_batch, Triton.load_delay = 0.0, 0, 4, 0.0
    Triton.in_flight = Triton.most_in_flight = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), Triton)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_an_async_call_may_take_longer_than_the_connect_timeout(http_url: str) -> None:
    """aiohttp's session timeout (tritonclient's conn_timeout) is one total for every call: it cut each
    inference at connect_timeout_s."""
    Triton.delay = 1.5

    async def embed() -> Any:
        async with AsyncHttpClient(http_url, model="m", timeout_s=10, connect_timeout_s=0.5) as client:
            return await client.embed(["a"])

    assert asyncio.run(embed()).shape == (1, 2)


def test_a_large_async_call_keeps_its_chunks_within_the_clients_room(http_url: str) -> None:
    """300 texts in chunks of 4 are 75 requests: all at once they overflowed max_in_flight (64) and the call
    failed with ClientBusyError while its other chunks went on running."""
    Triton.delay = 0.01

    async def embed() -> Any:
        async with AsyncHttpClient(http_url, model="m", max_in_flight=16) as client:
            return await client.embed([f"t{i}" for i in range(300)])

    assert asyncio.run(embed()).shape == (300, 2)
    assert 1 <= Triton.most_in_flight <= 8, Triton.most_in_flight  # the async clients' pool_size


@pytest.mark.parametrize("cls", [HttpClient, AsyncHttpClient])
def test_a_connection_the_server_drops_is_retried(http_url: str, cls: type) -> None:
    """A stale keep-alive connection to a restarted server: aiohttp's ServerDisconnectedError is no OSError."""
    Triton.drop = 1

    async def aembed() -> Any:
        async with AsyncHttpClient(http_url, model="m") as client:
            return await client.embed(["a"])

    if cls is HttpClient:
        with HttpClient(http_url, model="m") as client:
            vectors = client.embed(["a"])
    else:
        vectors = asyncio.run(aembed())
    assert vectors.shape == (1, 2) and Triton.drop == 0


def test_a_blocking_call_may_have_a_longer_deadline_than_the_clients(http_url: str) -> None:
    """geventhttpclient's socket timeout was the client's timeout_s + 5 s: a call given a longer deadline
    (or a model load, 120 s) failed at that."""
    with HttpClient(http_url, model="m", timeout_s=0.2, connect_timeout_s=2) as client:
        Triton.delay = 5.6
        assert client.embed(["a"], timeout_s=10).shape == (1, 2)
        with pytest.raises(DeadlineExceededError):  # and the client's own deadline still holds
            client.embed(["a"])
        # A long call's chunks share one pool, whatever is left of its deadline (keyed by the time left,
        # one pool was made for each second that passed).
        Triton.delay = 0.3
        assert client.embed([f"t{i}" for i in range(40)], timeout_s=20).shape == (40, 2)
        assert len(client._local.pools) <= 3, sorted(client._local.pools)  # 0.2 s, 8 s and 32 s


def test_the_pools_of_threads_that_ended_are_closed(http_url: str) -> None:
    """Each thread gets its own connection pool (geventhttpclient's connections belong to its thread's hub);
    a thread per request used to leave every pool open until the client closed."""
    with HttpClient(http_url, model="m") as client:
        for _ in range(20):
            thread = threading.Thread(target=client.embed, args=(["a"],))
            thread.start()
            thread.join()
        assert len(client._pools) <= 2, len(client._pools)  # this thread's, and the last one's


class _Silent:
    """A gRPC server that accepts every call and never answers."""

    def __enter__(self) -> str:
        import grpc

        class Never(grpc.GenericRpcHandler):
            def service(self, details: Any) -> Any:
                return grpc.unary_unary_rpc_method_handler(lambda request, context: time.sleep(30))

        self.server = grpc.server(futures.ThreadPoolExecutor(8))
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.add_generic_rpc_handlers((Never(),))
        self.server.start()
        return f"127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        self.server.stop(grace=0)


def test_grpc_calls_to_a_server_that_never_answers_end_at_their_deadlines() -> None:
    with _Silent() as url:
        client = GrpcClient(url, model="m", timeout_s=1, connect_timeout_s=1, check_model=False).connect(wait=False)
        try:
            for call in (client.models, lambda: client.load_model("m", timeout_s=1.5), lambda: client.unload_model("m")):
                started = time.monotonic()
                with pytest.raises(DeadlineExceededError):
                    call()
                assert time.monotonic() - started < 5
        finally:
            client.close()

        async def aconnect() -> None:
            async with AsyncGrpcClient(url, model="m", timeout_s=1, connect_timeout_s=1):
                pass

        started = time.monotonic()
        with pytest.raises(ClientError):
            asyncio.run(aconnect())
        assert time.monotonic() - started < 5


@pytest.mark.parametrize("cls", [HttpClient, AsyncHttpClient])
def test_a_client_that_fails_to_connect_in_a_with_block_is_closed(cls: type, monkeypatch: pytest.MonkeyPatch) -> None:
    closed: list[bool] = []
    real = cls.close

    def close(self: Any) -> Any:
        closed.append(True)
        return real(self)

    monkeypatch.setattr(cls, "close", close)
    url = f"127.0.0.1:{free_port()}"  # nothing listens
    with pytest.raises(ServerUnavailableError):
        if cls is HttpClient:
            with HttpClient(url, connect_timeout_s=0.3):
                pass
        else:
            async def enter() -> None:
                async with AsyncHttpClient(url, connect_timeout_s=0.3):
                    pass

            asyncio.run(enter())
    assert closed


def test_an_https_address_is_refused_rather_than_sent_in_the_clear() -> None:
    with pytest.raises(ValueError, match="not TLS"):
        HttpClient("https://triton.example.com", api_key="a-secret-key")


def test_texts_must_be_strings_or_bytes() -> None:
    assert text_array(["é", b"\x00ok", bytearray(b"x")])[:, 0].tolist() == ["é".encode(), b"\x00ok", b"x"]
    with pytest.raises(TypeError, match=r"texts\[1\] is int, not str or bytes"):
        text_array(["ok", 3])
    with pytest.raises(TypeError, match=r"texts\[0\] is NoneType"):
        text_array([None])  # type: ignore[list-item]


def test_infer_names_an_input_file_it_cannot_read(tmp_path: Path) -> None:
    from tritonbundle.cli.client import _infer_tensors

    info = SimpleNamespace(inputs=[SimpleNamespace(name="x", datatype="FP32", shape=[-1, 2])], max_batch_size=4)
    (tmp_path / "bad.json").write_text("[1, 2")
    np.save(tmp_path / "pickled.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    np.savez(tmp_path / "two.npz", a=np.ones(2), b=np.ones(2))

    def infer(**options: Any) -> None:
        args = SimpleNamespace(texts=None, query=None, inputs=None, input=None, random=False, model="m", out=None)
        vars(args).update(options)
        _infer_tensors(args, None, info)

    for options, words in [({"inputs": tmp_path / "missing.npz"}, "--inputs .*missing.npz: not a readable .npz"),
                           ({"inputs": tmp_path / "bad.json"}, "--inputs .*bad.json: not a readable .npz"),
                           ({"input": [f"x={tmp_path / 'bad.json'}"]}, "--input x=.*bad.json: not a readable array"),
                           ({"input": [f"x={tmp_path / 'pickled.npy'}"]}, "--input x=.*pickled.npy: not a readable array"),
                           ({"input": [f"x={tmp_path / 'two.npz'}"]}, "holds several arrays .*--inputs")]:
        with pytest.raises(ConfigError, match=words):
            infer(**options)


def test_a_large_grpc_call_keeps_a_few_chunks_in_flight() -> None:
    """gRPC has no window: a 2,048-text request's 64 chunks went out at once and filled the encoder's
    queue (64) by themselves. The call's own rows, chunk by chunk, with at most GRPC_CHUNKS_AT_ONCE out."""
    from tritonbundle.clients.aio import GRPC_CHUNKS_AT_ONCE

    client = AsyncGrpcClient("127.0.0.1:1", model="m")
    now, most = [0], [0]

    async def infer(model: str, arrays: Any, outputs: Any, timeout_s: float, headers: Any = None, version: str = "") -> Any:
        now[0] += 1
        most[0] = max(most[0], now[0])
        await asyncio.sleep(0.005)
        now[0] -= 1
        return {"out": arrays["ids"] * 2}

    client._infer = infer  # type: ignore[method-assign]
    ids = np.arange(2048).reshape(2048, 1)
    out = asyncio.run(client._batched("m", {"ids": ids}, ["out"], 32, timeout_s=10))
    np.testing.assert_array_equal(out["out"], ids * 2)  # in order, whole
    assert most[0] == GRPC_CHUNKS_AT_ONCE == 4
