"""``embed_tokens`` names the encoder version the text model's ensemble pins (a release loads its
candidate as the newest version beside the pinned one): read on the first call, followed in the
background, never on a later call's path, and a version unloaded meanwhile sent again with the pin read
again. The transport is a double here (the calls made, the versions named, a config read that hangs);
tests/reliability/test_release.py runs it on the real server through a release."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tritonbundle import contract
from tritonbundle.clients import AsyncGrpcClient, GrpcClient, HttpClient
from tritonbundle.clients.pin import ReleasePin
from tritonbundle.errors import DeadlineExceededError, ModelNotFoundError, ServerUnavailableError

#: Long enough for the background to read the pin at least twice (every PIN_REFRESH_S).
TWO_READS_S = 2.5 * contract.PIN_REFRESH_S


class _Server:
    """An encoder serving ``served`` versions behind an ensemble pinned to ``pin`` (-1: none; None: the
    text model is no ensemble). ``hang_s``: how long a config read takes."""

    def __init__(self, served: set[str], pin: int | None) -> None:
        self.served, self.pin, self.reads, self.named = served, pin, 0, []  # type: set[str], int | None, int, list[str]
        self.down, self.hang_s = False, 0.0

    def config(self, model: str) -> dict[str, Any]:
        """Counted once the answer is made (a caller that saw the count change sees the pin it answered)."""
        assert model == "minilm", model  # the text model's, where the pin is
        time.sleep(self.hang_s)
        if self.down:
            self.reads += 1
            raise ServerUnavailableError("the server is restarting")
        steps = [{"model_name": "minilm_tokenizer"}, {"model_name": "minilm_encoder", "model_version": str(self.pin)}]
        answer = {"backend": "python"} if self.pin is None else {"platform": "ensemble",
                                                                 "ensemble_scheduling": {"step": steps}}
        self.reads += 1
        return answer

    def infer(self, model: str, version: str) -> dict[str, np.ndarray[Any, Any]]:
        assert model == "minilm_encoder", model
        self.named.append(version)
        if version and version not in self.served:
            raise ModelNotFoundError(f"Request for unknown model: 'minilm_encoder' version {version} is not found")
        return {"out": np.ones((1, 4), np.float32)}


def _blocking(cls: type, server: _Server, model: str = "minilm") -> Any:
    client = cls("127.0.0.1:1", model=model, token_model="minilm_encoder")
    client.model_info = lambda model: SimpleNamespace(max_batch_size=32)
    client._token_request = lambda info, ids, mask: ({"input_ids": np.asarray(ids)}, "out")
    client._pin_config = lambda: server.config(client.model)
    client._batched = lambda model, arrays, outputs, max_batch, timeout_s, version="": server.infer(model, version)
    client._close = lambda: None
    return client


def _asyncio(server: _Server) -> Any:
    client = AsyncGrpcClient("127.0.0.1:1", model="minilm")

    async def model_info(model: str) -> SimpleNamespace:
        return SimpleNamespace(max_batch_size=32)

    async def config(model: str) -> dict[str, Any]:
        await asyncio.sleep(0.01)  # the callers at the same moment are all waiting meanwhile
        return server.config(model)

    async def batched(model: str, arrays: Any, outputs: Any, max_batch: int, timeout_s: Any, headers: Any = None,
                      version: str = "") -> dict[str, np.ndarray[Any, Any]]:
        return server.infer(model, version)

    async def close() -> None:
        pass

    client.model_info, client._config_json, client._batched, client._close = model_info, config, batched, close
    client._token_request = lambda info, ids, mask: ({"input_ids": np.asarray(ids)}, "out")
    return client


def test_token_rows_name_the_pinned_version_followed_in_the_background() -> None:
    server = _Server({"1", "2"}, pin=1)
    client = _blocking(GrpcClient, server)
    assert server.reads == 0, "nothing is read before a token call"
    client.embed_tokens([[101, 102]])
    client.embed_tokens([[101, 102]])
    assert server.named == ["1", "1"] and server.reads == 1, "the first call waited for the first read"
    server.pin = 2  # a release moved the pin: the calls follow within PIN_REFRESH_S
    time.sleep(TWO_READS_S)
    client.embed_tokens([[101, 102]])
    assert server.named[-1] == "2" and server.reads >= 2
    server.pin = -1  # unpinned again: the newest version, unnamed
    time.sleep(TWO_READS_S)
    client.embed_tokens([[101, 102]], version="1")  # a version named by the caller
    client.embed_tokens([[101, 102]])
    assert server.named[-2:] == ["1", ""]
    client.close()
    time.sleep(TWO_READS_S)  # the thread has seen the stop
    reads = server.reads
    time.sleep(TWO_READS_S)
    assert server.reads == reads, "a closed client reads no more"


def test_a_slow_pin_read_holds_no_call_and_the_first_waits_no_longer_than_its_deadline() -> None:
    server = _Server({"1"}, pin=1)
    client = _blocking(GrpcClient, server)
    server.hang_s = 1.0
    start = time.monotonic()
    with pytest.raises(DeadlineExceededError):
        client.embed_tokens([[101, 102]], timeout_s=0.2)  # the first read takes 1 s: the deadline passes first
    assert time.monotonic() - start < 0.8 and server.named == []
    time.sleep(1.0)  # that read has answered
    server.hang_s = 5.0  # every later read hangs: calls go on with the pin read last
    time.sleep(TWO_READS_S)
    start = time.monotonic()
    for _ in range(5):
        client.embed_tokens([[101, 102]], timeout_s=0.2)
    assert time.monotonic() - start < 0.5 and server.named == ["1"] * 5
    client.close()


def _just_read(server: _Server) -> None:
    """Return right after the background's next read of the pin: the one after it is PIN_REFRESH_S away."""
    reads, end = server.reads, time.monotonic() + 2
    while server.reads == reads and time.monotonic() < end:
        time.sleep(0.002)


