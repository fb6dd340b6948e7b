"""The Helm chart (helm/tritonbundle), checked offline: no Kubernetes cluster can run here.

`helm lint --strict` and `helm template` over every ci/*-values.yaml scenario; every rendered object
validated against the Kubernetes 1.29 and 1.35 OpenAPI schemas (kubernetes-validate, strict: unknown
fields are errors); the custom resources (ServiceMonitor, PodMonitor, PrometheusRule, ScaledObject), which
those schemas do not cover, checked structurally; policy checks on the rendered pods; the values schema
rejecting bad values with a message naming the key; the init-container and `helm test` scripts run for real.
The helm binary comes from helm/fetch-tools.sh (pinned, into the git-ignored .tools/bin).
"""

from __future__ import annotations

import base64
import functools
import http.server
import json
import math
import os
import re
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.conftest import one_process_at_a_time

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "tritonbundle"
FETCH_TOOLS = ROOT / "helm" / "fetch-tools.sh"
TOOLS_BIN = ROOT / ".tools" / "bin"
SCENARIOS = sorted(p.name for p in (CHART / "ci").glob("*-values.yaml"))
#: The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest kubectl it is fetched with.
K8S_VERSIONS = ("1.29", "1.35")
#: Custom resources: kubernetes-validate ships only the core API schemas, so these are checked structurally.
CUSTOM_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ScaledObject", "Rollout", "AnalysisTemplate"}
#: What the monitors copy from the pods onto the series (the last only with an Argo Rollout).
POD_TARGET_LABELS = {"app.kubernetes.io/name", "app.kubernetes.io/instance"}
RELEASE, NAMESPACE = "emb", "inference"
FULLNAME = f"{RELEASE}-tritonbundle"
GPU = "nvidia.com/gpu"
HELM_TIMEOUT_S = 60

Obj = dict[str, Any]


