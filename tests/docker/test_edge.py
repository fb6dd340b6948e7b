"""The edge (nginx, docker/edge/nginx.conf) in front of the CPU stack's Triton 2.51, for real.

Each case sends what crashes Triton before NGC 26.05, or what legitimate clients send, to the edge's published
loopback ports, and checks the answer (status and error text), that Triton was not restarted (its container's
restart count and start time) and that it still embeds afterwards. One control case sends the compressed body
straight to the Triton container, bypassing the edge: it crashes the server, which is what the edge is for.
The Helm chart's rendering of the same rules runs in the edge image as a sidecar would: in Triton's network
namespace, proxying to 127.0.0.1.

Figures (docker/README.md, "The edge"): Triton 2.51 in compose with a 256 MB stack crashes on request data
nested 993,750 deep (a 1,987,572-byte body) and on 3,367,187 bytes of "[", nearly twice and three times the
edge's default body limit of 1 MiB.
"""

from __future__ import annotations

import gzip
import http.client
import json
import secrets
import subprocess
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.docker.conftest import ROOT, Stack, run, tail

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]

#: The edge's default body limit (TRITONBUNDLE_EDGE_MAX_BODY=1m).
LIMIT = 1 << 20
INFER = "/v2/models/minilm/infer"
#: The nesting of a real request's data that crashes Triton 2.51 above the edge's limit (1,987,572-byte
#: body at the compose stack's 256 MB stack), gzip-compressed: 4 MB of "[" in under 4 KB.
CRASHING_DEPTH = 4_000_000


