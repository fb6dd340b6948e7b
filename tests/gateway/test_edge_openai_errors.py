"""The edge's own refusals on the OpenAI API (``/v1/``) keep OpenAI's error shape, so OpenAI's Python client
raises its usual errors with the edge's message and code; KServe's ``/v2`` keeps ``{"error": "..."}``.

The real nginx with the edge's rules (docker/edge, rendered by its entry point). In front of the gateway's
port: a listener that accepts and reads but never answers (a gateway busy with the requests it holds), or
nothing at all (a gateway that is down). Triton is not needed: every answer here is the edge's."""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from tests.gateway.conftest import edge_config, running_nginx
from tests.helm.test_edge import nginx_with_stream
from tritonbundle.proc import free_ports

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

#: TRITONBUNDLE_EDGE_CAPACITY here; the edge allows half of it in flight per client address.
CAPACITY = 4
CLIENT_REQUESTS = CAPACITY // 2


@contextmanager
def silent_listener() -> Iterator[int]:
    """A port that accepts connections and reads what comes, answering nothing, until the block ends."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conn.setblocking(False)
            held.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=5)
        for conn in held:
            conn.close()
        server.close()


@contextmanager
def edge_before(gateway_port: int, folder: Path) -> Iterator[str]:
    """The edge (host:port of its HTTP listener) with the OpenAI gateway at ``gateway_port`` and no Triton."""
    ports = dict(zip(("http", "grpc", "http_inner", "grpc_inner", "triton"), free_ports(5)))
    env = {"TRITONBUNDLE_EDGE_TRITON_HTTP": f"127.0.0.1:{ports['triton']}",
           "TRITONBUNDLE_EDGE_TRITON_GRPC": f"127.0.0.1:{ports['triton']}",
           "TRITONBUNDLE_EDGE_CAPACITY": str(CAPACITY), "TRITONBUNDLE_EDGE_GATEWAY": f"127.0.0.1:{gateway_port}"}
    folder.mkdir()
    with running_nginx(nginx_with_stream(), edge_config(folder, env, ports), ports["http"]):
        yield f"127.0.0.1:{ports['http']}"


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with silent_listener() as gateway, edge_before(gateway, tmp_path_factory.mktemp("edge") / "nginx") as address:
        yield address


def openai_client(address: str):  # type: ignore[no-untyped-def]
    from openai import OpenAI

    return OpenAI(base_url=f"http://{address}/v1", api_key="unused-here", max_retries=0, timeout=30)


def post(address: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], dict]:
    host, port = address.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **headers})
        answer = conn.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, json.loads(answer.read())
    finally:
        conn.close()


def test_a_body_over_the_gateways_16m_is_413_in_openais_shape(edge: str) -> None:
    from openai import APIStatusError

    with pytest.raises(APIStatusError) as refused:
        openai_client(edge).embeddings.create(model="minilm", input=["word " * 3_500_000])
    assert refused.value.status_code == 413 and refused.value.code == "request_too_large"
    body = refused.value.body  # OpenAI's client: the answer's "error"; its message is "Error code: 413 - <that>"
    assert isinstance(body, dict) and body["type"] == "invalid_request_error" and body["param"] == "input"
    assert body["message"].startswith("request body larger than 16m, the limit of the tritonbundle edge"), body


def test_a_compressed_body_is_415_in_openais_shape_and_kserves_stays_its_own(edge: str) -> None:
    status, _, answer = post(edge, "/v1/embeddings", b"\x1f\x8b", {"Content-Encoding": "gzip"})
    assert status == 415 and answer["error"]["code"] == "unsupported_content_encoding", answer
    assert answer["error"]["message"].startswith("Content-Encoding gzip refused by the tritonbundle edge"), answer
    status, _, answer = post(edge, "//v1/embeddings", b"\x1f\x8b", {"Content-Encoding": "gzip"})  # merged: /v1/
    assert status == 415 and answer["error"]["code"] == "unsupported_content_encoding", answer
    status, _, answer = post(edge, "/v2/models/minilm/infer", b"\x1f\x8b", {"Content-Encoding": "gzip"})
    assert status == 415 and isinstance(answer["error"], str) and "Content-Encoding gzip" in answer["error"], answer


def test_over_the_per_client_limit_v1_gets_429_rate_limit_error_with_retry_after(edge: str) -> None:
    """The client's requests in flight are held (bodies half sent, the gateway silent); one more is a 429
    that OpenAI's client raises as RateLimitError, with Retry-After 1."""
    from openai import RateLimitError

    host, port = edge.split(":")
    with ExitStack() as held:
        for _ in range(CLIENT_REQUESTS):
            conn = held.enter_context(socket.create_connection((host, int(port)), timeout=10))
            conn.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: edge\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{\"model\":")
        with pytest.raises(RateLimitError) as refused:
            openai_client(edge).embeddings.create(model="minilm", input=["a short text"])
    assert refused.value.status_code == 429 and refused.value.code == "too_many_requests_in_flight"
    assert refused.value.response.headers["retry-after"] == "1"
    assert refused.value.message.endswith(f" - too many requests in flight at the tritonbundle edge (nginx in front "
                                          f"of the OpenAI gateway): at most {CLIENT_REQUESTS} inference requests per "
                                          f"client address and {2 * CAPACITY} in all; retry after 1 s")


def test_a_gateway_that_is_down_is_503_server_error_naming_it(tmp_path: Path) -> None:
    from openai import InternalServerError

    (dead,) = free_ports(1)
    with edge_before(dead, tmp_path / "nginx") as address:
        with pytest.raises(InternalServerError) as refused:
            openai_client(address).embeddings.create(model="minilm", input=["a short text"])
    assert refused.value.status_code == 503 and refused.value.code == "unavailable"
    assert refused.value.response.headers["retry-after"] == "1"
    assert refused.value.message == ("Error code: 503 - the OpenAI gateway cannot be reached behind the tritonbundle edge (starting, "
                                     "restarting or down): retry")
