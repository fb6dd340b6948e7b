"""Tenants at the edge: the real nginx with the edge's rules (docker/edge, rendered by its entry point),
the real tritonserver and the gateway process. Every KServe inference request, HTTP and gRPC, is checked
against the tenants before Triton sees it; Triton gets the tenant the key names, never the caller's own."""

from __future__ import annotations

import contextlib
import json
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tests.gateway.conftest import edge_config, running_gateway, running_nginx
from tests.gateway.test_tenants_served import ECHO_MODEL
from tests.helm.test_edge import nginx_with_stream
from tritonbundle.gateway.metering import read, report
from tritonbundle.gateway.tenants import key_hash
from tritonbundle.proc import free_ports

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

A_KEY, B_KEY = "tb-edge-tenant-a-key-000000001", "tb-edge-tenant-b-key-000000002"
ECHO_CONFIG = ('name: "echo"\nbackend: "python"\nmax_batch_size: 0\ninput [{ name: "X", data_type: TYPE_INT32, dims: [1] }]\n'
               'output [{ name: "P", data_type: TYPE_STRING, dims: [1] }]\n')


@pytest.fixture(scope="module")
def edge(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    from tritonbundle.server import ServerOptions, TritonServer

    nginx = nginx_with_stream()
    folder = tmp_path_factory.mktemp("edge-tenants")
    repo = folder / "repo"
    shutil.copytree(repository, repo)  # the session's built repository (a clean clone has no tokenizer.json in the example)
    (repo / "echo" / "1").mkdir(parents=True)
    (repo / "echo" / "1" / "model.py").write_text(ECHO_MODEL)
    (repo / "echo" / "config.pbtxt").write_text(ECHO_CONFIG)
    (folder / "tenants.yaml").write_text(f"""
tenants:
  - name: team-a
    keys: ["{key_hash(A_KEY)}"]
    limits: {{requests_per_s: 1, burst: 3}}
  - name: team-b
    keys: ["{key_hash(B_KEY)}"]
    models: [echo]
""")
    server = TritonServer(ServerOptions(repo, http_port=0, grpc_port=0, metrics_port=0, log_path=folder / "tritonserver.log",
                                        exit_timeout_s=5)).start(ready_timeout_s=180)
    try:
        with running_gateway(server, folder, "--tenants", str(folder / "tenants.yaml"),
                             "--usage-log", str(folder / "usage.jsonl")) as url:
            env = {"TRITONBUNDLE_EDGE_TRITON_HTTP": server.http_url.removeprefix("http://"),
                   "TRITONBUNDLE_EDGE_TRITON_GRPC": server.grpc_url, "TRITONBUNDLE_EDGE_CAPACITY": "40",
                   "TRITONBUNDLE_EDGE_GATEWAY": url.removeprefix("http://"), "TRITONBUNDLE_EDGE_TENANTS": "on"}
            ports = dict(zip(("http", "grpc", "http_inner", "grpc_inner"), free_ports(4)))
            with running_nginx(nginx, edge_config(folder / "nginx", env, ports), ports["http"]) as proc:
                yield SimpleNamespace(http=f"127.0.0.1:{ports['http']}", grpc=f"127.0.0.1:{ports['grpc']}", folder=folder,
                                      triton_http=server.http_url.removeprefix("http://"), gateway_pid=url.pid,
                                      nginx=nginx, nginx_pid=proc.pid, env=env)
    finally:
        server.stop()


def _http(edge: SimpleNamespace, model: str, key: str | None, headers: dict[str, str] | None = None,
          ) -> tuple[int, dict[str, object], dict[str, str]]:
    body = {"inputs": [{"name": "X", "shape": [1], "datatype": "INT32", "data": [1]}]} if model == "echo" else \
        {"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["a short text"]}]}
    request = urllib.request.Request(f"http://{edge.http}/v2/models/{model}/infer", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **(headers or {}),
                                              **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read()), dict(answer.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}"), dict(e.headers)


def _grpc(edge: SimpleNamespace, key: str | None, forged: str = "") -> str:
    import tritonclient.grpc as grpcclient

    x = grpcclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([1], dtype=np.int32))
    headers = {**({"authorization": f"Bearer {key}"} if key else {}), **({"tritonbundle-tenant": forged} if forged else {})}
    answer = grpcclient.InferenceServerClient(edge.grpc).infer("echo", [x], headers=headers)
    return answer.as_numpy("P")[0].decode()


def test_a_key_is_needed_on_http_and_grpc_and_triton_gets_the_keys_tenant(edge: SimpleNamespace) -> None:
    from tritonclient.utils import InferenceServerException

    status, body, headers = _http(edge, "echo", None)
    assert status == 401 and "no API key" in str(body["error"]) and headers.get("WWW-Authenticate") == "Bearer"
    status, body, _ = _http(edge, "echo", "tb-a-key-nobody-was-ever-given")
    assert status == 401 and "not known here" in str(body["error"]) and "tb-a-key-nobody" not in str(body)
    with pytest.raises(InferenceServerException, match="no API key") as refused:
        _grpc(edge, None)
    assert refused.value.status() == "StatusCode.UNAUTHENTICATED"
    # The tenant Triton sees is the key's, whatever the caller claims.
    status, body, _ = _http(edge, "echo", B_KEY, {"tritonbundle-tenant": "team-a"})
    assert status == 200 and json.loads(body["outputs"][0]["data"][0]) == {"tritonbundle-tenant": "team-b"}  # type: ignore[index]
    assert json.loads(_grpc(edge, B_KEY, forged="team-a")) == {"tritonbundle-tenant": "team-b"}


def test_a_stream_is_refused_while_tenants_are_on(edge: SimpleNamespace) -> None:
    """ModelStreamInfer was admitted once per stream: one admission carried any number of requests past
    the tenant's limits. Refused, saying what to send instead; ModelInfer with the same key is served."""
    import queue

    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    x = grpcclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([1], dtype=np.int32))
    client = grpcclient.InferenceServerClient(edge.grpc)
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error), headers={"authorization": f"Bearer {A_KEY}"})
    try:
        # the edge may end the stream before the request is written: the client then says so itself,
        # and the edge's answer is in the callback either way
        with contextlib.suppress(InferenceServerException):
            client.async_stream_infer("echo", [x])
        error = answers.get(timeout=30)
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    assert error is not None and "ModelStreamInfer is refused while tenants are on" in str(error), error
    assert error.status() == "StatusCode.PERMISSION_DENIED"
    assert json.loads(_grpc(edge, A_KEY)) == {"tritonbundle-tenant": "team-a"}