def text_request(texts: list[str]) -> bytes:
    return json.dumps({"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [len(texts), 1], "data": texts}]}).encode()


def nested_request(depth: int) -> bytes:
    """A real request whose TEXT data is [[[..."x"...]]] ``depth`` deep (Triton walks it recursively)."""
    return b'{"inputs":[{"name":"TEXT","datatype":"BYTES","shape":[1,1],"data":' + b"[" * depth + b'"x"' + b"]" * depth + b"}]}"


def post(host: str, port: int, body: bytes, *, path: str = INFER, headers: dict[str, str] | None = None,
         method: str = "POST") -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=60)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        answer = conn.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        conn.close()


def error_of(body: bytes) -> str:
    return str(json.loads(body)["error"])


def triton_state(stack: Stack) -> str:
    """Changes when the Triton container restarts (a crash of tritonserver ends `tritonbundle serve`)."""
    return run(["docker", "inspect", "-f", "{{.RestartCount}} {{.State.StartedAt}}", stack.container("triton")]).stdout.strip()


def embeds(stack: Stack) -> None:
    """The server answers an embedding through the edge (over HTTP and gRPC)."""
    from tritonbundle.clients import GrpcClient, HttpClient

    with HttpClient(stack.http_url, model="minilm", timeout_s=30) as client:
        assert client.embed(["Still here?"]).shape == (1, 384)
    with GrpcClient(stack.grpc_url, model="minilm", timeout_s=30) as client:
        assert client.embed(["Still here?"]).shape == (1, 384)


@pytest.fixture(scope="module")
def stack(cpu_stack: Stack) -> Iterator[Stack]:
    """The CPU stack, healthy behind its edge; Triton's container must not restart during a case."""
    yield cpu_stack


@pytest.fixture
def unharmed(stack: Stack) -> Iterator[None]:
    before = triton_state(stack)
    yield
    assert triton_state(stack) == before, f"Triton restarted\n{tail(stack.logs('triton'), 40)}"
    embeds(stack)


@pytest.mark.usefixtures("unharmed")
@pytest.mark.parametrize(("encoding", "compress"), [("gzip", gzip.compress), ("deflate", zlib.compress)])
def test_compressed_request_bodies_are_refused_with_415_before_triton_sees_them(
    stack: Stack, encoding: str, compress: Callable[[bytes], bytes],
) -> None:
    body = compress(b"[" * CRASHING_DEPTH)
    assert len(body) < 5000
    status, headers, answer = post("127.0.0.1", stack.http_port, body, headers={"Content-Encoding": encoding})
    assert status == 415 and headers["content-type"] == "application/json"
    assert error_of(answer).startswith(f"Content-Encoding {encoding} refused by the tritonbundle edge")
    # An identity encoding is no encoding: served.
    status, _, answer = post("127.0.0.1", stack.http_port, text_request(["hi"]), headers={"Content-Encoding": "identity"})
    assert status == 200, answer[:300]


@pytest.mark.usefixtures("unharmed")
def test_a_body_over_the_limit_is_refused_with_413_naming_the_limit(stack: Stack) -> None:
    body = text_request(["a" * LIMIT])
    assert len(body) > LIMIT
    status, _, answer = post("127.0.0.1", stack.http_port, body)
    assert status == 413
    assert error_of(answer).startswith("request body larger than 1m, the limit of the tritonbundle edge")


@pytest.mark.usefixtures("unharmed")
def test_the_deepest_json_under_the_limit_reaches_triton_which_answers_and_stays_up(stack: Stack) -> None:
    """The worst bodies that fit: "[" filling the whole limit (the parser's recursion; Triton 2.51 answers a
    parse error, with 500) and a real request whose data is nested as deep as fits (Triton's data walker: it
    flattens it and embeds "x"); at 64 MB of stack the second crashed Triton from 495,384 bytes on."""
    status, _, answer = post("127.0.0.1", stack.http_port, b"[" * LIMIT)
    assert status in (400, 500) and "failed to parse the request JSON" in error_of(answer), answer[:300]
    depth = (LIMIT - len(nested_request(0))) // 2
    body = nested_request(depth)
    assert LIMIT - 2 < len(body) <= LIMIT
    status, _, answer = post("127.0.0.1", stack.http_port, body)
    assert status == 200 and json.loads(answer)["outputs"][0]["shape"] == [1, 384], answer[:300]


@pytest.mark.usefixtures("unharmed")
def test_the_largest_json_string_under_the_limit_is_embedded(stack: Stack) -> None:
    body = text_request(["a" * (LIMIT - len(text_request([""])))])
    assert len(body) == LIMIT
    status, _, answer = post("127.0.0.1", stack.http_port, body)
    assert status == 200, answer[:300]


@pytest.mark.usefixtures("unharmed")
def test_large_legitimate_batches_pass_as_json_and_as_the_bundles_binary_tensors(stack: Stack) -> None:
    from tritonbundle.clients import GrpcClient, HttpClient

    texts = [(f"sentence {i} " * 2000)[:20 << 10] for i in range(32)]  # 32 texts of 20 KB
    body = text_request(texts)
    assert 640 << 10 < len(body) < LIMIT
    status, _, answer = post("127.0.0.1", stack.http_port, body)
    assert status == 200, answer[:300]
    assert json.loads(answer)["outputs"][0]["shape"] == [32, 384]
    with HttpClient(stack.http_url, model="minilm", timeout_s=60) as client:
        http = client.embed(texts)
    with GrpcClient(stack.grpc_url, model="minilm", timeout_s=60) as client:
        grpc = client.embed(texts)
    assert http.shape == grpc.shape == (32, 384)
    np.testing.assert_allclose(http, grpc, atol=1e-5)


@pytest.mark.usefixtures("unharmed")
def test_oversized_headers_are_refused_with_431(stack: Stack) -> None:
    status, _, answer = post("127.0.0.1", stack.http_port, text_request(["hi"]), headers={"X-Padding": "a" * (20 << 10)})
    assert status == 431
    assert error_of(answer).startswith("request headers too large for the tritonbundle edge")
    # Many headers of 15 KB each: 64 KB in all is the limit.
    padding = {f"X-Padding-{i}": "a" * (15 << 10) for i in range(5)}
    status, _, answer = post("127.0.0.1", stack.http_port, text_request(["hi"]), headers=padding)
    assert status == 431, answer[:300]


@pytest.mark.usefixtures("unharmed")
def test_request_ids_and_the_restricted_api_key_pass_through_untouched(stack: Stack) -> None:
    request_id = "req-" + secrets.token_hex(8)
    status, headers, _ = post("127.0.0.1", stack.http_port, text_request(["hi"]), headers={"X-Request-Id": request_id})
    assert status == 200 and headers["x-request-id"] == request_id
    status, headers, _ = post("127.0.0.1", stack.http_port, text_request(["hi"]))
    assert status == 200 and len(headers["x-request-id"]) == 32, "one is made up when the client sends none"
    index = "/v2/repository/index"
    assert post("127.0.0.1", stack.http_port, b"{}", path=index)[0] == 403
    assert post("127.0.0.1", stack.http_port, b"{}", path=index, headers={"tritonbundle-key": stack.api_key})[0] == 200
    time.sleep(1.5)  # the access log is flushed every second
    log = [json.loads(line) for line in stack.logs("edge").splitlines() if line.startswith("{")]
    assert any(entry["request_id"] == request_id and entry["status"] == 200 and entry["upstream_status"] == "200"
               for entry in log), log[-5:]


@pytest.mark.usefixtures("unharmed")
def test_grpc_passes_and_refuses_compressed_and_oversized_messages(stack: Stack) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(stack.grpc_url)

    def infer(text: bytes, **kwargs: object) -> InferenceServerException:
        tensor = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[text]], dtype=object))
        with pytest.raises(InferenceServerException) as refused:
            client.infer("minilm", [tensor], **kwargs)
        return refused.value

    compressed = infer(b"hello", compression_algorithm="gzip")
    assert compressed.status() == "StatusCode.UNIMPLEMENTED"
    assert "grpc-encoding gzip refused by the tritonbundle edge" in compressed.message()
    oversized = infer(b"a" * (LIMIT + 1))
    assert oversized.status() == "StatusCode.INVALID_ARGUMENT"
    assert "request larger than 1m, the limit of the tritonbundle edge" in oversized.message()
    # Restricted APIs: the key's metadata passes through; without it Triton refuses.
    key = {"triton-grpc-protocol-tritonbundle-key": stack.api_key}
    assert {m.name for m in client.get_model_repository_index(headers=key).models} >= {"minilm"}
    with pytest.raises(InferenceServerException, match="expecting header"):
        client.get_model_repository_index()
    client.close()


