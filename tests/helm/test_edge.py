"""The edge's limits on requests and connections, on the chart's side and where they come from.

The chart's edge sidecar runs the compose edge's rules (docker/edge/nginx.conf) with settings rendered from the
same templates: settings.conf (Triton's addresses, the body limit, the request limits) and stream-settings.conf
(the connection limits). The capacity (inference requests at Triton at once) is derived from a model repository
by docker/edge/limits.py, which the compose edge runs when it starts and the chart takes as edge.limits.capacity.
No cluster and no Docker here: helm template, the entry point's --render, limits.py on folders of config.pbtxt
files, and `nginx -t` where Debian's nginx with its stream module is installed. The edge under load, for real:
tests/docker/test_edge.py.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from tests.helm.test_chart import (
    CHART,
    FULLNAME,
    ROOT,
    Obj,
    helm,  # noqa: F401 - the session fixture
    objects,
    render,
    template,
    workload,
)

DOCKER_EDGE = ROOT / "docker" / "edge"
COPIES = {"edge-nginx.conf": "nginx.conf", "edge-settings.conf.template": "settings.conf.template",
          "edge-stream-settings.conf.template": "stream-settings.conf.template"}
#: The bundle's repository: minilm's encoder queues 64, the edge keeps 2 places for the health checks.
SHIPPED_CAPACITY = 62


def load_limits() -> ModuleType:
    spec = importlib.util.spec_from_file_location("edge_limits", DOCKER_EDGE / "limits.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


limits = load_limits()


def edge_config(docs: list[Obj]) -> dict[str, str]:
    return next(c for c in objects(docs, "ConfigMap") if c["metadata"]["name"] == f"{FULLNAME}-edge")["data"]


def entrypoint(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """docker/edge/entrypoint.sh with the rules from docker/edge and only the given settings."""
    full = {"PATH": os.environ["PATH"], "TRITONBUNDLE_EDGE_RULES": str(DOCKER_EDGE),
            "TRITONBUNDLE_EDGE_CONF_DIR": str(tmp_path), "TRITONBUNDLE_EDGE_REPOSITORY": str(tmp_path / "none"), **env}
    return subprocess.run(["/bin/sh", str(DOCKER_EDGE / "entrypoint.sh"), *args], env=full, capture_output=True,
                          text=True, timeout=30)


def compose_render(tmp_path: Path, env: dict[str, str]) -> dict[str, str]:
    result = entrypoint(tmp_path, {"TRITONBUNDLE_EDGE_TRITON_HTTP": "127.0.0.1:8000",
                                   "TRITONBUNDLE_EDGE_TRITON_GRPC": "127.0.0.1:8001", **env}, "--render")
    assert result.returncode == 0, result.stderr
    return {name: (tmp_path / name).read_text() for name in ("nginx.conf", "settings.conf", "stream-settings.conf")}


# -- the chart's copy of the rules and its rendering ------------------------------------------------
def test_the_charts_edge_files_are_copies_of_the_compose_edges_stream_template_included() -> None:
    for copy, source in COPIES.items():
        assert (CHART / "files" / copy).read_bytes() == (DOCKER_EDGE / source).read_bytes(), (
            f"helm/tritonbundle/files/{copy} differs: cp docker/edge/{source} helm/tritonbundle/files/{copy}")


@pytest.mark.parametrize(("sets", "env"), [
    ({}, {}),
    ({"edge.limits.capacity": "100"}, {"TRITONBUNDLE_EDGE_CAPACITY": "100"}),
    ({"edge.limits.capacity": "7", "edge.limits.clientRequests": "2", "edge.limits.requests": "300",
      "edge.limits.clientConnections": "64", "edge.limits.connections": "1000", "edge.maxBodySize": "512k"},
     {"TRITONBUNDLE_EDGE_CAPACITY": "7", "TRITONBUNDLE_EDGE_CLIENT_REQUESTS": "2", "TRITONBUNDLE_EDGE_REQUESTS": "300",
      "TRITONBUNDLE_EDGE_CLIENT_CONNECTIONS": "64", "TRITONBUNDLE_EDGE_CONNECTIONS": "1000",
      "TRITONBUNDLE_EDGE_MAX_BODY": "512k"}),
    ({"gateway.enabled": "true"}, {"TRITONBUNDLE_EDGE_GATEWAY": "127.0.0.1:8090"}),
    ({"gateway.enabled": "true", "gateway.tenants.existingSecret": "t"},
     {"TRITONBUNDLE_EDGE_GATEWAY": "127.0.0.1:8090", "TRITONBUNDLE_EDGE_TENANTS": "on"}),
], ids=["defaults", "capacity", "every-limit", "gateway", "tenants"])
def test_the_chart_renders_the_limits_as_the_compose_entry_point_does(
    helm: Path, tmp_path: Path, sets: dict[str, str], env: dict[str, str],  # noqa: F811 - the fixture
) -> None:
    chart = edge_config(render(helm, sets=sets))
    assert chart == compose_render(tmp_path, env)


def test_unset_request_limits_are_half_and_twice_the_capacity(helm: Path) -> None:  # noqa: F811
    for capacity, client, total in ((62, 31, 124), (101, 51, 202), (1, 1, 2)):
        data = edge_config(render(helm, sets={"edge.limits.capacity": str(capacity)}))
        assert f"server 127.0.0.1:8000 max_conns={capacity};" in data["settings.conf"]
        assert f"server 127.0.0.1:8001 max_conns={capacity};" in data["settings.conf"]
        assert f"limit_conn edge_requests_per_client {client};\nlimit_conn edge_requests {total};" in data["settings.conf"]
        assert (client, total) == (limits.default_client_requests(capacity), limits.default_requests(capacity))
    stream = edge_config(render(helm))["stream-settings.conf"]
    assert "limit_conn edge_connections_per_client 256;\nlimit_conn edge_connections 4096;" in stream


def test_the_edge_container_mounts_every_rendered_file_and_a_new_limit_rolls_the_pods(helm: Path) -> None:  # noqa: F811
    docs = render(helm)
    edge = next(c for c in workload(docs)["spec"]["template"]["spec"]["containers"] if c["name"] == "edge")
    assert {m["mountPath"]: m["name"] for m in edge["volumeMounts"]}["/etc/nginx/tritonbundle"] == "edge-config"
    assert set(edge_config(docs)) == {"nginx.conf", "settings.conf", "stream-settings.conf"}
    nginx = edge_config(docs)["nginx.conf"]
    assert "include settings.conf;" in nginx and "include stream-settings.conf;" in nginx

    def checksum(sets: dict[str, str]) -> str:
        return workload(render(helm, sets=sets))["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    base = checksum({})
    assert checksum({"edge.limits.capacity": "40"}) != base
    assert checksum({"edge.limits.clientConnections": "100"}) != base


@pytest.mark.parametrize("port", ["http", "grpc", "metrics"])
def test_triton_ports_on_the_edges_loopback_ports_are_refused(helm: Path, port: str) -> None:  # noqa: F811
    others = {name: str(9000 + i) for i, name in enumerate(("http", "grpc", "metrics")) if name != port}
    result = template(helm, sets={f"server.ports.{port}": "18081", **{f"server.ports.{k}": v for k, v in others.items()}},
                      check=False)
    assert result.returncode != 0 and f"server.ports.{port} is 18081, a loopback port of the edge" in result.stderr
    assert template(helm, sets={f"server.ports.{port}": "18081", "edge.enabled": "false",
                                **{f"server.ports.{k}": v for k, v in others.items()}}, check=False).returncode == 0


@pytest.mark.parametrize(("values", "named"), [
    ("edge:\n  limits:\n    connections: 9000\n", "/edge/limits/connections"),
    ("edge:\n  limits:\n    capacity: 0\n", "/edge/limits/capacity"),
    ("edge:\n  limits:\n    clientRequests: -1\n", "/edge/limits/clientRequests"),
    ("edge:\n  limits:\n    clientConnections: many\n", "/edge/limits/clientConnections"),
    ("edge:\n  limits:\n    requests: 1.5\n", "/edge/limits/requests"),
])
def test_schema_refuses_a_bad_limit_and_names_it(helm: Path, tmp_path: Path, values: str, named: str) -> None:  # noqa: F811
    path = tmp_path / "values.yaml"
    path.write_text(values)
    result = template(helm, str(path), check=False)
    assert result.returncode != 0 and f"'{named}'" in result.stderr, result.stderr


def test_schema_refuses_a_misspelt_limit(helm: Path, tmp_path: Path) -> None:  # noqa: F811
    path = tmp_path / "values.yaml"
    path.write_text("edge:\n  limits:\n    clientRequest: 10\n")
    result = template(helm, str(path), check=False)
    assert result.returncode != 0 and "clientRequest" in result.stderr and "additional properties" in result.stderr


def test_every_limit_is_commented_in_values_yaml() -> None:
    text = (CHART / "values.yaml").read_text()
    edge = text[text.index("\nedge:\n"):]
    block = edge[edge.index("\n  limits:\n"):edge.index("\n  # -- CPU/memory of the edge container.")]
    keys = re.findall(r"^    (\w+):", block, re.M)
    assert keys == ["capacity", "clientRequests", "requests", "clientConnections", "connections"]
    for key in keys:
        assert re.search(rf"    # -- [^\n]*\n(?:    # [^\n]*\n)*    {key}:", block), f"edge.limits.{key} has no comment"
    defaults = yaml.safe_load(text)["edge"]["limits"]
    assert defaults == {"capacity": SHIPPED_CAPACITY, "clientRequests": 0, "requests": 0, "clientConnections": 256,
                        "connections": 4096}


# -- where the capacity comes from: docker/edge/limits.py ------------------------------------------
def test_the_default_capacity_is_what_limits_py_derives_from_the_shipped_repository(tmp_path: Path) -> None:
    """One figure in four places: the chart's default, limits.py's fallback, the entry point's fallback and
    what limits.py reads from model_repository/ (the compose edge derives it at start)."""
    derived = limits.limits(ROOT / "model_repository")
    assert derived["capacity"] == limits.DEFAULT_CAPACITY == SHIPPED_CAPACITY
    assert yaml.safe_load((CHART / "values.yaml").read_text())["edge"]["limits"]["capacity"] == SHIPPED_CAPACITY
    assert f"default_capacity={SHIPPED_CAPACITY}\n" in (DOCKER_EDGE / "entrypoint.sh").read_text()
    assert derived["models"]["minilm"] == {"holds": 64, "how": "ensemble: its narrowest step, minilm_encoder (64)",
                                           "user_facing": True}
    assert not derived["models"]["minilm_encoder"]["user_facing"] and not derived["models"]["minilm_tokenizer"]["user_facing"]
    # The entry point derives the same from the folder, and a set capacity wins.
    rendered = entrypoint(tmp_path, {"TRITONBUNDLE_EDGE_REPOSITORY": str(ROOT / "model_repository")}, "--render")
    assert rendered.returncode == 0, rendered.stderr
    assert f"server triton:8000 max_conns={SHIPPED_CAPACITY};" in (tmp_path / "settings.conf").read_text()
    rendered = entrypoint(tmp_path, {"TRITONBUNDLE_EDGE_REPOSITORY": str(ROOT / "model_repository"),
                                     "TRITONBUNDLE_EDGE_CAPACITY": "10"}, "--render")
    assert "limit_conn edge_requests_per_client 5;" in (tmp_path / "settings.conf").read_text()


def write_model(repository: Path, name: str, body: str) -> None:
    (repository / name).mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(f'name: "{name}"\n{body}')


def queue(size: int) -> str:
    return f"dynamic_batching {{ default_queue_policy {{ max_queue_size: {size} }} }}\n"


def ensemble(*steps: str) -> str:
    return 'platform: "ensemble"\nensemble_scheduling {\n' + "".join(
        f'  step {{ model_name: "{s}" model_version: -1 }}\n' for s in steps) + "}\n"


def test_limits_py_takes_each_user_facing_models_narrowest_step_less_the_reserve(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_model(repo, "tok", "max_batch_size: 8\ninstance_group [ { count: 2 kind: KIND_CPU } ]\n" + queue(32))
    write_model(repo, "enc", "max_batch_size: 8\ninstance_group { count: 1 kind: KIND_GPU }\n" + queue(16))
    write_model(repo, "post", "max_batch_size: 8\n" + queue(48))
    write_model(repo, "pipeline", ensemble("tok", "enc", "post"))
    write_model(repo, "outer", ensemble("pipeline", "post"))  # an ensemble of an ensemble
    write_model(repo, "images", "max_batch_size: 4\ninstance_group { count: 3 kind: KIND_CPU }\n" + queue(10))
    found = limits.limits(repo)
    assert {n: m["holds"] for n, m in found["models"].items()} == {
        "enc": 16, "images": 10, "outer": 16, "pipeline": 16, "post": 48, "tok": 32}
    assert {n for n, m in found["models"].items() if m["user_facing"]} == {"outer", "images"}
    assert found["capacity"] == (16 - 2) + (10 - 2)
    assert limits.limits(repo, reserve=0)["capacity"] == 26


def test_limits_py_counts_an_unbounded_queue_as_two_full_batches_per_instance(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_model(repo, "gpu", "max_batch_size: 16\ninstance_group { count: 2 kind: KIND_GPU }\ndynamic_batching { }\n")
    write_model(repo, "pinned", "max_batch_size: 16\ninstance_group { count: 1 kind: KIND_GPU gpus: [0, 1, 2] }\n"
                + queue(0))
    write_model(repo, "plain", "max_batch_size: 0\n")  # no batcher: one request at a time, one instance
    found = limits.limits(repo, gpus=4, reserve=0)["models"]
    assert found["gpu"]["holds"] == 2 * (2 * 4) * 16
    assert found["pinned"]["holds"] == 2 * 3 * 16
    assert found["plain"]["holds"] == 2
    assert "queue unbounded" in found["gpu"]["how"]


def test_limits_py_refuses_what_it_cannot_read_naming_it(tmp_path: Path) -> None:
    script = [sys.executable, str(DOCKER_EDGE / "limits.py")]
    empty = tmp_path / "empty"
    empty.mkdir()
    result = subprocess.run([*script, str(empty)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 1 and "holds no <model>/config.pbtxt" in result.stderr
    broken = tmp_path / "broken"
    write_model(broken, "pipeline", ensemble("missing"))
    result = subprocess.run([*script, str(broken)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 1 and "has a step 'missing' that the repository does not hold" in result.stderr
    result = subprocess.run([*script, "--capacity", str(ROOT / "model_repository")], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0 and result.stdout == f"{SHIPPED_CAPACITY}\n"


def test_limits_py_reads_config_pbtxt_as_protobuf_does() -> None:
    """The script's small text-format reader (the edge image has no protobuf) against tritonclient's ModelConfig."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    configs = sorted((ROOT / "model_repository").glob("*/config.pbtxt"))
    assert configs
    for path in configs:
        text = path.read_text()
        config = text_format.Parse(text, model_config_pb2.ModelConfig())
        model = limits.Model(config.name, limits.parse_pbtxt(text), str(path), gpus=1)
        assert model.max_batch_size == config.max_batch_size
        assert model.instances == (sum(g.count or 1 for g in config.instance_group) or 1)
        assert model.dynamic_batching == config.HasField("dynamic_batching")
        assert model.max_queue_size == config.dynamic_batching.default_queue_policy.max_queue_size
        assert model.steps == [step.model_name for step in config.ensemble_scheduling.step]