def test_a_model_the_key_may_not_use_is_403(edge: SimpleNamespace) -> None:
    status, body, _ = _http(edge, "minilm", B_KEY)
    assert status == 403 and "may not use the model 'minilm'" in str(body["error"])


def test_a_tenant_over_its_rate_gets_429_and_resource_exhausted_and_the_usage_log_counts_it(edge: SimpleNamespace) -> None:
    from tritonclient.utils import InferenceServerException

    statuses = [_http(edge, "minilm", A_KEY) for _ in range(6)]
    refused = [s for s in statuses if s[0] == 429]
    assert [s[0] for s in statuses if s[0] != 429] == [200] * (6 - len(refused)) and len(refused) >= 2
    assert all(s[2].get("Retry-After") == "1" and "requests_per_s" in str(s[1]["error"]) for s in refused)
    with pytest.raises(InferenceServerException, match="requests_per_s") as exhausted:
        for _ in range(6):
            _grpc(edge, A_KEY)
    assert exhausted.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    rows = {(r["tenant"], r["model"]): r for r in report(read(edge.folder / "usage.jsonl"))}
    assert rows[("team-a", "minilm")]["admitted"] == 6 - len(refused)
    assert rows[("team-a", "minilm")]["refusals"] == {"rate": len(refused)}
    assert rows[("team-b", "minilm")]["refusals"] == {"model": 1}
    assert not any(tenant == "(unauthenticated)" for tenant, _ in rows)  # counted in the metrics only


NJS_CHECK = """
var table = %s;
function tenant(r) {
    var header = r.headersIn['Authorization'] || '';
    if (header.slice(0, 7).toLowerCase() !== 'bearer ') { return ''; }
    var digest = require('crypto').createHash('sha256').update(header.slice(7).trim()).digest('hex');
    return table['sha256:' + digest] || '';
}
export default {tenant};
"""