def test_the_edge_runs_non_root_read_only_and_logs_to_stdout(stack: Stack) -> None:
    container = stack.container("edge")
    info = json.loads(run(["docker", "inspect", container]).stdout)[0]
    assert info["Config"]["User"] == "1000:1000"
    assert run(["docker", "exec", container, "id", "-u"]).stdout.strip() == "1000"
    assert info["HostConfig"]["ReadonlyRootfs"] is True and info["HostConfig"]["CapDrop"] == ["ALL"]
    assert info["Config"]["StopSignal"] == "SIGQUIT"
    assert info["State"]["Health"]["Status"] == "healthy"
    assert "tritonbundle-edge: HTTP :8080 -> triton:8000, gRPC :8081 -> triton:8001, request bodies up to 1m" in stack.logs("edge")


def test_the_helm_charts_edge_config_runs_as_a_sidecar_of_triton(stack: Stack, tmp_path: Path) -> None:
    """The chart's ConfigMap (nginx.conf + settings.conf with Triton at 127.0.0.1) in the edge image, in the
    Triton container's network namespace as in a pod: it proxies to Triton on loopback and refuses what the
    compose edge refuses. (nginx 1.22 here; the chart's image carries a later nginx.)"""
    fetched = subprocess.run([str(ROOT / "helm" / "fetch-tools.sh")], capture_output=True, text=True, timeout=600)
    assert fetched.returncode == 0, fetched.stderr
    rendered = run([str(ROOT / ".tools" / "bin" / "helm"), "template", "emb", str(ROOT / "helm" / "tritonbundle"),
                    "--show-only", "templates/edge-configmap.yaml"]).stdout
    data = yaml.safe_load(rendered)["data"]
    conf = tmp_path / "edge"
    conf.mkdir()
    for name, text in data.items():
        (conf / name).write_text(text)
    conf.chmod(0o755)
    name = f"{stack.project}-helm-edge"
    triton = stack.container("triton")
    try:
        run(["docker", "run", "-d", "--name", name, "--network", f"container:{triton}", "--read-only",
             "--tmpfs", "/tmp", "--cap-drop", "ALL", "--security-opt", "no-new-privileges:true",
             "-v", f"{conf}:/etc/nginx/tritonbundle:ro", "--entrypoint", "nginx", "tritonbundle-edge:0.1.0",
             "-c", "/etc/nginx/tritonbundle/nginx.conf", "-e", "stderr", "-g", "daemon off;"])
        probe = ("import json, sys, urllib.request as u, urllib.error as e\n"
                 "def post(body, **h):\n"
                 "    r = u.Request('http://127.0.0.1:8080/v2/models/minilm/infer', data=body, headers=h)\n"
                 "    try:\n"
                 "        with u.urlopen(r, timeout=30) as a: return a.status, json.load(a)\n"
                 "    except e.HTTPError as x: return x.code, json.load(x)\n"
                 "ok = post(json.dumps({'inputs': [{'name': 'TEXT', 'datatype': 'BYTES', 'shape': [1, 1], 'data': ['hi']}]}).encode())\n"
                 "gz = post(b'x', **{'Content-Encoding': 'gzip'})\n"
                 "big = post(b'[' * (2 << 20))\n"
                 "print(json.dumps([ok[0], ok[1]['outputs'][0]['shape'], gz[0], gz[1]['error'], big[0], big[1]['error']]))\n")
        answer: list[object] = []
        for _ in range(30):  # nginx starts in well under a second
            result = run(["docker", "exec", name, "python3", "-c", probe], check=False)
            if result.returncode == 0:
                answer = json.loads(result.stdout)
                break
            time.sleep(0.5)
        assert answer, f"{result.stderr}\n{run(['docker', 'logs', name], check=False).stderr}"
        assert answer[:3] == [200, [1, 384], 415] and str(answer[3]).startswith("Content-Encoding gzip refused")
        assert answer[4] == 413 and str(answer[5]).startswith("request body larger than 1m")
    finally:
        run(["docker", "rm", "-f", name], check=False)