@pytest.mark.parametrize(("env", "says"), [
    ({"TRITONBUNDLE_EDGE_CONNECTIONS": "9000"}, "TRITONBUNDLE_EDGE_CONNECTIONS=9000 is over 8192"),
    ({"TRITONBUNDLE_EDGE_CAPACITY": "lots"}, "TRITONBUNDLE_EDGE_CAPACITY='lots' is not a positive whole number"),
    ({"TRITONBUNDLE_EDGE_CLIENT_REQUESTS": "0"}, "TRITONBUNDLE_EDGE_CLIENT_REQUESTS='0' is not a positive whole number"),
    ({"TRITONBUNDLE_EDGE_CLIENT_CONNECTIONS": "99999999"}, "TRITONBUNDLE_EDGE_CLIENT_CONNECTIONS='99999999' is over"),
    ({"TRITONBUNDLE_EDGE_TENANTS": "yes"}, "TRITONBUNDLE_EDGE_TENANTS='yes' is neither on nor off"),
    ({"TRITONBUNDLE_EDGE_TENANTS": "on"}, "TRITONBUNDLE_EDGE_TENANTS=on needs the gateway"),
    ({"TRITONBUNDLE_EDGE_GATEWAY": "gateway"}, "address 'gateway' has no port"),
])
def test_the_entry_point_refuses_a_bad_limit_naming_it(tmp_path: Path, env: dict[str, str], says: str) -> None:
    result = entrypoint(tmp_path, env, "--render")
    assert result.returncode == 2 and says in result.stderr, result.stderr