# -- rendering ------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def helm() -> Path:
    """The pinned helm binary; helm/fetch-tools.sh fetches it once (a no-op when already there)."""
    with one_process_at_a_time("helm-tools"):
        result = subprocess.run([str(FETCH_TOOLS)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"helm/fetch-tools.sh failed:\n{result.stdout}\n{result.stderr}"
    return TOOLS_BIN / "helm"


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=HELM_TIMEOUT_S)


def template(helm: Path, *values: str, sets: dict[str, str] | None = None,
             set_strings: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for name in values:
        path = Path(name) if Path(name).is_absolute() else CHART / "ci" / name
        args += ["-f", str(path)]
    for key, value in (sets or {}).items():
        args += ["--set", f"{key}={value}"]
    for key, value in (set_strings or {}).items():
        args += ["--set-string", f"{key}={value}"]
    result = run_helm(helm, *args)
    if check:
        assert result.returncode == 0, result.stderr
    return result


#: libyaml's parser: the pure-Python one is most of this module's run time.
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def render(helm: Path, *values: str, sets: dict[str, str] | None = None) -> list[Obj]:
    return [doc for doc in yaml.load_all(template(helm, *values, sets=sets).stdout, Loader=LOADER) if doc]


@pytest.fixture(scope="session")
def rendered(helm: Path) -> dict[str, list[Obj]]:
    """Every scenario rendered once (in parallel); "defaults" is values.yaml alone."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        docs = pool.map(lambda name: render(helm, *([name] if name != "defaults" else [])), ALL)
        return dict(zip(ALL, docs))


@pytest.fixture(scope="session")
def lint(helm: Path) -> dict[str, subprocess.CompletedProcess[str]]:
    """`helm lint --strict` of every scenario (in parallel)."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = pool.map(lambda name: run_helm(helm, "lint", "--strict", str(CHART), "-f", str(CHART / "ci" / name)), SCENARIOS)
        return dict(zip(SCENARIOS, results))


def objects(docs: list[Obj], kind: str) -> list[Obj]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[Obj], kind: str) -> Obj:
    found = objects(docs, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def workload(docs: list[Obj]) -> Obj:
    found = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    assert len(found) == 1
    return found[0]


def server_container(docs: list[Obj]) -> Obj:
    containers = workload(docs)["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "tritonserver")


def pod_specs(docs: list[Obj]) -> list[Obj]:
    """The server pod template and the `helm test` pod."""
    return [workload(docs)["spec"]["template"]["spec"], *(d["spec"] for d in objects(docs, "Pod"))]


def all_containers(docs: list[Obj]) -> Iterator[tuple[Obj, Obj]]:
    for spec in pod_specs(docs):
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            yield spec, c


def flags(container: Obj) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for arg in container["args"]:
        name, _, value = arg.partition("=")
        out.setdefault(name, []).append(value)
    return out


@functools.cache
def _values_text() -> str:
    return (CHART / "values.yaml").read_text()


def values_yaml() -> Obj:
    return yaml.load(_values_text(), Loader=LOADER)


def ci_values(name: str) -> Obj:
    return yaml.safe_load((CHART / "ci" / name).read_text()) or {}


def max_replicas(values: Obj) -> int:
    defaults = values_yaml()
    autoscaling = {**defaults["autoscaling"], **values.get("autoscaling", {})}
    if autoscaling["enabled"]:
        return int(autoscaling["maxReplicas"])
    return int(values.get("replicaCount", defaults["replicaCount"]))


ALL = ["defaults", *SCENARIOS]


# -- the tools ------------------------------------------------------------------------------------
def test_fetch_tools_provides_the_pinned_helm_and_kubectl_and_is_idempotent(helm: Path) -> None:
    version = run_helm(helm, "version", "--template", "{{.Version}}")
    assert version.stdout.strip() == "v4.1.4"
    kubectl = subprocess.run([str(TOOLS_BIN / "kubectl"), "version", "--client", "-o", "json"],
                             capture_output=True, text=True, timeout=30)
    assert json.loads(kubectl.stdout)["clientVersion"]["gitVersion"].startswith("v1.35.")
    again = subprocess.run([str(FETCH_TOOLS)], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "nothing to do" in again.stdout


def test_ci_scenarios_cover_the_issue_list() -> None:
    for name in ("minimal", "autoscaling-monitoring", "object-store", "multi-replica-pdb", "keda"):
        assert f"{name}-values.yaml" in SCENARIOS


# -- lint, render, validate ------------------------------------------------------------------------
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_helm_lint_strict_passes_for_every_scenario(lint: dict[str, subprocess.CompletedProcess[str]], scenario: str) -> None:
    result = lint[scenario]
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("scenario", ALL)
def test_every_rendered_object_is_valid_kubernetes(rendered: dict[str, list[Obj]], scenario: str, version: str) -> None:
    checked = []
    for doc in rendered[scenario]:
        if doc["kind"] in CUSTOM_KINDS:
            continue  # no schema in kubernetes-validate: see test_custom_resources_have_the_fields_their_operators_read
        try:
            used = kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} is invalid for Kubernetes {version}: {path}: {e.message}")
        assert used == version, f"kubernetes-validate used the {used} schemas for {version}"
        checked.append(doc["kind"])
    assert "Service" in checked and ("Deployment" in checked or "StatefulSet" in checked)


def test_custom_resources_have_the_fields_their_operators_read(rendered: dict[str, list[Obj]]) -> None:
    seen = set()
    for docs in rendered.values():
        for doc in docs:
            kind, spec = doc["kind"], doc.get("spec", {})
            if kind not in CUSTOM_KINDS:
                continue
            seen.add(kind)
            assert doc["metadata"]["name"] == FULLNAME
            if kind == "ServiceMonitor":
                assert doc["apiVersion"] == "monitoring.coreos.com/v1"
                assert spec["selector"]["matchLabels"] == {"app.kubernetes.io/name": "tritonbundle",
                                                          "app.kubernetes.io/instance": RELEASE}
                assert spec["namespaceSelector"]["matchNames"] == [NAMESPACE]
                assert [e["port"] for e in spec["endpoints"]] == ["metrics"]
                assert set(spec["podTargetLabels"]) - {"rollouts-pod-template-hash"} == POD_TARGET_LABELS
            elif kind == "PodMonitor":
                assert doc["apiVersion"] == "monitoring.coreos.com/v1"
                assert [e["port"] for e in spec["podMetricsEndpoints"]] == ["metrics"]
                assert set(spec["podTargetLabels"]) - {"rollouts-pod-template-hash"} == POD_TARGET_LABELS
            elif kind == "PrometheusRule":
                assert doc["apiVersion"] == "monitoring.coreos.com/v1"
                for group in spec["groups"]:
                    assert group["name"] and group["rules"]
                    for rule in group["rules"]:
                        assert ("record" in rule) != ("alert" in rule) and rule["expr"].strip()
                        assert _balanced(rule["expr"]), rule["expr"]
                        if "record" in rule:
                            assert re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", rule["record"])
            elif kind == "ScaledObject":
                assert doc["apiVersion"] == "keda.sh/v1alpha1"
                assert {"apiVersion", "kind", "name"} <= set(spec["scaleTargetRef"])
                assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
                (trigger,) = spec["triggers"]
                assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
                assert {"serverAddress", "query", "threshold"} <= set(trigger["metadata"])
                assert all(isinstance(v, str) for v in trigger["metadata"].values())
                assert _balanced(trigger["metadata"]["query"])
    assert seen == CUSTOM_KINDS


def _balanced(promql: str) -> bool:
    depth = {"(": 0, "{": 0, "[": 0}
    closing = {")": "(", "}": "{", "]": "["}
    for ch in re.sub(r'"[^"]*"', '""', promql):
        if ch in depth:
            depth[ch] += 1
        elif ch in closing:
            depth[closing[ch]] -= 1
            if depth[closing[ch]] < 0:
                return False
    return not any(depth.values())


# -- policy ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("scenario", ALL)
def test_server_has_a_startup_probe_on_readiness_then_liveness_and_readiness_through_the_canary(
    rendered: dict[str, list[Obj]], scenario: str,
) -> None:
    """Startup waits for /v2/health/ready (the models loaded); liveness and readiness then exec the canary,
    which sends every served model its smallest request: /v2/health/ready says ready while a Python-backend
    stub is dead (Triton before NGC 26.04), /v2/health/live never looks at the models."""
    docs = rendered[scenario]
    c = server_container(docs)
    assert _health_probe(c["startupProbe"], docs) == "/v2/health/ready"
    # Sized for plan loading: the startup budget (15 min by default) before liveness takes over.
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= values_yaml()["probes"]["startup"]["budgetSeconds"]
    liveness, readiness = c["livenessProbe"], c["readinessProbe"]
    assert "httpGet" not in liveness and "httpGet" not in readiness
    assert liveness["exec"]["command"] == readiness["exec"]["command"]
    command = liveness["exec"]["command"]
    assert command[:4] == ["python3", f"{SCRIPTS_DIR}/canary.py", "--url", "http://127.0.0.1:8000"]
    assert f"--http-port={command[3].rsplit(':', 1)[1]}" in c["args"]
    models = ci_values(scenario).get("probes", {}).get("canary", {}).get("models") if scenario != "defaults" else None
    served = flags(c)["--model-repository"][0]
    if served.startswith("s3://"):
        # The repository is in the bucket: the values name the models.
        assert models and _canary_targets(command) == [x for m in models for x in ("--model", m)]
    else:
        assert _canary_targets(command) == ["--repository", served]
        assert any(served == m["mountPath"] or served.startswith(m["mountPath"] + "/") for m in c["volumeMounts"]) \
            or scenario == "baked-image-values.yaml", "the repository the canary reads is inside the pod"
    # A dead stub's 500 comes after the Python backend's 1 s stub check: a shorter timeout would call it
    # busy. Three requests per model (ready, config, inference) could outlast the probe: the check's
    # deadline (--deadline-s) is inside the shorter probe timeout and holds one model's worst case.
    request_timeout = float(command[command.index("--timeout-s") + 1])
    deadline = float(command[command.index("--deadline-s") + 1])
    assert "--server-cpu" in command, "a long execute() (its processes busy) is busy, not hung"
    assert request_timeout >= 2
    for probe in (liveness, readiness):
        assert 5 * request_timeout <= deadline <= probe["timeoutSeconds"] - 2
    assert _scripts(docs)["data"]["canary.py"] == CANARY.read_text()


def _edge_enabled(docs: list[Obj]) -> bool:
    return any(c["name"] == "edge" for c in workload(docs)["spec"]["template"]["spec"]["containers"])


def _health_probe(probe: Obj, docs: list[Obj]) -> str:
    """The Triton health path a probe requests. Without the edge: httpGet on the http port. With it Triton's
    HTTP port listens on 127.0.0.1 only, out of the kubelet's reach: the same GET from inside the container."""
    http_port = flags(server_container(docs))["--http-port"][0]
    if not _edge_enabled(docs):
        assert "exec" not in probe and probe["httpGet"]["port"] == "http", probe
        return str(probe["httpGet"]["path"])
    assert "httpGet" not in probe, probe
    python3, dash_c, code, url, timeout = probe["exec"]["command"]
    assert (python3, dash_c) == ("python3", "-c") and "urllib.request.urlopen(sys.argv[1]" in code
    assert float(timeout) <= probe["timeoutSeconds"]
    prefix = f"http://127.0.0.1:{http_port}"
    assert url.startswith(prefix + "/"), url
    return str(url.removeprefix(prefix))


def _run_health_probe(probe: Obj, port: int) -> subprocess.CompletedProcess[str]:
    """An exec health probe as the kubelet runs it, against a server on ``port``."""
    argv = [sys.executable if a == "python3" else a for a in probe["exec"]["command"]]
    argv = [re.sub(r"127\.0\.0\.1:\d+", f"127.0.0.1:{port}", a) for a in argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, env={"PATH": os.environ["PATH"]})


def _canary_targets(command: list[str]) -> list[str]:
    """The canary's --repository / --model arguments."""
    out = []
    for i, arg in enumerate(command):
        if arg in ("--repository", "--model"):
            out += [arg, command[i + 1]]
    return out


def test_canary_probes_switch_back_to_tritons_health_endpoints(helm: Path) -> None:
    for edge in ("true", "false"):
        docs = render(helm, sets={"probes.canary.enabled": "false", "edge.enabled": edge})
        c = server_container(docs)
        assert _health_probe(c["livenessProbe"], docs) == "/v2/health/live"
        assert _health_probe(c["readinessProbe"], docs) == "/v2/health/ready"
        assert "canary.py" not in " ".join(c["livenessProbe"].get("exec", {}).get("command", []))
        assert "canary.py" not in _scripts(docs)["data"]
    docs = render(helm, sets={"probes.canary.enabled": "false", "edge.enabled": "false"})
    assert server_container(docs)["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    # Nor is the canary needed for an object store then.
    render(helm, "object-store-values.yaml", sets={"probes.canary.enabled": "false", "probes.canary.models": "null"})


def test_canary_follows_the_http_port_the_request_timeout_and_the_models_asked_for(helm: Path, tmp_path: Path) -> None:
    values = _write_values(tmp_path, "server:\n  ports:\n    http: 9000\n"
                                     "probes:\n  canary:\n    requestTimeoutSeconds: 0.5\n    models: [minilm]\n")
    docs = render(helm, values)
    command = server_container(docs)["livenessProbe"]["exec"]["command"]
    assert command[2:8] == ["--url", "http://127.0.0.1:9000", "--timeout-s", "0.5", "--deadline-s", "18"]
    assert _canary_targets(command) == ["--model", "minilm"]
    # Explicit model control: the models loaded at start, not every folder of the repository.
    docs = render(helm, sets={"server.modelControlMode": "explicit", "server.loadModels": "{minilm,minilm_encoder}"})
    command = server_container(docs)["readinessProbe"]["exec"]["command"]
    assert _canary_targets(command) == ["--model", "minilm", "--model", "minilm_encoder"]
    docs = render(helm, sets={"server.modelControlMode": "explicit", "server.loadModels": "{*}"})
    command = server_container(docs)["readinessProbe"]["exec"]["command"]
    assert _canary_targets(command) == ["--repository", "/run/tritonbundle/model_repository"]


class _JsonHandler(http.server.BaseHTTPRequestHandler):
    """A stand-in Triton's plumbing: quiet, answering JSON."""

    def log_message(self, *args: object) -> None:
        pass

    def _reply(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _ModelControlTriton(_JsonHandler):
    """A Triton in poll mode: model ``served`` loaded (dead when ``dead``), ``new`` a folder not loaded yet,
    ``broken`` one that failed to load; the repository index needs the restricted API's key."""

    key, dead = "s3cret", False

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/v2/models/served/ready":
            self._reply(400 if self.dead else 200, {})
        elif self.path == "/v2/models/served/config":
            self._reply(200, {"max_batch_size": 0, "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [1]}]})
        else:  # Triton: a model that is not loaded is "not ready" (HTTP 400)
            self._reply(400, {"error": "Request for unknown model"})

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/v2/repository/index":
            if self.headers.get("tritonbundle-key") != self.key:
                self._reply(401, {"error": "This API is restricted"})
                return
            self._reply(200, [{"name": "broken", "version": "1", "state": "UNAVAILABLE", "reason": "failed to load"},
                              {"name": "new"}, {"name": "served", "version": "1", "state": "READY"}])
        elif self.path == "/v2/models/served/infer":
            self._reply(200, {"outputs": []})
        else:
            self._reply(400, {"error": "Request for unknown model"})


@pytest.mark.parametrize("mode", ["poll", "explicit"])
def test_canary_with_model_control_probes_only_the_loaded_models(helm: Path, tmp_path: Path, mode: str) -> None:
    """poll (or explicit with ["*"]): the repository holds folders Triton has not loaded (copied in before the
    next poll, failed to load). Probing them (HTTP 400 from /ready, "not ready") failed liveness and readiness
    on every replica; the canary asks Triton's repository index (with the restricted API's key) and probes the
    READY ones, still failing a loaded model that cannot answer."""
    sets = {"server.modelControlMode": mode} | ({"server.loadModels": "{*}"} if mode == "explicit" else {})
    docs = render(helm, sets=sets)
    c = server_container(docs)
    command = c["livenessProbe"]["exec"]["command"]
    assert command == c["readinessProbe"]["exec"]["command"]
    assert "--loaded" in command and command[command.index("--api-header") + 1] == "tritonbundle-key"
    assert any(e["name"] == "TRITONBUNDLE_API_KEY" for e in c["env"]), "the probe's exec sees the key"
    assert "--loaded" not in server_container(render(helm))["livenessProbe"]["exec"]["command"], \
        "model control none: every folder is loaded at start, or the server does not start"
    repository = tmp_path / "model_repository"
    for model in ("broken", "new", "served"):
        (repository / model).mkdir(parents=True)
        (repository / model / "config.pbtxt").write_text(f'name: "{model}"\n')
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ModelControlTriton)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    argv = [sys.executable if a == "python3" else str(CANARY) if a == f"{SCRIPTS_DIR}/canary.py" else a for a in command]
    argv = [str(repository) if a == "/run/tritonbundle/model_repository" else a for a in argv]
    argv = [re.sub(r"127\.0\.0\.1:\d+", f"127.0.0.1:{port}", a) for a in argv]

    def probe(key: str) -> subprocess.CompletedProcess[str]:
        env = {"PATH": os.environ["PATH"], "TRITONBUNDLE_API_KEY": key}
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env)

    try:
        ok = probe("s3cret")
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert "1 of 3 models answered" in ok.stdout and "new: not probed: Triton has not loaded it" in ok.stderr and "failed to load" in ok.stderr
        _ModelControlTriton.dead = True
        dead = probe("s3cret")
        assert dead.returncode == 1 and "served: NotReadyError: model not ready" in dead.stderr, dead.stderr
        _ModelControlTriton.dead = False
        wrong_key = probe("nope")  # a refusal is no sign of the server's health, and names the fix
        assert wrong_key.returncode == 0 and "$TRITONBUNDLE_API_KEY" in wrong_key.stderr
    finally:
        _ModelControlTriton.dead = False
        server.shutdown()
        server.server_close()
    server_gone = probe("s3cret")
    assert server_gone.returncode == 1, "no server at all is fatal"


def test_canary_with_an_object_store_and_no_models_is_refused_with_the_fix(helm: Path) -> None:
    result = template(helm, "object-store-values.yaml", sets={"probes.canary.models": "null"}, check=False)
    assert result.returncode != 0
    assert "probes.canary.models" in result.stderr and "probes.canary.enabled=false" in result.stderr


def test_startup_probe_budget_comes_from_values(helm: Path) -> None:
    docs = render(helm, sets={"probes.startup.budgetSeconds": "1801", "probes.startup.periodSeconds": "15"})
    startup = server_container(docs)["startupProbe"]
    assert (startup["periodSeconds"], startup["failureThreshold"]) == (15, 121)  # ceil(1801 / 15)


@pytest.mark.parametrize("scenario", ALL)
def test_server_has_a_gpu_limit_and_cpu_memory_requests(rendered: dict[str, list[Obj]], scenario: str) -> None:
    resources = server_container(rendered[scenario])["resources"]
    assert resources["limits"][GPU] >= 1
    assert {"cpu", "memory"} <= set(resources["requests"])
    for init in workload(rendered[scenario])["spec"]["template"]["spec"].get("initContainers", []):
        if init["name"] == "engine-build":  # builds on the GPU that will serve the plans
            assert init["resources"]["limits"][GPU] == resources["limits"][GPU]


@pytest.mark.parametrize("scenario", ALL)
def test_every_container_runs_non_root_read_only_without_capabilities(rendered: dict[str, list[Obj]], scenario: str) -> None:
    for spec in pod_specs(rendered[scenario]):
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] == 1000
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["automountServiceAccountToken"] is False
        assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
    for _, c in all_containers(rendered[scenario]):
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 1000, c["name"]
        assert sc["allowPrivilegeEscalation"] is False, c["name"]
        assert sc.get("privileged", False) is False, c["name"]
        assert sc["capabilities"]["drop"] == ["ALL"] and not sc["capabilities"].get("add"), c["name"]
        assert sc["readOnlyRootFilesystem"] is True, c["name"]
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, c["name"]
        # A read-only root needs a writable /tmp.
        assert "/tmp" in {m["mountPath"] for m in c["volumeMounts"]}, c["name"]


@pytest.mark.parametrize("scenario", ALL)
def test_dev_shm_is_a_memory_backed_emptydir_with_a_size_limit(rendered: dict[str, list[Obj]], scenario: str) -> None:
    spec = workload(rendered[scenario])["spec"]["template"]["spec"]
    shm = next(v for v in spec["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"]["medium"] == "Memory" and shm["emptyDir"]["sizeLimit"]
    mounts = {m["mountPath"]: m["name"] for m in server_container(rendered[scenario])["volumeMounts"]}
    assert mounts["/dev/shm"] == "shm"
    assert all("sizeLimit" in v["emptyDir"] for v in spec["volumes"] if "emptyDir" in v)


@pytest.mark.parametrize("scenario", ALL)
def test_no_image_is_tagless_or_latest(rendered: dict[str, list[Obj]], scenario: str) -> None:
    for _, c in all_containers(rendered[scenario]):
        image = c["image"]
        name = image.split("@")[0]
        last = name.rsplit("/", 1)[-1]
        assert ":" in last, f"{c['name']} image {image} has no tag"
        assert last.rsplit(":", 1)[1] != "latest", f"{c['name']} image {image} uses latest"


def test_latest_tag_is_refused(helm: Path) -> None:
    result = template(helm, sets={"image.tag": "latest"}, check=False)
    assert result.returncode != 0 and "tag" in result.stderr


def test_default_tritonserver_image_is_the_ngc_release_pinned_in_versions_env(rendered: dict[str, list[Obj]]) -> None:
    pinned = dict(
        line.split("=", 1) for line in (ROOT / "docker" / "versions.env").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )
    image = values_yaml()["image"]
    assert f"{image['registry']}/{image['repository']}:{image['tag']}" == pinned["TRITONSERVER_IMAGE"]
    assert image["tag"].startswith(pinned["NGC_RELEASE"] + "-")
    assert server_container(rendered["defaults"])["image"] == pinned["TRITONSERVER_IMAGE"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["annotations"]["tritonbundle/ngc-release"] == pinned["NGC_RELEASE"]
    assert chart["annotations"]["tritonbundle/tensorrt-version"] == pinned["TENSORRT_VERSION"]
    assert chart["annotations"]["tritonbundle/triton-version"] == pinned["TRITON_VERSION"]


def _init_images(docs: list[Obj]) -> dict[str, str]:
    return {c["name"]: c["image"] for c in workload(docs)["spec"]["template"]["spec"].get("initContainers", [])}


def test_build_image_defaults_to_the_app_version_and_the_ngc_release_of_the_server_image(
    helm: Path, rendered: dict[str, list[Obj]],
) -> None:
    """The build image makes the plans the server loads, so its default tag names the server's NGC release:
    <appVersion>-ngc<leading YY.MM of image.tag>, the tag docker/ gives the build image of that release."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    app_version, release = chart["appVersion"], chart["annotations"]["tritonbundle/ngc-release"]
    assert values_yaml()["image"]["tag"].startswith(release + "-")
    assert _init_images(rendered["defaults"]) == {"python-packages": f"tritonbundle-build:{app_version}-ngc{release}",
                                                  "engine-build": f"tritonbundle-build:{app_version}-ngc{release}"}
    assert _init_images(rendered["minimal-values.yaml"])["engine-build"] == (
        f"registry.example.com/ml/tritonbundle-build:{app_version}-ngc{release}")
    # The documented alternative release: the build image follows the server's tag.
    older = render(helm, sets={"image.tag": "25.08-py3"})
    assert set(_init_images(older).values()) == {f"tritonbundle-build:{app_version}-ngc25.08"}
    assert server_container(older)["image"] == "nvcr.io/nvidia/tritonserver:25.08-py3"
    # An explicit tag wins; a server tag with no YY.MM to derive one from needs it.
    custom = render(helm, sets={"image.tag": "my-server-1", "engineBuild.image.tag": "my-build-1"})
    assert set(_init_images(custom).values()) == {"tritonbundle-build:my-build-1"}
    refused = template(helm, sets={"image.tag": "my-server-1"}, check=False)
    assert refused.returncode != 0 and "engineBuild.image.tag" in refused.stderr and "NGC release" in refused.stderr
    # No init container, no build image: any server tag will do.
    assert not _init_images(render(helm, sets={"image.tag": "my-server-1", "engineBuild.enabled": "false",
                                               "pythonPackages.enabled": "false"}))


@pytest.mark.parametrize("scenario", ALL)
def test_renders_a_pdb_only_when_replicas_exceed_one(rendered: dict[str, list[Obj]], scenario: str) -> None:
    values = {} if scenario == "defaults" else ci_values(scenario)
    pdbs = objects(rendered[scenario], "PodDisruptionBudget")
    if max_replicas(values) > 1:
        (pdb,) = pdbs
        assert pdb["spec"]["selector"]["matchLabels"] == workload(rendered[scenario])["spec"]["selector"]["matchLabels"]
        assert pdb["spec"]["maxUnavailable"] == 1
    else:
        assert pdbs == []


@pytest.mark.parametrize(("sets", "expected"), [
    ({"replicaCount": "1"}, False),
    ({"replicaCount": "2", "workload.kind": "StatefulSet"}, True),
    ({"autoscaling.enabled": "true", "autoscaling.minReplicas": "1", "autoscaling.maxReplicas": "1"}, False),
    ({"autoscaling.enabled": "true", "autoscaling.minReplicas": "1", "autoscaling.maxReplicas": "3",
      "workload.kind": "StatefulSet"}, True),
    ({"replicaCount": "3", "workload.kind": "StatefulSet", "pdb.enabled": "false"}, False),
])
def test_pdb_follows_the_largest_replica_count(helm: Path, sets: dict[str, str], expected: bool) -> None:
    assert bool(objects(render(helm, sets=sets), "PodDisruptionBudget")) is expected


@pytest.mark.parametrize(("scenario", "kind"), [
    ("autoscaling-monitoring-values.yaml", "HorizontalPodAutoscaler"),
    ("keda-values.yaml", "ScaledObject"),
])
def test_autoscaler_targets_the_workload_by_kind_and_name(rendered: dict[str, list[Obj]], scenario: str, kind: str) -> None:
    docs = rendered[scenario]
    target = workload(docs)
    ref = one(docs, kind)["spec"]["scaleTargetRef"]
    assert (ref["apiVersion"], ref["kind"], ref["name"]) == ("apps/v1", target["kind"], target["metadata"]["name"])
    assert "replicas" not in target["spec"], "the autoscaler owns the replica count"


def test_hpa_scales_on_the_queue_compute_ratio_with_a_slow_scale_down(rendered: dict[str, list[Obj]]) -> None:
    hpa = one(rendered["autoscaling-monitoring-values.yaml"], "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == "tritonbundle_queue_compute_ratio"
    assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "500m"}
    behavior = hpa["spec"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 300
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] > behavior["scaleUp"]["stabilizationWindowSeconds"]


def test_hpa_targets_a_statefulset_when_the_workload_is_one(helm: Path) -> None:
    docs = render(helm, "autoscaling-monitoring-values.yaml", sets={"workload.kind": "StatefulSet"})
    assert one(docs, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]["kind"] == "StatefulSet"
    assert one(docs, "StatefulSet")["metadata"]["name"] == FULLNAME


def test_keda_query_is_the_queue_compute_ratio_of_this_release(rendered: dict[str, list[Obj]]) -> None:
    scaled = one(rendered["keda-values.yaml"], "ScaledObject")
    meta = scaled["spec"]["triggers"][0]["metadata"]
    query = meta["query"]
    assert "rate(nv_inference_queue_duration_us{" in query and "rate(nv_inference_compute_infer_duration_us{" in query
    assert f'namespace="{NAMESPACE}"' in query and f'app_kubernetes_io_instance="{RELEASE}"' in query
    assert 'model=~"minilm_encoder"' in query
    assert meta["threshold"] == "1"
    assert scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 300
    assert not objects(rendered["keda-values.yaml"], "HorizontalPodAutoscaler"), "KEDA creates its own HPA"


@pytest.mark.parametrize(("ratio", "threshold"), [("500m", "0.5"), ("1500m", "1.5"), ("0.75", "0.75"), ("2", "2")])
def test_keda_takes_the_ratio_as_a_decimal_where_the_hpa_takes_a_quantity(helm: Path, ratio: str, threshold: str) -> None:
    """KEDA's Prometheus scaler parses its threshold as a decimal: the quantity "500m" the HPA takes failed it."""
    result = template(helm, "keda-values.yaml", set_strings={"autoscaling.targetQueueComputeRatio": ratio})
    docs = [doc for doc in yaml.load_all(result.stdout, Loader=LOADER) if doc]
    assert one(docs, "ScaledObject")["spec"]["triggers"][0]["metadata"]["threshold"] == threshold


@pytest.mark.parametrize("scenario", ALL)
def test_restricted_api_flags_carry_the_key_from_a_secret(rendered: dict[str, list[Obj]], scenario: str) -> None:
    c = server_container(rendered[scenario])
    f = flags(c)
    apis = ["model-repository", "shared-memory", "trace", "logging"]
    assert f["--http-restricted-api"] == [f"{api}:tritonbundle-key=$(TRITONBUNDLE_API_KEY)" for api in apis]
    assert f["--grpc-restricted-protocol"] == [f"{api}:tritonbundle-key=$(TRITONBUNDLE_API_KEY)" for api in apis]
    env = {e["name"]: e for e in c["env"]}
    ref = env["TRITONBUNDLE_API_KEY"]["valueFrom"]["secretKeyRef"]
    values = {} if scenario == "defaults" else ci_values(scenario)
    existing = values.get("restrictedApi", {}).get("existingSecret")
    secrets = {s["metadata"]["name"]: s for s in objects(rendered[scenario], "Secret")}
    if existing:
        assert ref["name"] == existing and existing not in secrets
    else:
        data = secrets[ref["name"]]["data"][ref["key"]]
        assert len(base64.b64decode(data)) == 32


@pytest.mark.parametrize("scenario", ALL)
def test_model_control_mode_is_none_unless_asked(rendered: dict[str, list[Obj]], scenario: str) -> None:
    f = flags(server_container(rendered[scenario]))
    assert f["--model-control-mode"] == ["none"]
    assert "--load-model" not in f


def test_explicit_model_control_loads_the_listed_models(helm: Path) -> None:
    docs = render(helm, sets={"server.modelControlMode": "explicit", "server.loadModels[0]": "minilm"})
    f = flags(server_container(docs))
    assert f["--model-control-mode"] == ["explicit"] and f["--load-model"] == ["minilm"]
    refused = template(helm, sets={"server.modelControlMode": "explicit"}, check=False)
    assert refused.returncode != 0 and "server.loadModels" in refused.stderr


@pytest.mark.parametrize("scenario", ALL)
def test_grace_period_outlasts_the_prestop_sleep_and_tritons_exit_timeout(rendered: dict[str, list[Obj]], scenario: str) -> None:
    spec = workload(rendered[scenario])["spec"]["template"]["spec"]
    c = server_container(rendered[scenario])
    exit_timeout = int(flags(c)["--exit-timeout-secs"][0])
    sleep = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert spec["terminationGracePeriodSeconds"] > sleep + exit_timeout > exit_timeout


@pytest.mark.parametrize("sets", [
    {"terminationGracePeriodSeconds": "30"},
    {"server.exitTimeoutSeconds": "120"},
    {"terminationGracePeriodSeconds": "45", "lifecycle.preStopSleepSeconds": "15"},
])
def test_chart_refuses_a_grace_period_that_cuts_in_flight_requests(helm: Path, sets: dict[str, str]) -> None:
    result = template(helm, sets=sets, check=False)
    assert result.returncode != 0
    assert "terminationGracePeriodSeconds" in result.stderr and "exitTimeoutSeconds" in result.stderr


def _checksum(docs: list[Obj]) -> str:
    return str(workload(docs)["spec"]["template"]["metadata"]["annotations"]["checksum/config"])


def test_checksum_config_changes_when_the_pods_config_changes(helm: Path) -> None:
    base = _checksum(render(helm, sets={"restrictedApi.key": "first-key"}))
    assert _checksum(render(helm, sets={"restrictedApi.key": "first-key"})) == base, "deterministic"
    assert _checksum(render(helm, sets={"restrictedApi.key": "second-key"})) != base
    # The scripts ConfigMap changes (no engine-build.sh): the pods roll.
    assert _checksum(render(helm, sets={"restrictedApi.key": "first-key", "engineBuild.enabled": "false"})) != base
    # Not a config change: the same checksum.
    assert _checksum(render(helm, sets={"restrictedApi.key": "first-key", "replicaCount": "1"})) == base
    # The generated key is random under `helm template`; it must not make the checksum random.
    assert _checksum(render(helm)) == _checksum(render(helm))


# -- what each scenario wires ---------------------------------------------------------------------
def test_engine_build_init_container_builds_on_the_node_into_the_fingerprint_directory(rendered: dict[str, list[Obj]]) -> None:
    docs = rendered["defaults"]
    spec = workload(docs)["spec"]["template"]["spec"]
    inits = {c["name"]: c for c in spec["initContainers"]}
    build = inits["engine-build"]
    env = {e["name"]: e.get("value") for e in build["env"]}
    assert build["command"] == ["/opt/nvidia/nvidia_entrypoint.sh", "/bin/sh", "/opt/tritonbundle/scripts/engine-build.sh"]
    assert env["TRITONBUNDLE_CACHE_DIR"] == "/var/lib/tritonbundle/engines"
    assert env["TRITONBUNDLE_RUN_DIR"] == "/run/tritonbundle"
    script = _scripts(docs)["data"]["engine-build.sh"]
    assert "tritonbundle fingerprint" in script and "tritonbundle build --check" in script
    assert flags(server_container(docs))["--model-repository"] == ["/run/tritonbundle/model_repository"]
    server_mounts = {m["name"]: m for m in server_container(docs)["volumeMounts"]}
    assert server_mounts["model-cache"]["readOnly"] is True and server_mounts["run"]["readOnly"] is True
    assert inits["python-packages"]["args"] == ["tokenizers"]
    assert {e["name"]: e.get("value") for e in server_container(docs)["env"]}["PYTHONPATH"] == "/opt/tritonbundle/python"
    assert one(docs, "PersistentVolumeClaim")["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


SCRIPTS_DIR = "/opt/tritonbundle/scripts"
PLAN_CHECK = CHART / "files" / "tensorrt-plans.py"
SERVING_PY = ROOT / "tritonbundle" / "runtimes" / "tensorrt" / "serving.py"
CANARY = CHART / "files" / "canary.py"
CANARY_PY = ROOT / "tritonbundle" / "canary.py"


def _scripts(docs: list[Obj]) -> Obj:
    return next(c for c in objects(docs, "ConfigMap") if c["metadata"]["name"] == f"{FULLNAME}-scripts")


def test_chart_plan_check_is_a_byte_for_byte_copy_of_the_packages_serving_script() -> None:
    assert PLAN_CHECK.read_bytes() == SERVING_PY.read_bytes(), (
        "helm/tritonbundle/files/tensorrt-plans.py differs from tritonbundle/runtimes/tensorrt/serving.py; refresh "
        "the chart's copy: cp tritonbundle/runtimes/tensorrt/serving.py helm/tritonbundle/files/tensorrt-plans.py")


def test_chart_canary_is_a_byte_for_byte_copy_of_the_packages_canary() -> None:
    assert CANARY.read_bytes() == CANARY_PY.read_bytes(), (
        "helm/tritonbundle/files/canary.py differs from tritonbundle/canary.py; refresh the chart's copy: "
        "cp tritonbundle/canary.py helm/tritonbundle/files/canary.py")


#: What docker/entrypoint.sh hands over to in the NGC images (compose's path), and the chart's default.
NVIDIA_ENTRYPOINT = "/opt/nvidia/nvidia_entrypoint.sh"


def test_the_ngc_images_commands_start_through_nvidias_entrypoint_as_compose_does(helm: Path) -> None:
    """The chart replaces the images' entrypoint; NVIDIA's (driver checks, CUDA forward compatibility for a
    node on an older driver branch) must still run first, in the engine build and in the server."""
    entry = (ROOT / "docker" / "entrypoint.sh").read_text()
    assert f"[ -x {NVIDIA_ENTRYPOINT} ]" in entry and "exec $nvidia" in entry  # compose chains to the same script
    spec = workload(render(helm))["spec"]["template"]["spec"]
    build = next(c for c in spec["initContainers"] if c["name"] == "engine-build")
    assert build["command"] == [NVIDIA_ENTRYPOINT, "/bin/sh", f"{SCRIPTS_DIR}/engine-build.sh"]
    assert server_container(render(helm))["command"][0] == NVIDIA_ENTRYPOINT
    bare = workload(render(helm, sets={"nvidiaEntrypoint": ""}))["spec"]["template"]["spec"]
    assert next(c for c in bare["initContainers"] if c["name"] == "engine-build")["command"][0] == "/bin/sh"
    assert next(c for c in bare["containers"] if c["name"] == "tritonserver")["command"][0] == "python3"


@pytest.mark.parametrize("scenario", ALL)
def test_server_starts_through_the_plan_check_with_the_scripts_mounted_read_only(
    rendered: dict[str, list[Obj]], scenario: str,
) -> None:
    """Every source (pvc, s3, image) starts tritonserver through tensorrt-plans.py, which refuses plans another
    TensorRT built and adds the version-compatible backend flag; the arguments stay tritonserver's."""
    docs = rendered[scenario]
    c = server_container(docs)
    assert c["command"] == [NVIDIA_ENTRYPOINT, "python3", f"{SCRIPTS_DIR}/tensorrt-plans.py", "exec", "tritonserver"]
    assert c["args"][0].startswith("--model-repository=")
    assert "--backend-config=tensorrt,version-compatible=true" not in c["args"], "the script adds it when needed"
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["scripts"]["mountPath"] == SCRIPTS_DIR and mounts["scripts"]["readOnly"] is True
    volume = next(v for v in workload(docs)["spec"]["template"]["spec"]["volumes"] if v["name"] == "scripts")
    assert volume["configMap"]["name"] == f"{FULLNAME}-scripts"
    assert _scripts(docs)["data"]["tensorrt-plans.py"] == PLAN_CHECK.read_text()


def test_statefulset_gets_one_engine_cache_claim_per_replica_and_a_headless_service(rendered: dict[str, list[Obj]]) -> None:
    docs = rendered["multi-replica-pdb-values.yaml"]
    sts = one(docs, "StatefulSet")
    assert [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]] == ["model-cache"]
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    assert not objects(docs, "PersistentVolumeClaim")
    services = {s["metadata"]["name"]: s for s in objects(docs, "Service")}
    assert services[sts["spec"]["serviceName"]]["spec"]["clusterIP"] == "None"


def test_deployment_with_several_replicas_needs_a_shared_volume(helm: Path) -> None:
    result = template(helm, sets={"replicaCount": "2"}, check=False)
    assert result.returncode != 0 and "ReadWriteMany" in result.stderr
    docs = render(helm, sets={"replicaCount": "2", "modelRepository.pvc.accessModes[0]": "ReadWriteMany"})
    assert one(docs, "Deployment")["spec"]["replicas"] == 2


def test_a_single_node_cache_claim_replaces_the_pod_without_a_surge_and_refuses_one(helm: Path) -> None:
    """The default ReadWriteOnce claim mounts on one node: a surge pod scheduled elsewhere (the hostname spread)
    waits on a Multi-Attach error until the rollout's deadline. Without a strategy the chart picks
    {maxSurge 0, maxUnavailable 1} there, and {maxSurge 1, maxUnavailable 0} with a shared claim."""
    def strategy(**sets: str) -> Obj:
        return dict(workload(render(helm, sets=sets))["spec"]["strategy"])

    assert strategy() == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    assert strategy(**{"modelRepository.pvc.accessModes[0]": "ReadWriteMany"}) == \
        {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert strategy(**{"modelRepository.pvc.existingClaim": "shared"})["rollingUpdate"]["maxSurge"] == 1
    assert strategy(**{"deployment.strategy.type": "Recreate"}) == {"type": "Recreate"}
    for surge in ({"deployment.strategy.rollingUpdate.maxSurge": "1"}, {"deployment.strategy.type": "RollingUpdate"}):
        result = template(helm, sets=surge, check=False)
        assert result.returncode != 0 and "Multi-Attach" in result.stderr
        assert "maxSurge: 0, maxUnavailable: 1" in result.stderr and "[ReadWriteMany]" in result.stderr
    template(helm, sets={"deployment.strategy.rollingUpdate.maxSurge": "0",
                         "deployment.strategy.rollingUpdate.maxUnavailable": "1"})


def test_object_store_source_reads_s3_with_credentials_from_the_secret(rendered: dict[str, list[Obj]]) -> None:
    docs = rendered["object-store-values.yaml"]
    c = server_container(docs)
    assert flags(c)["--model-repository"] == [
        "s3://https://minio.minio.svc.cluster.local:9000/models/tritonbundle/nvidia-l4-cc89-trt11.1.0.106"]
    env = {e["name"]: e for e in c["env"]}
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": "tritonbundle-s3", "key": name}
    assert env["AWS_DEFAULT_REGION"]["value"] == "us-east-1"
    spec = workload(docs)["spec"]["template"]["spec"]
    assert "engine-build" not in {c["name"] for c in spec.get("initContainers", [])}
    assert not objects(docs, "PersistentVolumeClaim")
    tmp = next(v for v in spec["volumes"] if v["name"] == "tmp")
    assert tmp["emptyDir"]["sizeLimit"] == "10Gi"  # Triton copies the repository under /tmp


def test_aws_s3_without_endpoint_uses_the_plain_bucket_url(helm: Path) -> None:
    docs = render(helm, sets={"modelRepository.source": "s3", "modelRepository.s3.path": "my-bucket/repo",
                              "engineBuild.enabled": "false", "probes.canary.models": "{minilm}"})
    assert flags(server_container(docs))["--model-repository"] == ["s3://my-bucket/repo"]
    assert "AWS_ACCESS_KEY_ID" not in {e["name"] for e in server_container(docs)["env"]}


def test_engine_build_with_a_non_pvc_source_is_refused_with_the_fix(helm: Path) -> None:
    result = template(helm, sets={"modelRepository.source": "s3", "modelRepository.s3.path": "bucket/prefix"}, check=False)
    assert result.returncode != 0 and "engineBuild.enabled=false" in result.stderr


def test_baked_image_source_serves_the_repository_inside_the_image(rendered: dict[str, list[Obj]]) -> None:
    docs = rendered["baked-image-values.yaml"]
    c = server_container(docs)
    assert flags(c)["--model-repository"] == ["/models"]
    assert c["image"] == "registry.example.com/ml/tritonbundle-server-l40s:0.1.0-ngc26.07"
    assert "initContainers" not in workload(docs)["spec"]["template"]["spec"]
    assert not objects(docs, "PersistentVolumeClaim")
    # No build scripts, only the plan check the server starts through and the canary its probes run.
    assert list(_scripts(docs)["data"]) == ["tensorrt-plans.py", "canary.py"]


def test_service_exposes_http_grpc_h2c_and_metrics(rendered: dict[str, list[Obj]]) -> None:
    svc = next(s for s in objects(rendered["defaults"], "Service") if s["metadata"]["name"] == FULLNAME)
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert {n: p["port"] for n, p in ports.items()} == {"http": 8000, "grpc": 8001, "metrics": 8002}
    assert ports["grpc"]["appProtocol"] == "kubernetes.io/h2c"


def test_grpc_ingress_routes_to_the_grpc_port_with_the_backend_protocol_annotation(rendered: dict[str, list[Obj]]) -> None:
    ingresses = {i["metadata"]["name"]: i for i in objects(rendered["multi-replica-pdb-values.yaml"], "Ingress")}
    grpc = ingresses[f"{FULLNAME}-grpc"]
    backend = grpc["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": FULLNAME, "port": {"name": "grpc"}}
    assert grpc["metadata"]["annotations"]["nginx.ingress.kubernetes.io/backend-protocol"] == "GRPC"
    assert ingresses[FULLNAME]["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]["port"] == {"name": "http"}


def test_monitoring_renders_recording_rules_and_the_grafana_dashboard(rendered: dict[str, list[Obj]]) -> None:
    docs = rendered["autoscaling-monitoring-values.yaml"]
    rules = {r.get("record") or r.get("alert"): r["expr"] for g in one(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]}
    ratio = rules["tritonbundle:queue_compute_ratio:rate1m"]
    assert "rate(nv_inference_queue_duration_us{" in ratio and "rate(nv_inference_compute_infer_duration_us{" in ratio
    assert "nv_inference_count" in rules["tritonbundle:batch_size:rate1m"]
    assert "nv_inference_exec_count" in rules["tritonbundle:batch_size:rate1m"]
    assert {"TritonbundleInferenceFailures", "TritonbundleQueueSaturated"} <= set(rules)
    # Triton's failure series carry a reason label the success series lack: each counter is summed to the
    # model before success and failure are added, or the sum matches no series and the alert never fires.
    failures = rules["TritonbundleInferenceFailures"]
    summed = r"sum by \(namespace, app_kubernetes_io_instance, model\) \(rate\(nv_inference_request_(?:success|failure)\{"
    assert len(re.findall(summed, failures)) == failures.count("rate(nv_inference_request_") == 3, failures
    dashboard_cm = next(c for c in objects(docs, "ConfigMap") if c["metadata"]["name"] == f"{FULLNAME}-dashboard")
    assert dashboard_cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard_cm["metadata"]["namespace"] == "monitoring"
    dashboard = json.loads(dashboard_cm["data"]["tritonbundle.json"])
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for metric in ("nv_inference_queue_duration_us", "nv_inference_compute_infer_duration_us", "nv_inference_request_success",
                   "nv_inference_count", "nv_inference_exec_count", "nv_gpu_utilization", "nv_gpu_memory_used_bytes"):
        assert metric in exprs, metric
    titles = {p["title"] for p in dashboard["panels"]}
    assert {"Queue time vs compute time per request", "Throughput", "Average batch size", "GPU utilisation", "GPU memory"} <= titles
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dashboard["panels"])


def test_service_monitor_and_pod_monitor_are_exclusive(helm: Path) -> None:
    result = template(helm, sets={"metrics.serviceMonitor.enabled": "true", "metrics.podMonitor.enabled": "true"}, check=False)
    assert result.returncode != 0 and "not both" in result.stderr


def test_helm_test_pod_checks_readiness_and_runs_one_bytes_inference(rendered: dict[str, list[Obj]]) -> None:
    (pod,) = objects(rendered["defaults"], "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (c,) = pod["spec"]["containers"]
    script = c["args"][0]
    assert "/v2/health/ready" in script and '"datatype": "BYTES"' in script and "/infer" in script
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["TRITON_URL"] == f"http://{FULLNAME}.{NAMESPACE}.svc:8000"
    assert env["MODEL"] == "minilm" and env["OUTPUT_NAME"] == "embedding"
    assert GPU not in c["resources"].get("limits", {})


@pytest.mark.parametrize("scenario", ["defaults", "object-store-values.yaml", "keda-values.yaml"])
def test_notes_tell_how_to_reach_the_server_and_get_the_key(helm: Path, scenario: str) -> None:
    values = [] if scenario == "defaults" else ["-f", str(CHART / "ci" / scenario)]
    result = run_helm(helm, "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client", *values)
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert f"kubectl -n {NAMESPACE} port-forward svc/{FULLNAME}" in notes
    assert "/v2/models/minilm/infer" in notes and f"helm test {RELEASE}" in notes
    secret = ci_values(scenario).get("restrictedApi", {}).get("existingSecret") if scenario != "defaults" else None
    assert f"get secret {secret or FULLNAME + '-api-key'}" in notes


def install_notes(helm: Path, *sets: str) -> str:
    """The NOTES a dry-run install with these --set values prints."""
    args = [a for s in sets for a in ("--set", s)]
    result = run_helm(helm, "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client", *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.split("NOTES:", 1)[1]


def test_notes_name_the_rollout_and_the_metric_the_hpa_reads(helm: Path) -> None:
    """With a Rollout the Deployment is a 0-replica template: its rollout status said ready at once; with
    target=requestsPerSecond the notes named the queue/compute metric the HPA does not read."""
    canary = install_notes(helm, "rollout.strategy=canary", "replicaCount=2", "modelRepository.pvc.accessModes[0]=ReadWriteMany")
    assert f"kubectl argo rollouts -n {NAMESPACE} status {FULLNAME}" in canary and "rollout status deployment/" not in canary
    assert f"rollout status deployment/{FULLNAME}" in install_notes(helm)
    migrating = install_notes(helm, "rollout.strategy=canary", "rollout.migrateFromDeployment=true", "replicaCount=2",
                              "modelRepository.pvc.accessModes[0]=ReadWriteMany")
    assert "keeps its pods until the Rollout is healthy" in migrating and "at 0 replicas" not in migrating
    rps = install_notes(helm, "autoscaling.enabled=true", "autoscaling.target=requestsPerSecond", "autoscaling.requestsPerSecond=40",
                "modelRepository.pvc.accessModes[0]=ReadWriteMany")
    assert "target 40 requests per second per pod" in rps and "queue/compute" not in rps
    assert "\n\nAutoscaling (hpa)" in rps  # a paragraph of its own
    assert "pods/*/tritonbundle_requests_per_second" in rps and "tritonbundle_queue_compute_ratio" not in rps


def test_notes_warn_when_the_build_image_would_come_from_docker_hub(helm: Path) -> None:
    assert "WARNING: engineBuild.image.registry is empty" in install_notes(helm)
    assert "tritonbundle-build:" in install_notes(helm)
    for given in ("engineBuild.image.registry=registry.example.com/ml", "global.imageRegistry=mirror.example.com",
                  "engineBuild.image.repository=ghcr.io/acme/tritonbundle-build",
                  "engineBuild.image.repository=localhost:5000/tritonbundle-build"):
        assert "engineBuild.image.registry is empty" not in install_notes(helm, given), given
    assert "engineBuild.image.registry is empty" not in install_notes(helm, "engineBuild.enabled=false")


# -- the edge ---------------------------------------------------------------------------------------
EDGE_NGINX = CHART / "files" / "edge-nginx.conf"
EDGE_TEMPLATE = CHART / "files" / "edge-settings.conf.template"
DOCKER_EDGE = ROOT / "docker" / "edge"


def _edge_container(docs: list[Obj]) -> Obj:
    return next(c for c in workload(docs)["spec"]["template"]["spec"]["containers"] if c["name"] == "edge")


def _edge_config(docs: list[Obj]) -> Obj:
    return next(c for c in objects(docs, "ConfigMap") if c["metadata"]["name"] == f"{FULLNAME}-edge")


def _service_target(docs: list[Obj], port_name: str) -> tuple[str, int]:
    """The container and port number the main Service's port ``port_name`` reaches (named target ports are
    looked up in the pod's containers, as Kubernetes does)."""
    svc = next(s for s in objects(docs, "Service") if s["metadata"]["name"] == FULLNAME)
    target = next(p for p in svc["spec"]["ports"] if p["name"] == port_name)["targetPort"]
    found = [(c["name"], p["containerPort"]) for c in workload(docs)["spec"]["template"]["spec"]["containers"]
             for p in c.get("ports", []) if p.get("name") == target or p["containerPort"] == target]
    assert len(found) == 1, f"Service port {port_name} (target {target}) matches {found}"
    return found[0]


def _render_compose_settings(tmp_path: Path, http: str, grpc: str, max_body: str) -> str:
    """settings.conf as the compose edge's entry point renders it (docker/edge/entrypoint.sh --render)."""
    env = {"PATH": os.environ["PATH"], "TRITONBUNDLE_EDGE_RULES": str(DOCKER_EDGE),
           "TRITONBUNDLE_EDGE_CONF_DIR": str(tmp_path), "TRITONBUNDLE_EDGE_TRITON_HTTP": http,
           "TRITONBUNDLE_EDGE_TRITON_GRPC": grpc, "TRITONBUNDLE_EDGE_MAX_BODY": max_body}
    result = subprocess.run(["/bin/sh", str(DOCKER_EDGE / "entrypoint.sh"), "--render"], env=env,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "nginx.conf").read_text() == (DOCKER_EDGE / "nginx.conf").read_text()
    return (tmp_path / "settings.conf").read_text()


@pytest.mark.parametrize("scenario", ALL)
def test_edge_fronts_http_and_grpc_while_triton_binds_them_to_loopback_and_metrics_stay_direct(
    rendered: dict[str, list[Obj]], scenario: str,
) -> None:
    """The Service's http and grpc ports (and so the Ingress, which names them) reach the edge's nginx on
    8080 / 8081; Triton listens on 127.0.0.1 for those, on every address for metrics (which would otherwise
    follow --http-address), and its metrics port stays the Service's and the monitors' target."""
    docs = rendered[scenario]
    c, edge = server_container(docs), _edge_container(docs)
    f = flags(c)
    assert f["--http-address"] == ["127.0.0.1"] and f["--grpc-address"] == ["127.0.0.1"]
    assert f["--metrics-address"] == ["0.0.0.0"]
    assert [p["name"] for p in c["ports"]] == ["metrics"]
    assert {p["name"]: p["containerPort"] for p in edge["ports"]} == {"http": 8080, "grpc": 8081}
    assert _service_target(docs, "http") == ("edge", 8080)
    assert _service_target(docs, "grpc") == ("edge", 8081)
    assert _service_target(docs, "metrics") == ("tritonserver", int(f["--metrics-port"][0]))
    for ingress in objects(docs, "Ingress"):
        for rule in ingress["spec"]["rules"]:
            for path in rule["http"]["paths"]:
                assert path["backend"]["service"]["name"] == FULLNAME
                assert _service_target(docs, path["backend"]["service"]["port"]["name"])[0] == "edge"
    assert edge["command"] == ["nginx", "-c", "/etc/nginx/tritonbundle/nginx.conf", "-e", "stderr", "-g", "daemon off;"]
    mounts = {m["mountPath"]: m for m in edge["volumeMounts"]}
    assert mounts["/etc/nginx/tritonbundle"]["name"] == "edge-config" and mounts["/etc/nginx/tritonbundle"]["readOnly"]
    assert mounts["/tmp"]["name"] == "edge-tmp"
    volumes = {v["name"]: v for v in workload(docs)["spec"]["template"]["spec"]["volumes"]}
    assert volumes["edge-config"]["configMap"]["name"] == f"{FULLNAME}-edge"
    assert volumes["edge-tmp"]["emptyDir"]["sizeLimit"]
    assert edge["livenessProbe"]["tcpSocket"] == edge["readinessProbe"]["tcpSocket"] == {"port": "http"}
    assert edge["image"].endswith("nginxinc/nginx-unprivileged:1.30.4-alpine-slim")
    assert {"cpu", "memory"} <= set(edge["resources"]["requests"]) and "memory" in edge["resources"]["limits"]
    # Like Triton, it keeps taking requests while the endpoints are updated.
    assert edge["lifecycle"] == c["lifecycle"]


def test_edge_config_is_the_compose_edges_rules_filled_in_with_this_pods_addresses(
    helm: Path, rendered: dict[str, list[Obj]], tmp_path: Path,
) -> None:
    """One home for the rules: the ConfigMap's nginx.conf is docker/edge/nginx.conf, and its settings.conf is
    what the compose edge's entry point renders from the same template, with Triton at 127.0.0.1 in the pod."""
    data = _edge_config(rendered["defaults"])["data"]
    assert data["nginx.conf"] == (DOCKER_EDGE / "nginx.conf").read_text()
    assert data["settings.conf"] == _render_compose_settings(tmp_path / "a", "127.0.0.1:8000", "127.0.0.1:8001", "1m")
    assert "server 127.0.0.1:8000;" in data["settings.conf"] and "client_max_body_size 1m;" in data["settings.conf"]
    assert "include settings.conf;" in data["nginx.conf"]
    docs = render(helm, sets={"server.ports.http": "9000", "server.ports.grpc": "9001", "edge.maxBodySize": "512k"})
    assert _edge_config(docs)["data"]["settings.conf"] == _render_compose_settings(
        tmp_path / "b", "127.0.0.1:9000", "127.0.0.1:9001", "512k")
    assert flags(server_container(docs))["--http-port"] == ["9000"]
    # A new limit is a config change: the pods roll.
    assert _checksum(docs) != _checksum(render(helm, sets={"server.ports.http": "9000", "server.ports.grpc": "9001"}))


def test_chart_edge_files_are_byte_for_byte_copies_of_the_compose_edges() -> None:
    for copy, source in ((EDGE_NGINX, DOCKER_EDGE / "nginx.conf"), (EDGE_TEMPLATE, DOCKER_EDGE / "settings.conf.template")):
        assert copy.read_bytes() == source.read_bytes(), (
            f"helm/tritonbundle/files/{copy.name} differs from docker/edge/{source.name}; refresh the chart's copy: "
            f"cp docker/edge/{source.name} helm/tritonbundle/files/{copy.name}")


def test_edge_disabled_gives_the_service_tritons_own_ports_and_httpget_probes(helm: Path) -> None:
    docs = render(helm, sets={"edge.enabled": "false"})
    c = server_container(docs)
    assert not _edge_enabled(docs)
    assert f"{FULLNAME}-edge" not in {m["metadata"]["name"] for m in objects(docs, "ConfigMap")}
    assert not {"--http-address", "--grpc-address", "--metrics-address"} & set(flags(c))
    assert _service_target(docs, "http") == ("tritonserver", 8000)
    assert _service_target(docs, "grpc") == ("tritonserver", 8001)
    assert c["startupProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    volumes = {v["name"] for v in workload(docs)["spec"]["template"]["spec"]["volumes"]}
    assert not {"edge-config", "edge-tmp"} & volumes


@pytest.mark.parametrize("port", ["http", "grpc", "metrics"])
def test_edge_refuses_triton_ports_it_listens_on_itself(helm: Path, port: str) -> None:
    result = template(helm, sets={f"server.ports.{port}": "8080"}, check=False)
    assert result.returncode != 0 and f"server.ports.{port} is 8080" in result.stderr
    assert template(helm, sets={f"server.ports.{port}": "8080", "edge.enabled": "false",
                                **({"server.ports.http": "8000"} if port != "http" else {})}, check=False).returncode == 0


# -- the values schema ----------------------------------------------------------------------------
def _write_values(tmp_path: Path, text: str) -> str:
    path = tmp_path / "values.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(("values", "named"), [
    ("replicaCont: 2\n", "replicaCont"),
    ("server:\n  exitTimeoutSecs: 10\n", "exitTimeoutSecs"),
    ("autoscaling:\n  enabled: true\n  maxReplica: 4\n", "maxReplica"),
    ("probes:\n  canary:\n    enable: false\n", "enable"),
])
def test_schema_rejects_a_misspelt_key_and_names_it(helm: Path, tmp_path: Path, values: str, named: str) -> None:
    result = template(helm, _write_values(tmp_path, values), check=False)
    assert result.returncode != 0
    assert named in result.stderr and "additional properties" in result.stderr


@pytest.mark.parametrize(("values", "named"), [
    ("replicaCount: two\n", "/replicaCount"),
    ("gpu:\n  count: \"1\"\n", "/gpu/count"),
    ("restrictedApi:\n  enabled: \"yes\"\n", "/restrictedApi/enabled"),
    ("modelRepository:\n  source: nfs\n", "/modelRepository/source"),
    ("securityContext:\n  privileged: true\n", "/securityContext/privileged"),
    ("probes:\n  canary:\n    requestTimeoutSeconds: 0\n", "/probes/canary/requestTimeoutSeconds"),
    ("probes:\n  canary:\n    models: minilm\n", "/probes/canary/models"),
    ("edge:\n  maxBodySize: 1.5m\n", "/edge/maxBodySize"),
    ("edge:\n  maxBodySize: 1mb\n", "/edge/maxBodySize"),
    # The startup probe calls /v2/health/ready without the key: the pods would never start.
    ("restrictedApi:\n  apis: [health, model-repository]\n", "/restrictedApi/apis/0"),
])
def test_schema_rejects_a_wrong_type_or_value_and_names_the_key(helm: Path, tmp_path: Path, values: str, named: str) -> None:
    result = template(helm, _write_values(tmp_path, values), check=False)
    assert result.returncode != 0
    assert f"'{named}'" in result.stderr, result.stderr


def _schema() -> Obj:
    return json.loads((CHART / "values.schema.json").read_text())


def test_schema_closes_every_object_it_describes() -> None:
    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if "properties" in node:
                assert node.get("additionalProperties") is False, f"{where} is open"
            for key, child in node.items():
                walk(child, f"{where}/{key}")
        elif isinstance(node, list):
            for i, child in enumerate(node):
                walk(child, f"{where}/{i}")
    schema = _schema()
    assert schema["additionalProperties"] is False
    walk(schema, "#")


def test_every_chart_key_in_values_yaml_is_commented() -> None:
    """Each key the chart defines has a comment on the line above (or on its line). Fields of Kubernetes
    objects given as defaults (under a $ref'd Kubernetes type, a list or a string map) are Kubernetes'."""
    schema = _schema()
    lines = (CHART / "values.yaml").read_text().splitlines()
    stack: list[tuple[int, Any]] = []  # (indent, schema node of the key, or None when not walkable)
    missing = []
    for n, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z_][\w.-]*):(\s|$)", line)
        if not m or line.lstrip().startswith(("#", "-")):
            continue
        indent, key = len(m.group(1)), m.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1] if stack else schema
        node = parent.get("properties", {}).get(key) if isinstance(parent, dict) else None
        if parent is not None and isinstance(parent, dict) and "properties" in parent:
            above = next((lines[i] for i in range(n - 1, -1, -1) if lines[i].strip()), "")
            if "#" not in line and not above.strip().startswith("#"):
                missing.append(f"values.yaml:{n + 1}: {key}")
        walkable = isinstance(node, dict) and "properties" in node
        stack.append((indent, node if walkable else None))
    assert not missing, "keys without a comment:\n" + "\n".join(missing)


def test_every_values_key_is_in_the_schema() -> None:
    """values.yaml itself passes the schema (helm lint proves it too) and uses every top-level key."""
    assert set(values_yaml()) == set(_schema()["properties"])


# -- the scripts the pods run ---------------------------------------------------------------------
FAKE_TRITONBUNDLE = """#!/bin/sh
echo "$*" >> "$CALLS"
case "$1" in
  fingerprint) echo nvidia-h100-80gb-hbm3-cc90-trt11.1.0.106 ;;
  build)
    for a in "$@"; do
      if [ "$a" = --check ]; then
        if [ -f "$STATE" ]; then exit "$CHECK_AFTER_BUILD"; fi
        exit "$CHECK_STATUS"
      fi
    done
    touch "$STATE" ;;
esac
"""


def engine_build_env(tmp_path: Path, *, check_status: int = 1, check_after_build: int = 0,
                     seed: Path | None = None) -> dict[str, str]:
    """engine-build.sh's environment with a fake ``tritonbundle`` on PATH (it logs its calls to calls.log)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "tritonbundle"
    fake.write_text(FAKE_TRITONBUNDLE)
    fake.chmod(0o755)
    (tmp_path / "run").mkdir(exist_ok=True)
    (tmp_path / "calls.log").write_text("")
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "CALLS": str(tmp_path / "calls.log"),
        "STATE": str(tmp_path / "state"), "CHECK_STATUS": str(check_status), "CHECK_AFTER_BUILD": str(check_after_build),
        "TRITONBUNDLE_CACHE_DIR": str(tmp_path / "engines"), "TRITONBUNDLE_RUN_DIR": str(tmp_path / "run"),
        "TRITONBUNDLE_LOCK_TIMEOUT_S": "5", "TRITONBUNDLE_SEED_ARTIFACTS": str(seed or tmp_path / "no-seed"),
    }


def _run_engine_build(tmp_path: Path, check_status: int, *args: str, force: bool = False, check_after_build: int = 0,
                      seed: Path | None = None) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    calls = tmp_path / "calls.log"
    env = {
        **engine_build_env(tmp_path, check_status=check_status, check_after_build=check_after_build, seed=seed),
        "TRITONBUNDLE_MANIFEST": "/opt/tritonbundle/build/models.yaml",
        "TRITONBUNDLE_PRECISION": "fp16", "TRITONBUNDLE_MODELS": "minilm", "TRITONBUNDLE_FORCE": str(force).lower(),
    }
    result = subprocess.run(["/bin/sh", str(CHART / "files" / "engine-build.sh"), *args], env=env,
                            capture_output=True, text=True, timeout=30)
    return result, calls.read_text().splitlines()


def test_engine_build_script_skips_the_build_when_the_plans_fit(tmp_path: Path) -> None:
    result, calls = _run_engine_build(tmp_path, 0)
    assert result.returncode == 0, result.stdout + result.stderr
    assert calls[0] == "fingerprint"
    assert len(calls) == 2 and calls[1].startswith("build --check ")
    assert "nothing to build" in result.stdout
    link = tmp_path / "run" / "model_repository"
    assert os.readlink(link) == str(tmp_path / "engines" / "nvidia-h100-80gb-hbm3-cc90-trt11.1.0.106" / "model_repository")


def test_engine_build_script_builds_when_the_check_says_so_then_checks_again(tmp_path: Path) -> None:
    result, calls = _run_engine_build(tmp_path, 1, "--extra-flag")
    assert result.returncode == 0, result.stdout + result.stderr
    assert [c.split()[0:2] for c in calls] == [["fingerprint"], ["build", "--check"], ["build", "--manifest"], ["build", "--check"]]
    build = calls[2]
    for part in ("--target gpu", "--runtime tensorrt", "--precision fp16", "--model minilm", "--extra-flag",
                 f"--artifacts {tmp_path}/engines/nvidia-h100-80gb-hbm3-cc90-trt11.1.0.106/artifacts"):
        assert part in build
    assert (tmp_path / "run" / "model_repository").is_symlink()


def test_engine_build_script_fails_when_fresh_plans_still_do_not_fit(tmp_path: Path) -> None:
    result, _ = _run_engine_build(tmp_path, 1, check_after_build=1)
    assert result.returncode == 1 and "does not pass" in result.stdout
    assert not (tmp_path / "run" / "model_repository").exists()


def test_engine_build_script_stops_on_a_check_error_instead_of_building(tmp_path: Path) -> None:
    result, calls = _run_engine_build(tmp_path, 2)
    assert result.returncode == 2
    assert len(calls) == 2 and "exit status 2" in result.stdout


def test_engine_build_script_rebuilds_when_forced(tmp_path: Path) -> None:
    result, calls = _run_engine_build(tmp_path, 0, "--force", force=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert calls[1].startswith("build --manifest") and calls[1].endswith("--force")
    assert calls[2].startswith("build --check")


def test_engine_build_script_seeds_the_volume_with_the_images_exports_and_refreshes_changed_ones(tmp_path: Path) -> None:
    seed = tmp_path / "seed"
    (seed / "minilm").mkdir(parents=True)
    (seed / "minilm" / "model.onnx").write_bytes(b"onnx v1")
    (seed / "minilm" / "export.json").write_text("{}")
    artifacts = tmp_path / "engines" / "nvidia-h100-80gb-hbm3-cc90-trt11.1.0.106" / "artifacts" / "minilm"
    result, _ = _run_engine_build(tmp_path, 0, seed=seed)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (artifacts / "model.onnx").read_bytes() == b"onnx v1" and (artifacts / "export.json").exists()
    again, _ = _run_engine_build(tmp_path, 0, seed=seed)
    assert "seeding" not in again.stdout  # unchanged files are left alone
    (seed / "minilm" / "model.onnx").write_bytes(b"onnx v2")  # a new build image
    third, _ = _run_engine_build(tmp_path, 0, seed=seed)
    assert third.stdout.count("seeding") == 1 and (artifacts / "model.onnx").read_bytes() == b"onnx v2"


FAKE_TRITONSERVER = """#!/bin/sh
for a in "$0" "$@"; do echo "$a"; done
"""


def _plan_repository(tmp_path: Path, built_with: str, *, version_compatible: bool) -> Path:
    """A repository with one model whose plan metadata says which TensorRT built it."""
    repo = tmp_path / "model_repository"
    (repo / "m" / "1").mkdir(parents=True)
    (repo / "m" / "1" / "model.plan").write_bytes(b"not a real plan")
    meta = {"tensorrt_version": built_with, "options": {"version_compatible": version_compatible}}
    (repo / "m" / "1" / "model.plan.json").write_text(json.dumps(meta))
    return repo


def _run_plan_check(tmp_path: Path, tensorrt: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The chart's tensorrt-plans.py, with a stand-in tritonserver on PATH that prints its argv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "tritonserver"
    fake.write_text(FAKE_TRITONSERVER)
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "TRITONBUNDLE_TENSORRT_VERSION": tensorrt}
    return subprocess.run([sys.executable, str(PLAN_CHECK), *args], env=env, capture_output=True, text=True, timeout=30)


def test_plan_check_refuses_plans_another_tensorrt_built_and_names_both_versions(tmp_path: Path) -> None:
    repo = _plan_repository(tmp_path, "10.13.2.6", version_compatible=False)
    refused = _run_plan_check(tmp_path, "11.1.0.106", "check", str(repo))
    assert refused.returncode == 2, refused.stderr
    assert "10.13.2.6" in refused.stderr and "11.1.0.106" in refused.stderr and "m/1/model.plan" in refused.stderr
    same = _run_plan_check(tmp_path, "10.13.2.6", "check", str(repo))
    assert same.returncode == 0 and not same.stderr, same.stderr
    # The server container's start: refused before tritonserver runs.
    start = _run_plan_check(tmp_path, "11.1.0.106", "exec", "tritonserver", f"--model-repository={repo}")
    assert start.returncode == 2 and "refusing to start" in start.stderr and not start.stdout


def test_plan_check_starts_tritonserver_with_the_rendered_arguments_and_the_version_compatible_flag(
    rendered: dict[str, list[Obj]], tmp_path: Path,
) -> None:
    """The container's command as rendered (python3 -> this interpreter, the script -> the chart's file):
    version-compatible plans from an older TensorRT run, with the backend flag added once."""
    repo = _plan_repository(tmp_path, "10.13.2.6", version_compatible=True)
    c = server_container(rendered["defaults"])
    nvidia, python3, script, *command = c["command"]
    assert (nvidia, python3, script) == (NVIDIA_ENTRYPOINT, "python3", f"{SCRIPTS_DIR}/tensorrt-plans.py")
    args = [f"--model-repository={repo}" if a.startswith("--model-repository=") else a for a in c["args"]]
    started = _run_plan_check(tmp_path, "11.1.0.106", *command, *args)
    assert started.returncode == 0, started.stderr
    argv = started.stdout.splitlines()
    assert argv[0].endswith("/bin/tritonserver") and argv[1:-1] == args
    assert argv[-1] == "--backend-config=tensorrt,version-compatible=true"
    again = _run_plan_check(tmp_path, "11.1.0.106", *command, *args, "--backend-config=tensorrt,version-compatible=true")
    assert again.stdout.splitlines().count("--backend-config=tensorrt,version-compatible=true") == 1
    # Plans that are not version-compatible get no flag; no plans at all: nothing checked, nothing added.
    plain = _plan_repository(tmp_path / "plain", "11.1.0.106", version_compatible=False)
    for repository in (plain, tmp_path / "empty"):
        ok = _run_plan_check(tmp_path, "11.1.0.106", "exec", "tritonserver", f"--model-repository={repository}")
        assert ok.returncode == 0 and ok.stdout.splitlines()[1:] == [f"--model-repository={repository}"], ok.stderr
    # A version-compatible plan cannot run on an OLDER TensorRT.
    older = _run_plan_check(tmp_path, "10.13.2.6", "check", str(_plan_repository(tmp_path / "new", "11.1.0.106",
                                                                                    version_compatible=True)))
    assert older.returncode == 2 and "11.1.0.106" in older.stderr and "10.13.2.6" in older.stderr


def test_copy_python_packages_copies_an_importable_package(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(CHART / "files" / "copy-python-packages.py"), str(tmp_path), "yaml"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "yaml" / "__init__.py").exists()
    missing = subprocess.run([sys.executable, str(CHART / "files" / "copy-python-packages.py"), str(tmp_path), "no_such_pkg"],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "no_such_pkg" in missing.stderr


class _FakeTriton(_JsonHandler):
    key = "s3cret"

    def do_GET(self) -> None:  # noqa: N802
        self._reply(200 if self.path == "/v2/health/ready" else 404, {})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        if self.path == "/v2/repository/index":
            ok = self.headers.get("tritonbundle-key") == self.key
            self._reply(200 if ok else 403, [] if ok else {"error": "restricted"})  # type: ignore[arg-type]
        elif self.path == "/v2/models/minilm/infer":
            (inp,) = body["inputs"]
            assert inp["datatype"] == "BYTES" and inp["shape"] == [1, 1]
            value = 1 / math.sqrt(384)
            self._reply(200, {"outputs": [{"name": "embedding", "datatype": "FP32", "shape": [1, 384], "data": [value] * 384}]})
        else:
            self._reply(404, {"error": "unknown"})


def _run_helm_test_script(url: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ["PATH"], "TRITON_URL": url, "MODEL": "minilm", "INPUT_NAME": "TEXT",
            "OUTPUT_NAME": "embedding", "EXPECTED_DIMS": "384", "TEXT": "A man is playing a guitar.",
            "READY_TIMEOUT_S": "20"}
    return subprocess.run([sys.executable, str(CHART / "files" / "helm-test.py")], env={**base, **env},
                          capture_output=True, text=True, timeout=60)


def test_helm_test_script_passes_against_a_server_that_answers_and_guards_its_api() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeTriton)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        ok = _run_helm_test_script(url, API_HEADER="tritonbundle-key", API_KEY="s3cret")
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert "refuses requests without tritonbundle-key" in ok.stdout
        wrong_key = _run_helm_test_script(url, API_HEADER="tritonbundle-key", API_KEY="nope")
        assert wrong_key.returncode == 1 and "with the key" in wrong_key.stderr
        wrong_dims = _run_helm_test_script(url, EXPECTED_DIMS="768")
        assert wrong_dims.returncode == 1 and "expected [1, 768]" in wrong_dims.stderr
    finally:
        server.shutdown()


class _TenantEdge(_FakeTriton):
    """The edge with gateway tenants: inference needs a tenant's key (auth_request), 401 without."""

    def do_POST(self) -> None:  # noqa: N802
        if self.path.endswith("/infer") and self.headers.get("Authorization") != "Bearer tb-tenant":
            self.rfile.read(int(self.headers["Content-Length"]))
            self._reply(401, {"error": "no tenant key"})
            return
        super().do_POST()


def test_helm_test_script_sends_the_tenants_key_or_skips_inference_with_the_reason() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _TenantEdge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        keyed = _run_helm_test_script(url, TENANT_KEY="tb-tenant\n")
        assert keyed.returncode == 0 and "embedded" in keyed.stdout, keyed.stdout + keyed.stderr
        skipped = _run_helm_test_script(url, SKIP_INFERENCE="tenants are on and no key is given")
        assert skipped.returncode == 0 and "skip: no inference on minilm: tenants are on" in skipped.stdout
        keyless = _run_helm_test_script(url)
        assert keyless.returncode == 1 and "HTTP 401" in keyless.stderr
    finally:
        server.shutdown()


def _run_probe(command: list[str], repository: Path, http_port: int) -> subprocess.CompletedProcess[str]:
    """A rendered exec probe run as the kubelet would, with the chart's canary.py, this repository and port."""
    argv = [sys.executable if a == "python3" else str(CANARY) if a == f"{SCRIPTS_DIR}/canary.py" else a for a in command]
    argv = [str(repository) if a == "/run/tritonbundle/model_repository" else a for a in argv]
    argv = [a.replace("127.0.0.1:8000", f"127.0.0.1:{http_port}") for a in argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, env={"PATH": os.environ["PATH"]})


@pytest.mark.slow
def test_rendered_tritonserver_arguments_start_a_real_triton_that_passes_the_helm_test_and_the_canary_probes(
    rendered: dict[str, list[Obj]], repository: Path, tmp_path: Path,
) -> None:
    """The chart's own command and tritonserver arguments, with $(TRITONBUNDLE_API_KEY) expanded as the kubelet
    does, start the CPU tritonserver (2.51, Python backend) on this repository through tensorrt-plans.py (no
    plans here: it checks, then execs tritonserver), and the `helm test` script passes against it: readiness,
    one BYTES inference, the restricted API refusing a request without the key. The liveness/readiness
    command passes too; once the encoder's Python stub is dead (the shape-overflow request), Triton still says
    ready on /v2/health/ready (the httpGet readiness probe would pass) and the canary probe fails."""
    from tests.reliability.test_canary import kill_stub
    from tritonbundle.proc import free_ports
    from tritonbundle.server import ServerOptions, TritonServer

    key = "k" * 32
    ports = dict(zip(("http", "grpc", "metrics"), free_ports(3)))
    container = server_container(rendered["defaults"])
    nvidia, python3, script, verb, binary = container["command"]
    assert (nvidia, python3, script, verb, binary) == (
        NVIDIA_ENTRYPOINT, "python3", f"{SCRIPTS_DIR}/tensorrt-plans.py", "exec", "tritonserver")
    # NVIDIA's entry point ends with `exec "$@"`: a stand-in that does only that keeps the chain as rendered.
    entrypoint = tmp_path / "nvidia_entrypoint.sh"
    entrypoint.write_text('#!/bin/sh\necho "nvidia entrypoint: $1" >&2\nexec "$@"\n')
    entrypoint.chmod(0o755)
    args = []
    for arg in container["args"]:
        name = arg.split("=", 1)[0]
        if name == "--model-repository":
            arg = f"--model-repository={repository}"
        elif name in ("--http-port", "--grpc-port", "--metrics-port"):
            arg = f"{name}={ports[name[2:].split('-')[0]]}"
        elif name == "--metrics-address":  # the chart's 0.0.0.0 (for Prometheus): loopback in a test
            arg = "--metrics-address=127.0.0.1"
        args.append(arg.replace("$(TRITONBUNDLE_API_KEY)", key))

    class ChartArgsServer(TritonServer):
        def command(self) -> list[str]:
            assert self.installation is not None
            return [str(entrypoint), sys.executable, str(PLAN_CHECK), verb,
                    str(self.installation.binary), f"--backend-directory={self.installation.backend_dir}",
                    "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1", *args]

    options = ServerOptions(repository, http_port=ports["http"], grpc_port=ports["grpc"],
                            metrics_port=ports["metrics"], log_path=tmp_path / "tritonserver.log")
    probe = container["livenessProbe"]["exec"]["command"]
    assert probe == container["readinessProbe"]["exec"]["command"]
    # The chart binds HTTP and gRPC to loopback for the edge (and names metrics' address): 2.51 takes the flags.
    assert {"--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=0.0.0.0"} <= set(container["args"])
    with ChartArgsServer(options).start(ready_timeout_s=180) as server:
        result = _run_helm_test_script(f"http://{server.http_url}", API_HEADER="tritonbundle-key", API_KEY=key)
        # The startup probe (behind the edge: a GET from inside the container) passes once the models loaded.
        started = _run_health_probe(container["startupProbe"], ports["http"])
        answered = _run_probe(probe, repository, ports["http"])
        kill_stub(server.http_url)
        with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready", timeout=5) as r:
            ready = r.status
        down = _run_probe(probe, repository, ports["http"])
        server.stop(timeout_s=2)  # the killed stub's model never unloads: no 30-s drain to wait out
    assert result.returncode == 0, result.stdout + result.stderr
    assert "L2 norm 1.0000" in result.stdout  # the MiniLM embedding is normalised
    assert started.returncode == 0, started.stderr
    assert _run_health_probe(container["startupProbe"], ports["http"]).returncode != 0, "no server: the probe fails"
    assert answered.returncode == 0 and "3 of 3 models answered" in answered.stdout, answered.stdout + answered.stderr
    assert ready == 200, "Triton 2.51 says ready with a dead stub"
    assert down.returncode == 1 and "minilm_encoder" in down.stderr and "not healthy" in down.stderr, down.stderr


# -- docs -----------------------------------------------------------------------------------------
def test_chart_readme_documents_every_scenario_and_the_prometheus_adapter_rule() -> None:
    readme = (CHART / "README.md").read_text()
    for scenario in SCENARIOS:
        assert f"ci/{scenario}" in readme, scenario
    assert "nv_inference_queue_duration_us" in readme and "nv_inference_compute_infer_duration_us" in readme
    assert "tritonbundle_queue_compute_ratio" in readme
    assert "helm install" in readme
    assert "it has not been installed on a real cluster" in readme


def test_readme_prometheus_adapter_rule_serves_the_metric_the_hpa_reads() -> None:
    readme = (CHART / "README.md").read_text()
    block = re.search(r"```yaml\n(rules:\n.*?)```", readme, re.S)
    assert block, "the README needs the prometheus-adapter rule as a yaml block"
    (rule,) = yaml.safe_load(block.group(1))["rules"]["custom"]
    assert rule["name"]["as"] == values_yaml()["autoscaling"]["hpa"]["metricName"]
    assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
    query = rule["metricsQuery"]
    assert "rate(nv_inference_queue_duration_us{<<.LabelMatchers>>" in query
    assert "rate(nv_inference_compute_infer_duration_us{<<.LabelMatchers>>" in query
    assert f'model=~"{values_yaml()["autoscaling"]["models"]}"' in query
    assert _balanced(query.replace("<<", "").replace(">>", ""))


@pytest.mark.parametrize(("sets", "ok"), [
    ({}, True),  # 20 s probes, 3 s requests: 18 >= 15
    ({"probes.liveness.timeoutSeconds": "10"}, False),  # 8 s cannot hold one model's 4 requests and the metrics
    ({"probes.readiness.timeoutSeconds": "12", "probes.canary.requestTimeoutSeconds": "2"}, True),  # 10 >= 10
    ({"probes.liveness.timeoutSeconds": "10", "probes.canary.enabled": "false"}, True),
])
def test_probe_timeouts_must_hold_one_models_canary(helm: Path, sets: dict[str, str], ok: bool) -> None:
    """The canary never cuts a request short (a dead stub's 500, a hang, need their whole timeout): a probe
    timeout that cannot hold one model's worst case would time the probe out, which the kubelet counts as
    a failure."""
    result = template(helm, sets=sets, check=False)
    assert (result.returncode == 0) is ok, result.stderr
    if not ok:
        assert "must leave the canary 2 s plus 5 x probes.canary.requestTimeoutSeconds (15 s)" in result.stderr