def _njs_variant(edge: SimpleNamespace, folder: Path, ports: dict[str, int]) -> Path:
    """The same edge with the key checked inside nginx by njs (a table of key hashes, no rate state) in place
    of the gateway's auth_request: the alternative mechanism, for the figures below."""
    conf = edge_config(folder, edge.env, ports)
    table = {key_hash(A_KEY): "team-a", key_hash(B_KEY): "team-b"}
    (folder / "tenants.js").write_text(NJS_CHECK % json.dumps(table))
    text = conf.read_text()
    text = text.replace("http {\n", f"http {{\n    js_import tenants from {folder / 'tenants.js'};\n"
                                     "    js_set $edge_njs_tenant tenants.tenant;\n", 1)
    text = text.replace("auth_request /_tritonbundle_edge/authorize;", 'if ($edge_njs_tenant = "") { return 401; }')
    text = text.replace("proxy_set_header tritonbundle-tenant $edge_tenant;", "proxy_set_header tritonbundle-tenant $edge_njs_tenant;")
    conf.write_text(text)
    return conf


def test_what_the_tenants_check_adds_per_request(edge: SimpleNamespace, tmp_path: Path) -> None:
    """Figures, not a gate: sequential requests to a model that does nothing (echo), straight to Triton,
    through the edge whose check is the gateway's (auth_request), and, where nginx has njs, through the same
    edge checking the key itself (njs); the gateway's and nginx's CPU per request. Printed, and kept in
    docs/tenants.md."""
    import statistics

    import psutil

    def call(address: str, key: str | None) -> float:
        body = json.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "INT32", "data": [1]}]}).encode()
        request = urllib.request.Request(f"http://{address}/v2/models/echo/infer", data=body,
                                         headers={"Content-Type": "application/json",
                                                  **({"Authorization": f"Bearer {key}"} if key else {})})
        t0 = time.perf_counter()
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 200
            answer.read()
        return (time.perf_counter() - t0) * 1000

    def cpu_ms(pids: list[int]) -> float:
        total = 0.0
        for pid in pids:
            process = psutil.Process(pid)
            for proc in [process, *process.children(recursive=True)]:
                times = proc.cpu_times()
                total += times.user + times.system
        return total * 1000

    paths = {"direct": (edge.triton_http, None, []), "edge, auth_request": (edge.http, B_KEY, [edge.gateway_pid, edge.nginx_pid])}
    njs = Path("/usr/lib/nginx/modules/ngx_http_js_module.so").exists()
    with contextlib.ExitStack() as stack:
        if njs:
            ports = dict(zip(("http", "grpc", "http_inner", "grpc_inner"), free_ports(4)))
            proc = stack.enter_context(running_nginx(edge.nginx, _njs_variant(edge, tmp_path, ports), ports["http"]))
            paths["edge, njs"] = (f"127.0.0.1:{ports['http']}", B_KEY, [proc.pid])
            assert call(paths["edge, njs"][0], B_KEY) > 0
            with pytest.raises(urllib.error.HTTPError, match="401"):
                call(paths["edge, njs"][0], "tb-a-key-nobody-was-ever-given")
        times: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(20):  # warm every path
            for address, key, _ in paths.values():
                call(address, key)
        before = {name: cpu_ms(pids) for name, (_, _, pids) in paths.items()}  # each path's processes are its own
        for _ in range(300):
            for name, (address, key, _) in paths.items():
                times[name].append(call(address, key))
        used = {name: cpu_ms(pids) - before[name] for name, (_, _, pids) in paths.items()}
    direct = statistics.median(times["direct"])
    line = ", ".join(f"{name} p50 {statistics.median(t):.2f} ms (+{statistics.median(t) - direct:.2f}), "
                     f"CPU {used[name] / 300:.2f} ms" for name, t in times.items() if name != "direct")
    print(f"\nKServe HTTP, echo model, 300 sequential requests each: direct p50 {direct:.2f} ms; {line} "
          "(CPU: the gateway's and nginx's processes per request)")
    assert all(len(t) == 300 for t in times.values())