# -- the rendered configuration, checked by nginx itself -------------------------------------------
#: Set by .ci/run (which installs nginx with .ci/nginx.sh): a missing nginx fails these tests, never skips them.
REQUIRE_NGINX_ENV = "TRITONBUNDLE_REQUIRE_NGINX"


def nginx_with_stream() -> str:
    """nginx with the stream module; without one the test is skipped (failed under ``REQUIRE_NGINX_ENV``)."""
    missing = pytest.fail if os.environ.get(REQUIRE_NGINX_ENV) == "1" else pytest.skip
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(nginx).exists():
        missing("no nginx here (Debian: apt-get install nginx libnginx-mod-stream, or .ci/nginx.sh); "
                "tests/docker/test_edge.py runs the edge image")
    if not list(Path("/etc/nginx/modules-enabled").glob("*stream*")) and "--with-stream " not in subprocess.run(
            [nginx, "-V"], capture_output=True, text=True, timeout=30).stderr + " ":
        missing("this nginx has no stream module (Debian: apt-get install libnginx-mod-stream)")
    return nginx


def test_nginx_accepts_the_charts_and_the_compose_edges_configuration(helm: Path, tmp_path: Path) -> None:  # noqa: F811
    nginx = nginx_with_stream()
    chart, compose = tmp_path / "chart", tmp_path / "compose"
    chart.mkdir()
    for name, text in edge_config(render(helm, sets={"edge.limits.capacity": "40", "gateway.enabled": "true"})).items():
        (chart / name).write_text(text)
    compose_render(compose, {"TRITONBUNDLE_EDGE_CAPACITY": "40"})
    for folder in (chart, compose):
        result = subprocess.run([nginx, "-t", "-q", "-c", str(folder / "nginx.conf"), "-e", "stderr"],
                                capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, f"{folder.name}: {result.stderr}"


# -- the OpenAI API's gateway behind the edge -------------------------------------------------------
def test_without_a_gateway_v1_answers_404_at_the_edge_and_with_one_it_goes_to_the_gateway(helm: Path) -> None:  # noqa: F811
    off = edge_config(render(helm))["settings.conf"]
    assert "server 127.0.0.1:9;" in off and 'default "off";' in off
    tenants = edge_config(render(helm, sets={"gateway.enabled": "true", "gateway.tenants.existingSecret": "t"}))
    assert "$edge_tenants {\n    default \"on\";" in tenants["settings.conf"]
    assert "$edge_tenants {\n    default \"off\";" in edge_config(render(helm, sets={"gateway.enabled": "true"}))["settings.conf"]
    on = edge_config(render(helm, sets={"gateway.enabled": "true", "gateway.port": "8095"}))["settings.conf"]
    assert "server 127.0.0.1:8095;" in on and 'default "127.0.0.1:8095";' in on
    nginx = edge_config(render(helm))["nginx.conf"]
    location = nginx[nginx.index("location /v1/ {"):]
    assert location.index('if ($edge_gateway = "off")') < location.index("proxy_pass http://openai_gateway;")
    assert '"code":"not_enabled"' in location


def test_the_gateway_runs_beside_triton_with_its_tenants_secret_and_metrics_port(helm: Path) -> None:  # noqa: F811
    docs = render(helm, sets={"gateway.enabled": "true", "gateway.tenants.existingSecret": "my-tenants",
                              "gateway.models[0]": "minilm", "gateway.models[1]": "e5"})
    spec = workload(docs)["spec"]["template"]["spec"]
    gateway = next(c for c in spec["containers"] if c["name"] == "gateway")
    args = gateway["command"][gateway["command"].index("tritonbundle"):]  # after the wait for Triton
    assert args[:2] == ["tritonbundle", "gateway"] and args[args.index("--url") + 1] == "127.0.0.1:8001"
    assert args[args.index("--host") + 1] == "127.0.0.1" and args[args.index("--metrics-host") + 1] == "0.0.0.0"
    assert [args[i + 1] for i, a in enumerate(args) if a == "--model"] == ["minilm", "e5"]
    assert {"name": "TRITONBUNDLE_TENANTS", "value": "/etc/tritonbundle/tenants/tenants.yaml"} in gateway["env"]
    mounts = {m["mountPath"]: m["name"] for m in gateway["volumeMounts"]}
    assert mounts["/etc/tritonbundle/tenants"] == "gateway-tenants"
    volume = next(v for v in spec["volumes"] if v["name"] == "gateway-tenants")
    assert volume["secret"]["secretName"] == "my-tenants"
    assert gateway["ports"] == [{"name": "gateway-metrics", "containerPort": 9091, "protocol": "TCP"}]
    assert gateway["securityContext"]["readOnlyRootFilesystem"] is True
    none = workload(render(helm))["spec"]["template"]["spec"]["containers"]
    assert "gateway" not in [c["name"] for c in none], "off by default"
    refused = template(helm, sets={"gateway.enabled": "true", "edge.enabled": "false"}, check=False)
    assert refused.returncode != 0 and "gateway.enabled needs edge.enabled" in refused.stderr


def test_the_network_policy_opens_the_edge_ports_and_metrics_only_to_monitoring(helm: Path) -> None:  # noqa: F811
    assert not objects(render(helm), "NetworkPolicy"), "off by default"
    docs = render(helm, sets={"networkPolicy.enabled": "true", "gateway.enabled": "true",
                              "networkPolicy.clients[0].namespaceSelector.matchLabels.team": "search"})
    (policy,) = objects(docs, "NetworkPolicy")
    inference, metrics = policy["spec"]["ingress"]
    assert [p["port"] for p in inference["ports"]] == ["http", "grpc"]
    assert inference["from"][0] == {"namespaceSelector": {"matchLabels": {"team": "search"}}}
    assert [p["port"] for p in metrics["ports"]] == ["metrics", "gateway-metrics"]
    assert metrics["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    named = {p["name"] for c in workload(docs)["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
    assert {"http", "grpc", "metrics", "gateway-metrics"} <= named, "every port the policy names exists"


def _gateway(docs: list[Obj]) -> Obj:
    return next(c for c in workload(docs)["spec"]["template"]["spec"]["containers"] if c["name"] == "gateway")


def test_the_gateway_waits_for_triton_as_long_as_its_startup_may_take_then_starts(helm: Path, tmp_path: Path) -> None:  # noqa: F811
    """The gateway checks Triton at start and exits after its 30 s connect deadline: started beside a Triton that
    loads for minutes it crash-loops. It waits for Triton's readiness first (probes.startup.budgetSeconds),
    and its startup probe holds its liveness back meanwhile."""
    docs = render(helm, "gateway-tenants-values.yaml", sets={"probes.startup.budgetSeconds": "1200"})
    gateway = _gateway(docs)
    command = gateway["command"]
    assert command[:2] == ["python3", "-c"] and command[3:5] == ["http://127.0.0.1:8000/v2/health/ready", "1200"]
    assert command[5:7] == ["tritonbundle", "gateway"] and "--timeout-s" not in command, "30 s per call stays"
    startup, liveness = gateway["startupProbe"], gateway["livenessProbe"]
    assert startup["tcpSocket"] == liveness["tcpSocket"] == {"port": "gateway-metrics"}
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1200 + 30
    # The wait, run for real: a Triton that answers 503 twice, then 200; then the command it execs.
    ready = tmp_path / "ready"
    server = subprocess.Popen([sys.executable, "-c", _FLIPPING_SERVER, str(ready)], stdout=subprocess.PIPE, text=True)
    try:
        port = server.stdout.readline().strip() if server.stdout else ""
        argv = [sys.executable, "-c", command[2], f"http://127.0.0.1:{port}/v2/health/ready", "30",
                sys.executable, "-c", "print('the gateway started')"]
        started = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert started.returncode == 0 and "the gateway started" in started.stdout, started.stdout + started.stderr
        assert int(ready.read_text()) >= 3, "it waited through the 503s"
        late = subprocess.run([*argv[:4], "0.5", *argv[5:]], capture_output=True, text=True, timeout=30)
        assert late.returncode == 0  # ready by now
        gone = subprocess.run([*argv[:3], "http://127.0.0.1:9/v2/health/ready", "0.5", *argv[5:]],
                              capture_output=True, text=True, timeout=30)
        assert gone.returncode == 1 and "probes.startup.budgetSeconds" in gone.stderr
        assert "the gateway started" not in gone.stdout
    finally:
        server.kill()
        server.wait()


_FLIPPING_SERVER = """
import http.server, pathlib, sys
count = pathlib.Path(sys.argv[1])
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        n = int(count.read_text()) + 1 if count.exists() else 1
        count.write_text(str(n))
        self.send_response(200 if n >= 3 else 503)
        self.send_header("Content-Length", "0")
        self.end_headers()
s = http.server.HTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""


def test_every_serving_container_keeps_answering_while_the_endpoints_are_updated(helm: Path) -> None:  # noqa: F811
    """tritonserver and the edge sleep lifecycle.preStopSleepSeconds before their SIGTERM; the gateway too, or a
    terminating pod answers /v1 with 503 while the Service still sends it requests."""
    docs = render(helm, "gateway-tenants-values.yaml", sets={"lifecycle.preStopSleepSeconds": "12"})
    containers = workload(docs)["spec"]["template"]["spec"]["containers"]
    assert {c["name"] for c in containers} == {"tritonserver", "edge", "gateway"}
    for c in containers:
        assert c["lifecycle"]["preStop"] == {"exec": {"command": ["/bin/sleep", "12"]}}, c["name"]


def test_the_network_policy_with_clients_lets_in_the_releases_test_pod_and_analysis_job(helm: Path) -> None:  # noqa: F811
    sets = {"networkPolicy.enabled": "true", "networkPolicy.clients[0].namespaceSelector.matchLabels.team": "search",
            "rollout.strategy": "canary", "replicaCount": "2", "modelRepository.pvc.accessModes[0]": "ReadWriteMany",
            "metrics.podMonitor.enabled": "true"}
    docs = render(helm, sets=sets)
    (policy,) = objects(docs, "NetworkPolicy")
    allowed = policy["spec"]["ingress"][0]["from"]
    (test_pod,) = objects(docs, "Pod")
    (analysis,) = objects(docs, "AnalysisTemplate")
    job = next(m for m in analysis["spec"]["metrics"] if m["name"] == "canary")["provider"]["job"]["spec"]["template"]
    server = workload(docs)["spec"]["template"]["metadata"]["labels"]
    for labels in (test_pod["metadata"]["labels"], job["metadata"]["labels"]):
        assert any(_selects(entry, labels) for entry in allowed), labels
    assert not any(_selects(entry, server) for entry in allowed if "podSelector" in entry), "only the callers"
    outsider = {**test_pod["metadata"]["labels"], "app.kubernetes.io/instance": "other"}
    assert not any(_selects(entry, outsider) for entry in allowed)


def _selects(entry: Obj, labels: dict[str, str]) -> bool:
    """Whether a NetworkPolicy peer with a podSelector only (same namespace) selects a pod with these labels."""
    if set(entry) != {"podSelector"}:
        return False
    selector = entry["podSelector"]
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        assert e["operator"] == "In"
        if labels.get(e["key"]) not in e["values"]:
            return False
    return True


def test_helm_test_sends_a_tenants_key_or_says_why_it_skips_inference(helm: Path) -> None:  # noqa: F811
    """With gateway tenants the edge answers inference without a tenant's key 401: the test pod sends the one
    tests.tenantKey names, or skips its inference with the reason (never a 401 failure)."""
    def env(*values: str, **sets: str) -> dict[str, Obj]:
        (pod,) = objects(render(helm, *values, sets=sets), "Pod")
        return {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}

    plain = env()
    assert "TENANT_KEY" not in plain and "SKIP_INFERENCE" not in plain
    skipped = env("gateway-tenants-values.yaml")
    assert "TENANT_KEY" not in skipped and "tests.tenantKey.existingSecret" in skipped["SKIP_INFERENCE"]["value"]
    keyed = env("gateway-tenants-values.yaml", **{"tests.tenantKey.existingSecret": "helm-test-tenant"})
    assert keyed["TENANT_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "helm-test-tenant", "key": "key"}}
    assert "SKIP_INFERENCE" not in keyed