def test_a_pinned_version_unloaded_meanwhile_is_sent_again_once_the_pin_was_read_again() -> None:
    """A promotion pins N+1, then unloads N: a call that named N in between waits for the background's next
    read (within its deadline) and is sent again, naming N+1; the call's own path reads nothing."""
    server = _Server({"1", "2"}, pin=1)
    client = _blocking(HttpClient, server)
    client.embed_tokens([[101, 102]])
    _just_read(server)
    server.pin, server.served = 2, {"2"}
    reads = server.reads
    client.embed_tokens([[101, 102]])
    assert server.named == ["1", "1", "2"] and server.reads == reads + 1
    _just_read(server)
    server.served = set()  # read again, the pin says what it said: the refusal is the answer
    with pytest.raises(ModelNotFoundError, match="version 2 is not found"):
        client.embed_tokens([[101, 102]])
    assert server.named[-1] == "2"
    client.close()


def test_the_wait_for_the_pin_after_a_refusal_ends_with_the_calls_deadline() -> None:
    server = _Server({"1", "2"}, pin=1)
    client = _blocking(GrpcClient, server)
    client.embed_tokens([[101, 102]])
    server.hang_s = 3.0
    _just_read(server)  # the background's reads hang from now on
    server.pin, server.served = 2, {"2"}
    start = time.monotonic()
    with pytest.raises(ModelNotFoundError):
        client.embed_tokens([[101, 102]], timeout_s=0.3)
    assert time.monotonic() - start < 0.6 and server.named[-1] == "1"
    client.close()


def test_a_refusal_while_the_pin_reads_fail_is_the_answer_after_the_next_failed_read() -> None:
    server = _Server({"1", "2"}, pin=1)
    client = _blocking(GrpcClient, server)
    client.embed_tokens([[101, 102]])
    server.down, server.served = True, {"2"}  # a restart that came back with version 2 only
    _just_read(server)
    start = time.monotonic()
    with pytest.raises(ModelNotFoundError):
        client.embed_tokens([[101, 102]], timeout_s=10)
    assert time.monotonic() - start < 0.9, "not the call's whole deadline"
    client.close()