def test_control_the_compressed_body_the_edge_refuses_crashes_triton_when_sent_to_it_directly(stack: Stack) -> None:
    """Bypassing the edge (to the Triton container's own address on the compose network), the 4 KB gzip body
    of the first case kills Triton 2.51; while it restarts the edge answers 503, which the clients retry, and
    afterwards it serves again without being restarted itself."""
    triton = stack.container("triton")
    address = run(["docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", triton]).stdout.strip()
    edge_before = run(["docker", "inspect", "-f", "{{.State.StartedAt}}", stack.container("edge")]).stdout.strip()
    before = triton_state(stack)
    body = gzip.compress(b"[" * CRASHING_DEPTH)
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        post(address, 8000, body, headers={"Content-Encoding": "gzip"})
    deadline = time.monotonic() + 120
    statuses = set()
    while time.monotonic() < deadline:
        status, _, answer = post("127.0.0.1", stack.http_port, text_request(["back?"]))
        statuses.add(status)
        if status == 200:
            break
        assert status == 503 and "cannot be reached behind the tritonbundle edge" in error_of(answer), answer[:300]
        time.sleep(0.5)
    assert 200 in statuses, f"Triton did not come back: {statuses}\n{tail(stack.logs('triton'), 40)}"
    assert triton_state(stack) != before, "Triton's container restarted"
    assert run(["docker", "inspect", "-f", "{{.State.StartedAt}}", stack.container("edge")]).stdout.strip() == edge_before
    embeds(stack)

