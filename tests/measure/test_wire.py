"""The load generator's requests on the wire, against the real tritonserver: the bytes built once are the
client's own requests (the server answers them as it answers the client), split at the model's batch
limit like the client's, with the client's headers; a failed request names its status and message."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest

from tritonbundle.clients.aio import AsyncGrpcClient
from tritonbundle.clients.core import RetryPolicy
from tritonbundle.measure.wire import HttpSender, WireError, WireRequest, WireSender, capture, sender

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TEXTS = ["a short one", "a longer text about rivers and the music of the night", "guitars"]


def _embeddings(answers: list[bytes]) -> np.ndarray[Any, Any]:
    from tritonclient.grpc import InferResult, service_pb2

    parts = [InferResult(service_pb2.ModelInferResponse.FromString(a)).as_numpy("embedding") for a in answers]
    return np.concatenate(parts, axis=0)


async def _client_and_wire(url: str, texts: list[str], headers: dict[str, str] | None = None
                           ) -> tuple[np.ndarray[Any, Any], tuple[WireRequest, ...], np.ndarray[Any, Any]]:
    async with AsyncGrpcClient(url, model="minilm", retry=RetryPolicy(max_attempts=1), headers=headers) as client:
        expected = await client.embed(texts)
        requests = await capture(client, lambda c: c.embed(texts))
    wire = WireSender(url, timeout_s=30.0)
    try:
        got = _embeddings(await wire.send(requests))
    finally:
        await wire.close()
    return expected, requests, got


def test_the_bytes_on_the_wire_are_the_clients_request(server: Any) -> None:
    expected, requests, got = asyncio.run(_client_and_wire(server.grpc_url, TEXTS))
    assert len(requests) == 1
    np.testing.assert_allclose(got, expected, atol=1e-4)  # batching may pad differently


def test_a_call_past_the_batch_limit_is_split_as_the_client_splits_it(server: Any) -> None:
    texts = [f"text number {i} " + "and rivers " * (i % 5) for i in range(40)]  # minilm: max_batch_size 32
    expected, requests, got = asyncio.run(_client_and_wire(server.grpc_url, texts))
    assert len(requests) == 2
    assert got.shape == expected.shape == (40, expected.shape[1])
    np.testing.assert_allclose(got, expected, atol=1e-4)  # batching may pad differently


def test_the_clients_headers_go_with_every_part(server: Any) -> None:
    texts = [f"text {i}" for i in range(33)]
    _expected, requests, _got = asyncio.run(_client_and_wire(server.grpc_url, texts, {"x-team": "team-a"}))
    assert [dict(r.metadata).get("x-team") for r in requests] == ["team-a", "team-a"]


def test_a_failed_request_says_its_status_and_message(server: Any) -> None:
    async def run() -> None:
        async with AsyncGrpcClient(server.grpc_url, model="minilm", retry=RetryPolicy(max_attempts=1)) as client:
            good = await capture(client, lambda c: c.embed(["hi"]))
        # The same bytes with the model's name changed: a model the server does not have.
        from tritonclient.grpc import service_pb2

        message = service_pb2.ModelInferRequest.FromString(good[0].body)
        message.model_name = "no_such_model"
        wire = WireSender(server.grpc_url, timeout_s=10.0)
        try:
            with pytest.raises(WireError, match=r"^[A-Z_]+: .*no_such_model"):
                await wire.send([WireRequest(message.SerializeToString())])
            assert len(await wire.send(good)) == 1  # the channel still serves
        finally:
            await wire.close()

    asyncio.run(run())


def test_the_sender_is_wire_unless_the_environment_says_client_or_http(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITONBUNDLE_LOAD_SENDER", raising=False)
    assert sender() == "wire"
    monkeypatch.setenv("TRITONBUNDLE_LOAD_SENDER", "client")
    assert sender() == "client"
    monkeypatch.setenv("TRITONBUNDLE_LOAD_SENDER", "http")
    assert sender() == "http"
    monkeypatch.setenv("TRITONBUNDLE_LOAD_SENDER", "bytes")
    with pytest.raises(ValueError, match="TRITONBUNDLE_LOAD_SENDER='bytes': expected one of wire, client, http"):
        sender()


def _http_embeddings(answers: list[bytes]) -> np.ndarray[Any, Any]:
    """Triton's HTTP answers with binary outputs: a JSON header, then each output's bytes."""
    parts = []
    for body in answers:
        header, end = json.JSONDecoder().raw_decode(body.decode("latin-1"))
        (output,) = [o for o in header["outputs"] if o["name"] == "embedding"]
        size = output["parameters"]["binary_data_size"]
        parts.append(np.frombuffer(body[end:end + size], dtype=np.float32).reshape(output["shape"]))
    return np.concatenate(parts, axis=0)


async def _client_and_http(server: Any, texts: list[str], headers: dict[str, str] | None = None
                           ) -> tuple[np.ndarray[Any, Any], tuple[WireRequest, ...], np.ndarray[Any, Any]]:
    async with AsyncGrpcClient(server.grpc_url, model="minilm", retry=RetryPolicy(max_attempts=1),
                               headers=headers) as client:
        expected = await client.embed(texts)
        requests = await capture(client, lambda c: c.embed(texts), http_host=server.http_url)
    http = HttpSender(server.http_url, timeout_s=30.0)
    try:
        got = _http_embeddings(await http.send(requests))
        again = _http_embeddings(await http.send(requests))  # on the kept-alive connections
    finally:
        await http.close()
    np.testing.assert_array_equal(got, again)
    return expected, requests, got


def test_the_http_requests_are_the_http_clients_and_are_split_like_it(server: Any) -> None:
    """TRITONBUNDLE_LOAD_SENDER=http: the HTTP client's requests (tensors as binary data), split at the
    model's batch limit, answered as the client's own call is."""
    expected, requests, got = asyncio.run(_client_and_http(server, TEXTS))
    assert len(requests) == 1 and requests[0].body.startswith(b"POST /v2/models/minilm/infer HTTP/1.1\r\n")
    np.testing.assert_allclose(got, expected, atol=1e-4)
    texts = [f"text number {i} " + "and rivers " * (i % 5) for i in range(40)]  # minilm: max_batch_size 32
    expected, requests, got = asyncio.run(_client_and_http(server, texts, {"x-team": "team-a"}))
    assert len(requests) == 2 and all(b"\r\nx-team: team-a\r\n" in r.body for r in requests)
    assert got.shape == expected.shape == (40, expected.shape[1])
    np.testing.assert_allclose(got, expected, atol=1e-4)


def test_a_failed_http_request_says_its_status_and_the_connection_still_serves(server: Any) -> None:
    async def run() -> None:
        async with AsyncGrpcClient(server.grpc_url, model="minilm", retry=RetryPolicy(max_attempts=1)) as client:
            good = await capture(client, lambda c: c.embed(["hi"]), http_host=server.http_url)
        bad = WireRequest(good[0].body.replace(b"/v2/models/minilm/", b"/v2/models/no_such_model/", 1))
        http = HttpSender(server.http_url, timeout_s=10.0)
        try:
            with pytest.raises(WireError, match=r"^HTTP 4\d\d: .*no_such_model"):
                await http.send([bad])
            (first,) = http._open
            assert len(await http.send(good)) == 1
            assert http._open == {first}, "one connection served both: an error answer keeps it alive"
        finally:
            await http.close()

    asyncio.run(run())


def test_an_http_request_past_its_deadline_fails_and_its_connection_is_dropped() -> None:
    """A server that reads and never answers (a socket on 127.0.0.1 this test opens): the request fails
    as DEADLINE_EXCEEDED after timeout_s, and its connection is not used again."""
    async def run() -> None:
        server = await asyncio.start_server(lambda r, w: r.read(100_000), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        http = HttpSender(f"127.0.0.1:{port}", timeout_s=0.3)
        request = WireRequest(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        try:
            started = asyncio.get_running_loop().time()
            with pytest.raises(WireError, match="^DEADLINE_EXCEEDED: no answer within 0.3 s"):
                await http.send([request])
            assert 0.25 <= asyncio.get_running_loop().time() - started < 5
            assert not http._idle and not http._open
            http.max_open = 1  # as if the process's file limit were reached: one more is refused, not sent
            first = asyncio.ensure_future(http.send([request]))
            await asyncio.sleep(0.05)
            with pytest.raises(WireError, match="^RESOURCE_EXHAUSTED: 1 connections already out"):
                await http.send([request])
            with pytest.raises(WireError, match="^DEADLINE_EXCEEDED"):
                await first
        finally:
            await http.close()
            server.close()

    asyncio.run(run())


def _answering(close: bool, head: bytes = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok") -> Any:
    """A server on 127.0.0.1 that answers each request with ``head`` (and then closes, if ``close``)."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.readuntil(b"\r\n\r\n"):
            writer.write(head)
            await writer.drain()
            if close:
                writer.close()
                return

    return serve