def test_the_http_clients_pin_read_is_a_plain_request_past_any_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pin thread's read (HttpClient._pin_config) against a local HTTP server: the client's headers go
    with it, a trailing slash in the URL is dropped, $http_proxy is not used, the connection is kept."""
    import http.server
    import json

    seen: list[tuple[str, str | None]] = []

    class Triton(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            seen.append((self.path, self.headers.get("tritonbundle-tenant")))
            body = json.dumps({"ensemble_scheduling": {"step": [{"model_name": "minilm_encoder", "model_version": 4}]}})
            self.send_response(200 if self.path == "/v2/models/minilm/config" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Triton)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    try:
        client = HttpClient(f"127.0.0.1:{server.server_address[1]}/", model="minilm", headers={"tritonbundle-tenant": "a"})
        client._open()
        pin = ReleasePin("minilm", "minilm_encoder")
        assert pin.take(client._pin_config(), read_at=1.0) == "4"
        assert pin.take(client._pin_config(), read_at=2.0) == "4"
        assert seen == [("/v2/models/minilm/config", "a")] * 2
        client._close()
    finally:
        server.shutdown()
        server.server_close()


def test_the_asyncio_client_closes_with_its_pin_task_from_a_closed_loop() -> None:
    server = _Server({"1"}, pin=1)
    client = _asyncio(server)
    closed: list[bool] = []

    async def close() -> None:
        closed.append(True)

    client._close = close
    loop = asyncio.new_event_loop()
    loop.run_until_complete(client.embed_tokens([[101, 102]]))
    loop.close()  # the pin's task was never cancelled
    asyncio.run(client.close())
    assert closed == [True] and client._pin_task is None and client._pin.stop.is_set()


def test_a_failed_first_read_leaves_the_call_unpinned_and_a_text_model_without_an_ensemble_is_read_once() -> None:
    server = _Server({"1"}, pin=1)
    server.down = True
    client = _blocking(GrpcClient, server)
    client.embed_tokens([[101, 102]])
    assert server.named == [""] and server.reads == 1
    client.close()
    plain = _Server({"1"}, pin=None)
    client = _blocking(GrpcClient, plain)
    client.embed_tokens([[101, 102]])
    time.sleep(TWO_READS_S)
    client.embed_tokens([[101, 102]])
    assert plain.named == ["", ""] and plain.reads == 1, "nothing pinned: nothing to follow"
    client.close()
    encoder = _blocking(GrpcClient, plain, model="minilm_encoder")  # a client of the encoder itself
    start = time.monotonic()
    encoder.embed_tokens([[101, 102]], timeout_s=5)
    assert time.monotonic() - start < 0.5 and plain.named[-1] == "" and plain.reads == 1, "no ensemble to read"


def test_a_read_that_began_earlier_does_not_overwrite_a_later_one() -> None:
    pin = ReleasePin("minilm", "minilm_encoder")
    step = {"ensemble_scheduling": {"step": [{"model_name": "minilm_encoder", "model_version": "3"}]}}
    assert pin.take(step, read_at=2.0) == "3"
    assert pin.take({"ensemble_scheduling": {"step": [{"model_name": "minilm_encoder"}]}}, read_at=1.0) == "3"
    assert pin.start() and not pin.start(), "one caller starts following"


def test_the_asyncio_client_reads_once_for_calls_at_the_same_moment_and_follows_alike() -> None:
    server = _Server({"1", "2"}, pin=1)
    client = _asyncio(server)

    async def just_read() -> None:
        reads = server.reads
        while server.reads == reads:
            await asyncio.sleep(0.002)

    async def calls() -> None:
        await asyncio.gather(*(client.embed_tokens([[101, 102]]) for _ in range(8)))
        assert server.named == ["1"] * 8 and server.reads == 1, "one read; every first call waited for it"
        await asyncio.wait_for(just_read(), 2)
        server.pin, server.served = 2, {"2"}  # a promotion the background has not read yet
        reads = server.reads
        await client.embed_tokens([[101, 102]])
        assert server.named[-2:] == ["1", "2"] and server.reads == reads + 1, "sent again after the next read"
        server.pin, server.served = -1, {"2"}
        await asyncio.sleep(TWO_READS_S)
        await client.embed_tokens([[101, 102]])
        assert server.named[-1] == ""

    asyncio.run(calls())
    server.pin = 2  # used again in another event loop: the first loop's task ended with it, and is started anew

    async def again() -> None:
        await client.embed_tokens([[101, 102]])
        assert server.named[-1] == "2", "the new task's first read, waited for"
        await client.close()
        assert client._pin_task is None

    asyncio.run(again())
