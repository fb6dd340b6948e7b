"""The CPU compose stack, for real: `docker compose -f docker/compose.yaml -f docker/compose.cpu.yaml up
--wait` (export -> build -> triton -> edge), inference over HTTP and gRPC through the published loopback
ports (the edge's) with the project's clients, a short load test, restarts that reuse what was built, `run --rm build
--force` / `--check` / `--reexport`, `down -v`."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone

import numpy as np
import pytest

from tests.docker.conftest import DOCKER_DIR, Stack, run

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(2400)]

SENTENCES = ["A man is playing a guitar.", "Someone strums a guitar.", "The stock market fell sharply today."]


def http_status(url: str, *, method: str = "GET", headers: dict[str, str] | None = None, timeout_s: float = 10) -> int:
    request = urllib.request.Request(url, method=method, headers=headers or {}, data=b"{}" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - loopback
            return int(response.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def wait_healthy(stack: Stack, service: str, *, timeout_s: float = 180) -> None:
    container = stack.container(service)
    deadline = time.monotonic() + timeout_s
    status = "?"
    while time.monotonic() < deadline:
        status = run(["docker", "inspect", "-f", "{{.State.Health.Status}}", container]).stdout.strip()
        if status == "healthy":
            return
        time.sleep(1)
    raise AssertionError(f"{service} not healthy after {timeout_s:g} s (last: {status})\n{stack.logs(service)[-3000:]}")


def embed_both(stack: Stack) -> tuple[np.ndarray, np.ndarray]:
    from tritonbundle.clients import GrpcClient, HttpClient

    with HttpClient(stack.http_url, model="minilm", timeout_s=30) as client:
        http = client.embed(SENTENCES)
    with GrpcClient(stack.grpc_url, model="minilm", timeout_s=30) as client:
        grpc = client.embed(SENTENCES)
    return http, grpc


def test_embeds_over_http_and_grpc_through_the_loopback_ports(cpu_stack: Stack) -> None:
    http, grpc = embed_both(cpu_stack)
    assert http.shape == grpc.shape == (3, 384) and http.dtype == np.float32
    np.testing.assert_allclose(http, grpc, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(http, axis=1), 1.0, atol=1e-4)
    similarity = http @ http.T
    assert similarity[0, 1] > 0.6 > similarity[0, 2], "the two guitar sentences are the nearest pair"


def test_the_openai_api_answers_through_the_edge_and_meters_usage(cpu_stack: Stack) -> None:
    """/v1/ on the edge's port reaches the gateway (OpenAI's own client), whose usage log counts it."""
    import openai

    client = openai.OpenAI(base_url=f"http://{cpu_stack.http_url}/v1", api_key="no-tenants-configured", max_retries=0, timeout=60)
    result = client.embeddings.create(model="minilm", input=SENTENCES)
    http, _ = embed_both(cpu_stack)
    got = np.array([d.embedding for d in sorted(result.data, key=lambda d: d.index)], dtype=np.float32)
    np.testing.assert_allclose(got, http, atol=1e-5)
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="not-served", input="hi")
    log = run(["docker", "exec", cpu_stack.container("gateway"), "tritonbundle", "usage", "--log",
               "/var/lib/tritonbundle/usage/usage.jsonl", "--json"]).stdout
    rows = {r["model"]: r for r in json.loads(log)}
    assert rows["minilm"]["ok"] >= 1 and rows["minilm"]["tokens"] >= result.usage.total_tokens
    assert rows["-"]["invalid"] >= 1


def test_ports_are_published_on_loopback_only(cpu_stack: Stack) -> None:
    """HTTP and gRPC reach Triton through the edge only (nginx, 8080/8081 in its container); metrics directly."""
    published = {}
    for service in ("triton", "edge"):
        bindings = json.loads(run(["docker", "inspect", "-f", "{{json .HostConfig.PortBindings}}",
                                   cpu_stack.container(service)]).stdout)
        assert {b["HostIp"] for value in bindings.values() for b in value} == {"127.0.0.1"}
        published[service] = {port: int(value[0]["HostPort"]) for port, value in bindings.items()}
    assert published == {"triton": {"8002/tcp": cpu_stack.metrics_port},
                         "edge": {"8080/tcp": cpu_stack.http_port, "8081/tcp": cpu_stack.grpc_port}}


def test_triton_runs_non_root_read_only_with_the_repository_mounted_read_only(cpu_stack: Stack) -> None:
    container = cpu_stack.container("triton")
    info = json.loads(run(["docker", "inspect", container]).stdout)[0]
    assert info["Config"]["User"] in ("1000:1000", "1000")
    assert run(["docker", "exec", container, "id", "-u"]).stdout.strip() == "1000"
    assert info["HostConfig"]["ReadonlyRootfs"] is True
    assert info["HostConfig"]["CapDrop"] == ["ALL"]
    models = [m for m in info["Mounts"] if m["Destination"] == "/models"]
    assert models and models[0]["RW"] is False and models[0]["Type"] == "volume"
    assert info["HostConfig"]["ShmSize"] >= 1 << 30


def test_healthy_means_every_model_answered_the_canary(cpu_stack: Stack) -> None:
    """The healthcheck that `up --wait` waited for is the canary: each model of the served repository
    answered its smallest request (not merely /v2/health/ready)."""
    container = cpu_stack.container("triton")
    log = json.loads(run(["docker", "inspect", "-f", "{{json .State.Health.Log}}", container]).stdout)
    assert log and log[-1]["ExitCode"] == 0, log
    assert re.search(r"canary: 3 of 3 models answered in \d+ ms", log[-1]["Output"]), log[-1]["Output"]


def test_restricted_apis_need_the_key_from_the_environment(cpu_stack: Stack) -> None:
    url = f"http://{cpu_stack.http_url}/v2/repository/index"
    assert http_status(url, method="POST") == 403
    assert http_status(url, method="POST", headers={"tritonbundle-key": "wrong"}) == 403
    assert http_status(url, method="POST", headers={"tritonbundle-key": cpu_stack.api_key}) == 200
    assert http_status(f"http://{cpu_stack.http_url}/v2/health/ready") == 200


def test_metrics_endpoint_serves_the_series_the_dashboard_plots(cpu_stack: Stack) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{cpu_stack.metrics_port}/metrics", timeout=10) as r:  # noqa: S310
        served = {line.split("{")[0].split()[0] for line in r.read().decode().splitlines() if line and not line.startswith("#")}
    board = (DOCKER_DIR / "monitoring" / "grafana" / "dashboards" / "tritonbundle.json").read_text()
    plotted = set(re.findall(r"\bnv_[a-z_]+", board))
    # nv_gpu_* series exist only where Triton sees a GPU.
    missing = {m for m in plotted - served if not m.startswith("nv_gpu_")}
    assert not missing, f"the dashboard plots series this Triton does not serve: {sorted(missing)}"


def test_short_load_test_writes_a_report(cpu_stack: Stack) -> None:
    result = cpu_stack.compose("--profile", "loadtest", "run", "--rm", "loadtest",
                               "--users", "2", "--window-s", "4", timeout_s=300, check=False)
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    summary = json.loads((cpu_stack.reports / "loadtest" / "summary.json").read_text())
    text = json.dumps(summary)
    assert summary["gates"]["passed"] is True, text[:2000]
    assert "SLO: passed" in result.stdout
    assert (cpu_stack.reports / "loadtest" / "report.html").exists()
    assert '"grpc"' in text and '"http"' in text


def test_restarting_triton_does_not_rerun_export_or_build(cpu_stack: Stack) -> None:
    finished = {s: run(["docker", "inspect", "-f", "{{.State.FinishedAt}}", cpu_stack.container(s)]).stdout.strip()
                for s in ("export", "build")}
    cpu_stack.compose("restart", "triton", timeout_s=180)
    wait_healthy(cpu_stack, "triton")
    # The edge is restarted with triton (depends_on restart: true: nginx resolves `triton` when it starts).
    wait_healthy(cpu_stack, "edge")
    for service, before in finished.items():
        after = run(["docker", "inspect", "-f", "{{.State.FinishedAt}}", cpu_stack.container(service)]).stdout.strip()
        assert after == before, f"{service} ran again on a restart of triton"
    http, grpc = embed_both(cpu_stack)
    assert http.shape == grpc.shape == (3, 384)


def test_a_second_up_reuses_the_export_and_keeps_triton_running(cpu_stack: Stack) -> None:
    triton, edge = cpu_stack.container("triton"), cpu_stack.container("edge")
    since = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    time.sleep(1)
    cpu_stack.compose("up", "-d", "--wait", "--wait-timeout", "300", timeout_s=600)
    assert cpu_stack.container("triton") == triton, "triton was recreated although nothing changed"
    assert cpu_stack.container("edge") == edge, "the edge was recreated although nothing changed"
    export_log = cpu_stack.logs("export", since=since)
    build_log = cpu_stack.logs("build", since=since)
    assert "is up to date (export.json matches); skipping export" in export_log, export_log
    assert "exporting minilm" not in export_log
    # The CPU image has no torch: the build takes the export the export service checked.
    assert "using the existing export" in build_log, build_log
    assert "wrote /var/lib/tritonbundle/repository/model_repository" in build_log
    http, _ = embed_both(cpu_stack)
    assert http.shape == (3, 384)


def test_run_build_force_rebuilds_without_exporting_and_check_compares_the_repository(cpu_stack: Stack) -> None:
    """docker/README.md: arguments after `run --rm build` extend the service's `tritonbundle build`
    command. `--force` rebuilds from the export in the artifacts volume (the build's image has no
    torch); `--check` then finds the repository as a build would write it; `--reexport` needs torch."""
    forced = cpu_stack.compose("run", "--rm", "build", "--force", timeout_s=600, check=False)
    output = forced.stdout + forced.stderr
    assert forced.returncode == 0, output[-3000:]
    assert "using the existing export" in output and "exporting minilm" not in output, output[-3000:]
    assert "wrote /var/lib/tritonbundle/repository/model_repository" in output, output[-3000:]
    checked = cpu_stack.compose("run", "--rm", "--no-deps", "build", "--check", timeout_s=300, check=False)
    assert checked.returncode == 0, (checked.stdout + checked.stderr)[-3000:]
    reexport = cpu_stack.compose("run", "--rm", "--no-deps", "build", "--reexport", timeout_s=300, check=False)
    assert reexport.returncode != 0
    assert "needs torch" in reexport.stdout + reexport.stderr, (reexport.stdout + reexport.stderr)[-3000:]
    # Triton still serves what it loaded.
    http, _ = embed_both(cpu_stack)
    assert http.shape == (3, 384)


def test_down_removes_containers_volumes_and_the_network(cpu_stack: Stack) -> None:
    cpu_stack.down()
    leftovers = run(["docker", "ps", "-a", "-q", "--filter", f"label=com.docker.compose.project={cpu_stack.project}"]).stdout
    volumes = run(["docker", "volume", "ls", "-q", "--filter", f"label=com.docker.compose.project={cpu_stack.project}"]).stdout
    networks = run(["docker", "network", "ls", "-q", "--filter", f"label=com.docker.compose.project={cpu_stack.project}"]).stdout
    assert not leftovers.strip() and not volumes.strip() and not networks.strip()