def test_an_idle_connection_the_server_closed_is_not_used_again() -> None:
    async def run() -> None:
        server = await asyncio.start_server(_answering(close=True), "127.0.0.1", 0)
        http = HttpSender(f"127.0.0.1:{server.sockets[0].getsockname()[1]}", timeout_s=5.0)
        request = WireRequest(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            assert await http.send([request]) == [b"ok"]
            await asyncio.sleep(0.1)  # the server has closed it by now
            started = asyncio.get_running_loop().time()
            assert await http.send([request]) == [b"ok"]  # on a new connection, not after the 5-s deadline
            assert asyncio.get_running_loop().time() - started < 2
            assert len(http._open) <= 1
        finally:
            await http.close()
            server.close()

    asyncio.run(run())


def test_the_connection_bound_counts_connections_being_opened_and_a_garbled_answer_fails() -> None:
    async def run() -> None:
        server = await asyncio.start_server(_answering(close=False), "127.0.0.1", 0)
        http = HttpSender(f"127.0.0.1:{server.sockets[0].getsockname()[1]}", timeout_s=5.0)
        http.max_open = 2
        request = WireRequest(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            got = await asyncio.gather(*(http.send([request]) for _ in range(10)), return_exceptions=True)
            refused = [g for g in got if isinstance(g, WireError)]
            assert len(refused) == 8 and all(str(g).startswith("RESOURCE_EXHAUSTED") for g in refused), got
            assert got.count([b"ok"]) == 2 and len(http._open) == 2
        finally:
            await http.close()
            server.close()
        garbled = await asyncio.start_server(_answering(close=False, head=b"nonsense\r\n\r\n"), "127.0.0.1", 0)
        http = HttpSender(f"127.0.0.1:{garbled.sockets[0].getsockname()[1]}", timeout_s=5.0)
        try:
            with pytest.raises(WireError, match="^UNAVAILABLE: an answer without a status or a Content-Length"):
                await http.send([request])
            assert not http._open
        finally:
            await http.close()
            garbled.close()

    asyncio.run(run())


def test_a_versioned_token_call_names_its_version_on_the_wire_and_at_the_server(server: Any) -> None:
    """``embed_tokens(version=...)`` (the clients name the version a release pinned the ensemble to):
    the server answers it as that version and refuses a version it does not serve, naming it; the requests
    captured for the load generator name the version too, over gRPC and HTTP, and are answered alike."""
    from tritonbundle.errors import ModelNotFoundError

    ids = [[101, 1037, 2460, 3793, 102]]

    async def run() -> tuple[np.ndarray[Any, Any], tuple[WireRequest, ...], tuple[WireRequest, ...]]:
        async with AsyncGrpcClient(server.grpc_url, model="minilm", retry=RetryPolicy(max_attempts=1)) as client:
            expected = await client.embed_tokens(ids, version="1")
            np.testing.assert_allclose(expected, await client.embed_tokens(ids), atol=1e-5)  # 1 is the newest
            with pytest.raises(ModelNotFoundError, match="9"):  # an unnamed call reads the pin again on this
                await client.embed_tokens(ids, version="9")
            grpc = await capture(client, lambda c: c.embed_tokens(ids, version="1"))
            http = await capture(client, lambda c: c.embed_tokens(ids, version="1"), http_host=server.http_url)
        return expected, grpc, http

    expected, grpc, http = asyncio.run(run())
    from tritonclient.grpc import service_pb2

    assert service_pb2.ModelInferRequest.FromString(grpc[0].body).model_version == "1"
    assert http[0].body.startswith(b"POST /v2/models/minilm_encoder/versions/1/infer HTTP/1.1\r\n")

    async def send() -> tuple[list[bytes], list[bytes]]:
        wire, sender_http = WireSender(server.grpc_url, timeout_s=30.0), HttpSender(server.http_url, timeout_s=30.0)
        try:
            return await wire.send(grpc), await sender_http.send(http)
        finally:
            await wire.close()
            await sender_http.close()

    over_grpc, over_http = asyncio.run(send())
    np.testing.assert_allclose(_embeddings(over_grpc), expected, atol=1e-5)
    np.testing.assert_allclose(_http_embeddings(over_http), expected, atol=1e-5)
