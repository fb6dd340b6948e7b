"""docker compose files, checked with Compose itself (`docker compose config`): the GPU stack cannot run
here (no GPU, no NGC registry), so its configuration is what can be proven: GPU reservations, shared
memory, ulimits, the healthcheck, the read-only model mount, loopback ports, the NGC images from
docker/versions.env (26.07) or docker/versions-25.08.env, image tags that carry the NGC release, the
`build` command that `run --rm build ARGS` extends, the edge (nginx) in front of Triton's HTTP and gRPC ports.
Also the CPU variant's swaps and the monitoring files."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.docker.conftest import (
    COMPOSE_CPU_FILE,
    COMPOSE_FILE,
    DOCKER_DIR,
    ROOT,
    VERSIONS_25_08_ENV,
    VERSIONS_ENV,
    clean_environment,
    read_env_file,
    run,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1200)]

Config = dict[str, Any]
GPU_SERVICES = ("build", "triton")
#: Triton's stack in compose (ulimit -s): 256 MB. Measured on the CPU server (Triton 2.51) in compose: JSON
#: nested in a request's data crashes it from 1,987,572 bytes on at 256 MB (from 495,384 at 64 MB), twice
#: the edge's default body limit (docker/README.md, "The edge").
STACK_BYTES = 256 << 20
#: The edge's default body limit (TRITONBUNDLE_EDGE_MAX_BODY).
EDGE_MAX_BODY = "1m"
#: What docker/versions.env and docker/versions-25.08.env pin (docs: docker/README.md, "NGC releases").
RELEASES = {
    VERSIONS_ENV: {
        "NGC_RELEASE": "26.07",
        "TRITONSERVER_IMAGE": "nvcr.io/nvidia/tritonserver:26.07-py3",
        "TENSORRT_IMAGE": "nvcr.io/nvidia/tensorrt:26.07-py3",
        "TENSORRT_VERSION": "11.1.0.106",
        "TRITON_VERSION": "2.71.0",
    },
    VERSIONS_25_08_ENV: {
        "NGC_RELEASE": "25.08",
        "TRITONSERVER_IMAGE": "nvcr.io/nvidia/tritonserver:25.08-py3",
        "TENSORRT_IMAGE": "nvcr.io/nvidia/tensorrt:25.08-py3",
        "TENSORRT_VERSION": "10.13.2.6",
        "TRITON_VERSION": "2.60.0",
    },
}


def compose_config(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> Config:
    result = run(["docker", "compose", *args, "config", "--format", "json"],
                 env={**clean_environment(), **(env or {})}, cwd=cwd)
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def gpu(docker_engine: None) -> Config:
    """What plain `docker compose up` in the repository root starts (the root compose.yaml)."""
    return compose_config()


@pytest.fixture(scope="module")
def cpu(docker_engine: None) -> Config:
    return compose_config("-f", str(COMPOSE_FILE), "-f", str(COMPOSE_CPU_FILE))


def gpu_devices(service: Config) -> list[Config]:
    return service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])


def duration_s(text: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", text))


def test_plain_compose_up_starts_the_gpu_stack_export_build_triton_edge(gpu: Config) -> None:
    assert gpu["name"] == "tritonbundle"
    assert sorted(gpu["services"]) == ["build", "edge", "export", "gateway", "triton"], \
        "profiles keep loadtest and monitoring out"
    triton, build = gpu["services"]["triton"], gpu["services"]["build"]
    assert build["depends_on"]["export"]["condition"] == "service_completed_successfully"
    assert triton["depends_on"]["build"]["condition"] == "service_completed_successfully"
    assert build["entrypoint"][:3] == ["tritonbundle-entrypoint", "tritonbundle", "build"]
    assert ["--target", "gpu"] == build["entrypoint"][5:7] and "tensorrt" in build["entrypoint"]
    # The one-shot stages need no network at all.
    assert gpu["services"]["export"]["network_mode"] == build["network_mode"] == "none"


def test_profiles_add_loadtest_prometheus_and_grafana(docker_engine: None) -> None:
    config = compose_config("--profile", "loadtest", "--profile", "monitoring")
    assert sorted(config["services"]) == ["build", "edge", "export", "gateway", "grafana", "loadtest", "prometheus",
                                          "triton"]
    loadtest = config["services"]["loadtest"]
    # Load goes where clients go: through the edge; Triton's metrics are read directly.
    assert loadtest["depends_on"]["edge"]["condition"] == "service_healthy"
    assert "loadtest" in loadtest["entrypoint"]
    entry = loadtest["entrypoint"]
    assert entry[entry.index("--http-url") + 1] == "edge:8080" and entry[entry.index("--grpc-url") + 1] == "edge:8081"
    assert entry[entry.index("--metrics-url") + 1] == "http://triton:8002/metrics"
    assert any(v["target"] == "/reports" and v["type"] == "bind" for v in loadtest["volumes"])


def test_run_build_args_extend_the_build_command(gpu: Config, cpu: Config) -> None:
    """`docker compose run --rm build --force` must reach `tritonbundle build` as an extra option: the
    whole command is the service's entrypoint and there is no command for `run` arguments to replace
    (the image's CMD is not inherited when the entrypoint is set). The CPU stack test runs it."""
    for config in (gpu, cpu):
        build = config["services"]["build"]
        assert not build.get("command"), build.get("command")
        assert build["entrypoint"][-2:] == ["--repository", "/var/lib/tritonbundle/repository/model_repository"]
        assert not {"--force", "--reexport", "--check"} & set(build["entrypoint"])


def test_gpu_services_reserve_an_nvidia_gpu(gpu: Config) -> None:
    for name in GPU_SERVICES:
        devices = gpu_devices(gpu["services"][name])
        assert devices, f"{name} has no device reservation"
        assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
        assert devices[0].get("count") == 1 or devices[0].get("device_ids")
    assert not gpu_devices(gpu["services"]["export"]), "the export runs on CPU"


def test_triton_has_shm_size_ulimits_healthcheck_restart_policy_and_a_read_only_repository(gpu: Config) -> None:
    triton = gpu["services"]["triton"]
    assert int(triton["shm_size"]) >= 1 << 30
    assert triton["ulimits"]["memlock"] == -1 or triton["ulimits"]["memlock"] == {"soft": -1, "hard": -1}
    # 256 MB: Triton before NGC 26.05 survives the deepest JSON the edge's default body limit lets through.
    assert triton["ulimits"]["stack"] in (STACK_BYTES, {"soft": STACK_BYTES, "hard": STACK_BYTES})
    health = triton["healthcheck"]
    assert health["test"][:3] == ["CMD", "python3", SERVER_CANARY], "the server image has no tritonbundle package"
    assert_canary_probes_the_served_repository(triton)
    assert duration_s(health["start_period"]) >= 300, "plan loading takes minutes on a GPU"
    assert triton["restart"] == "unless-stopped"
    mounts = [v for v in triton["volumes"] if v["target"] == "/models"]
    assert mounts and mounts[0]["source"] == "model_repository" and mounts[0]["read_only"] is True
    # Compose creates every container before `build` runs: copying the image's /models into the empty
    # volume then gave its top folder root's ownership, and the build (uid 1000) could not write into it.
    for name in ("triton", "edge"):
        (mount,) = [v for v in gpu["services"][name]["volumes"] if v.get("source") == "model_repository"]
        assert mount["volume"]["nocopy"] is True, name
    assert re.search(r"mkdir -p /models && chown 1000:1000 /models", (DOCKER_DIR / "Dockerfile.server").read_text())
    assert "--model-control-mode=none" in triton["command"]
    assert triton["read_only"] is True and triton["cap_drop"] == ["ALL"]
    assert "TRITONBUNDLE_API_KEY" in triton["environment"], "restricted APIs take their key from the environment"
    # The plan check's override of the TensorRT version it finds: passed through, empty by default.
    assert triton["environment"]["TRITONBUNDLE_TENSORRT_VERSION"] == ""


#: The canary the server image's healthcheck runs (docker/Dockerfile.server copies tritonbundle/canary.py there).
SERVER_CANARY = "/opt/tritonbundle/bin/canary.py"
CANARY_SOURCE = ROOT / "tritonbundle" / "canary.py"


def option(argv: list[str], name: str) -> str:
    """The value of ``name`` in ``argv``, given as ``name value`` or ``name=value``."""
    for i, arg in enumerate(argv):
        if arg == name:
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{name} is not in {argv}")


def canary_fits(test: list[str], timeout_s: float) -> bool:
    """The canary's requests are long enough for a dead stub's 500, and its deadline (--deadline-s) holds
    the first model's worst case (5 request timeouts, the first metrics read included) at least 2 s inside
    the healthcheck's timeout."""
    request_s, deadline_s = float(option(test, "--timeout-s")), float(option(test, "--deadline-s"))
    return 2 <= request_s and 5 * request_s <= deadline_s <= timeout_s - 2


def assert_canary_probes_the_served_repository(triton: Config) -> None:
    """The healthcheck sends every model of the repository Triton serves (inside the read-only mount) its
    smallest request on the container's own HTTP port; its request timeouts fit in the check's timeout."""
    health = triton["healthcheck"]
    test = health["test"]
    served = option(triton["command"], "--model-repository" if triton["command"][0] == "tritonserver" else "--repository")
    assert option(test, "--repository") == served == "/models/model_repository"
    assert any(served.startswith(v["target"] + "/") for v in triton["volumes"]), "the repository is a mount"
    assert option(test, "--url") == "http://127.0.0.1:8000" and option(triton["command"], "--http-port") == "8000"
    # Three requests per model (ready, config, inference), each given --timeout-s: the check ends by
    # --deadline-s, inside the check's timeout, with time for one request. A dead stub's 500 comes after
    # the Python backend's 1 s stub check: a shorter timeout, and it would pass as busy.
    assert canary_fits(test, duration_s(health["timeout"]))
    assert "/v2/health/ready" not in " ".join(test), "ready says nothing about a dead Python stub"
    # A hung server (ready, yet nothing answers) is told from a busy one by Triton's metrics.
    assert option(test, "--metrics-url") == "http://127.0.0.1:8002/metrics"
    # ... while its processes sit idle: a long execute() keeps a core busy and is busy, not hung.
    assert "--server-cpu" in test


def test_images_healthchecks_run_the_canary_on_the_repository_their_command_serves() -> None:
    """The Dockerfiles' HEALTHCHECKs (what `docker run` without compose gets) run the same canary as compose;
    the server image carries it as a copy of tritonbundle/canary.py (no tritonbundle package there), which the
    build context admits."""
    for name, canary in (("Dockerfile.server", ["python3", SERVER_CANARY]),
                         ("Dockerfile.cpu", ["python3", "-m", "tritonbundle.canary"])):
        text = (DOCKER_DIR / name).read_text()
        health = re.search(r"^HEALTHCHECK (.*?)\\\n\s+CMD (\[.*\])$", text, re.M)
        assert health, f"{name}: no HEALTHCHECK in exec form"
        test = json.loads(health.group(2))
        assert test[:len(canary)] == canary, f"{name}: {test}"
        cmd = json.loads(re.search(r"^CMD (\[.*\])$", text, re.M).group(1))  # type: ignore[union-attr]
        served = option(cmd, "--model-repository" if cmd[0] == "tritonserver" else "--repository")
        assert option(test, "--repository") == served == "/models/model_repository", name
        assert option(test, "--url") == "http://127.0.0.1:8000", name
        assert option(test, "--metrics-url") == "http://127.0.0.1:8002/metrics" and "--server-cpu" in test, name
        timeout = duration_s(re.search(r"--timeout=(\S+)", health.group(1)).group(1))  # type: ignore[union-attr]
        assert canary_fits(test, timeout), name
    server = (DOCKER_DIR / "Dockerfile.server").read_text()
    assert re.search(rf"^COPY tritonbundle/canary\.py {re.escape(SERVER_CANARY)}$", server, re.M)
    # The module runs as a script there: standard library only, no tritonbundle imports.
    assert not re.search(r"^\s*(from|import) tritonbundle", CANARY_SOURCE.read_text(), re.M)
    assert "!tritonbundle/" in (ROOT / ".dockerignore").read_text().splitlines()


def test_engines_and_timing_cache_live_in_named_volumes(gpu: Config) -> None:
    build = gpu["services"]["build"]
    by_target = {v["target"]: v for v in build["volumes"]}
    assert by_target["/opt/tritonbundle/build/artifacts"]["type"] == "volume"  # exports, timing cache
    assert by_target["/var/lib/tritonbundle/repository"]["type"] == "volume"  # plans + configs
    assert {"artifacts", "model_repository"} <= set(gpu["volumes"])


def test_the_gateway_serves_the_openai_api_behind_the_edge_with_usage_in_a_volume(gpu: Config) -> None:
    gateway, edge = gpu["services"]["gateway"], gpu["services"]["edge"]
    entry = gateway["entrypoint"]
    assert entry[:3] == ["tritonbundle-entrypoint", "tritonbundle", "gateway"]
    assert entry[entry.index("--url") + 1] == "triton:8001" and entry[entry.index("--port") + 1] == "8090"
    assert entry[entry.index("--model") + 1] == "minilm" and entry[entry.index("--metrics-port") + 1] == "9091"
    assert entry[entry.index("--usage-log") + 1] == "/var/lib/tritonbundle/usage/usage.jsonl"
    assert any(v["type"] == "volume" and v["source"] == "usage" for v in gateway["volumes"])
    assert gateway["depends_on"]["triton"]["condition"] == "service_healthy"
    assert not gateway["environment"].get("TRITONBUNDLE_TENANTS"), "no tenants file unless one is set"
    assert not edge["environment"]["TRITONBUNDLE_EDGE_TENANTS"]
    with_tenants = compose_config(env={"TRITONBUNDLE_TENANTS_FILE": "/srv/tenants.yaml"})["services"]
    assert with_tenants["gateway"]["environment"]["TRITONBUNDLE_TENANTS"] == "/etc/tritonbundle/tenants.yaml"
    assert with_tenants["edge"]["environment"]["TRITONBUNDLE_EDGE_TENANTS"] == "on"
    assert any(v["source"] == "/srv/tenants.yaml" and v["target"] == "/etc/tritonbundle/tenants.yaml"
               for v in with_tenants["gateway"]["volumes"])
    assert edge["environment"]["TRITONBUNDLE_EDGE_GATEWAY"] == "gateway:8090" and "gateway" in edge["depends_on"]
    assert gateway["read_only"] is True and gateway["cap_drop"] == ["ALL"] and "ports" not in gateway


def test_ports_are_published_on_loopback_unless_a_bind_address_is_set(gpu: Config, docker_engine: None) -> None:
    """HTTP and gRPC are the edge's (8080, 8081 in its container); only metrics are published from triton."""
    published = {name: sorted((p["target"], p["published"]) for p in service.get("ports", []))
                 for name, service in gpu["services"].items()}
    assert published == {"export": [], "build": [], "gateway": [], "triton": [(8002, "8002")],
                         "edge": [(8080, "8000"), (8081, "8001")]}
    assert {p["host_ip"] for s in gpu["services"].values() for p in s.get("ports", [])} == {"127.0.0.1"}
    exposed = compose_config("--profile", "monitoring", env={
        "TRITONBUNDLE_BIND_ADDRESS": "0.0.0.0", "TRITONBUNDLE_HTTP_PORT": "9000", "TRITONBUNDLE_GRPC_PORT": "9001",
        "TRITONBUNDLE_METRICS_PORT": "9002"})
    ports = exposed["services"]["edge"]["ports"]
    assert {p["host_ip"] for p in ports} == {"0.0.0.0"}
    assert {p["target"]: p["published"] for p in ports} == {8080: "9000", 8081: "9001"}
    # Triton's metrics, Prometheus and Grafana have no authentication: they open only with their own setting.
    unauthenticated = [p for s in ("triton", "prometheus", "grafana") for p in exposed["services"][s]["ports"]]
    assert {p["host_ip"] for p in unauthenticated} == {"127.0.0.1"} and len(unauthenticated) == 3
    opened = compose_config("--profile", "monitoring", env={"TRITONBUNDLE_MONITORING_BIND_ADDRESS": "0.0.0.0"})
    assert {p["host_ip"] for s in ("triton", "prometheus", "grafana") for p in opened["services"][s]["ports"]} == {"0.0.0.0"}
    assert {p["host_ip"] for p in opened["services"]["edge"]["ports"]} == {"127.0.0.1"}


def test_every_container_log_is_rotated(docker_engine: None) -> None:
    """Docker's json-file driver keeps every line unless told, and the edge logs each request."""
    for config in (compose_config("--profile", "loadtest", "--profile", "monitoring"),
                   compose_config("-f", str(COMPOSE_FILE), "-f", str(COMPOSE_CPU_FILE), "--profile", "monitoring")):
        for name, service in config["services"].items():
            assert service.get("logging") == {"driver": "json-file", "options": {"max-size": "50m", "max-file": "5"}}, name


def test_ngc_images_come_from_versions_env_through_both_entry_points(gpu: Config, docker_engine: None) -> None:
    pinned = read_env_file(VERSIONS_ENV)
    # docker/.env is how compose finds versions.env when docker/ is the project directory: a link, so
    # versions.env stays the one place the release is written.
    dot_env = DOCKER_DIR / ".env"
    assert dot_env.is_symlink() and dot_env.resolve() == VERSIONS_ENV.resolve()
    from_docker_dir = compose_config("-f", str(COMPOSE_FILE))
    for config in (gpu, from_docker_dir):
        for service in ("export", "build", "triton"):
            args = config["services"][service]["build"]["args"]
            assert args["TENSORRT_IMAGE"] == pinned["TENSORRT_IMAGE"]
            assert args["TRITONSERVER_IMAGE"] == pinned["TRITONSERVER_IMAGE"]
    assert pinned["TENSORRT_IMAGE"].endswith(f":{pinned['NGC_RELEASE']}-py3")
    assert pinned["TRITONSERVER_IMAGE"].endswith(f":{pinned['NGC_RELEASE']}-py3")
    assert gpu["services"] == from_docker_dir["services"]


def test_versions_env_pins_26_07_and_versions_25_08_env_the_alternative() -> None:
    for path, wanted in RELEASES.items():
        assert read_env_file(path) == wanted, path.name
    # A build number once written here for 25.08 that is not its TensorRT (10.13.2.6 is): nowhere in docker/ or
    # these tests.
    wrong = ".".join(("10", "13", "0", "35"))
    for folder in (DOCKER_DIR, Path(__file__).parent):
        for path in folder.rglob("*"):
            if path.is_file() and path.suffix not in (".whl", ".pyc"):
                assert wrong not in path.read_text(errors="replace"), path


def test_the_25_08_env_file_switches_images_and_tags_through_both_entry_points(docker_engine: None) -> None:
    """docker/README.md: `--env-file docker/versions-25.08.env` from the root (it wins over the root
    compose.yaml's include env_file) and with -f docker/compose.yaml (it replaces docker/.env)."""
    version = project_version()
    from_root = compose_config("--env-file", str(VERSIONS_25_08_ENV))
    from_docker_dir = compose_config("-f", str(COMPOSE_FILE), "--env-file", str(VERSIONS_25_08_ENV))
    for config in (from_root, from_docker_dir):
        services = config["services"]
        assert services["build"]["build"]["args"]["TENSORRT_IMAGE"] == "nvcr.io/nvidia/tensorrt:25.08-py3"
        assert services["triton"]["build"]["args"]["TRITONSERVER_IMAGE"] == "nvcr.io/nvidia/tritonserver:25.08-py3"
        assert services["build"]["image"] == f"tritonbundle-build:{version}-ngc25.08"
        assert services["triton"]["image"] == f"tritonbundle-server:{version}-ngc25.08"
        assert services["export"]["image"] == f"tritonbundle-export:{version}"


def test_build_and_server_images_cannot_be_tagged_without_an_ngc_release(docker_engine: None) -> None:
    """Images named but no NGC_RELEASE (an env file of one's own in place of versions.env): compose
    refuses the GPU stack instead of tagging its images without a release."""
    result = run(["docker", "compose", "-f", str(COMPOSE_FILE), "--env-file", "/dev/null", "config", "-q"],
                 env={**clean_environment(), "TENSORRT_IMAGE": "t:1", "TRITONSERVER_IMAGE": "s:1"}, check=False)
    assert result.returncode != 0
    assert "NGC_RELEASE is not set; docker/versions.env pins it" in result.stderr


def test_dockerfiles_name_no_ngc_release_of_their_own() -> None:
    pinned = read_env_file(VERSIONS_ENV)
    for dockerfile in DOCKER_DIR.glob("Dockerfile.*"):
        text = "\n".join(line for line in dockerfile.read_text().splitlines() if not line.lstrip().startswith("#"))
        assert "nvcr.io" not in text and pinned["NGC_RELEASE"] not in text, f"{dockerfile.name} pins an NGC image"


def project_version() -> str:
    return re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)  # type: ignore[union-attr]


def test_image_tags_are_the_project_version_and_the_ngc_release(gpu: Config, docker_engine: None) -> None:
    """The build and server images carry the NGC release in their tag, so that a build image (whose plans
    only run on its TensorRT) pairs with the server image of the same release only."""
    version = project_version()
    release = read_env_file(VERSIONS_ENV)["NGC_RELEASE"]
    images = {name: service["image"] for name, service in gpu["services"].items()}
    assert images == {
        "edge": f"tritonbundle-edge:{version}",
        "export": f"tritonbundle-export:{version}",
        "build": f"tritonbundle-build:{version}-ngc{release}",
        "triton": f"tritonbundle-server:{version}-ngc{release}",
        "gateway": f"tritonbundle-cpu:{version}",
    }
    # TRITONBUNDLE_TAG and TRITONBUNDLE_REGISTRY keep the release suffix.
    custom = compose_config(env={"TRITONBUNDLE_TAG": "1.2.3", "TRITONBUNDLE_REGISTRY": "reg.example/ml/"})
    assert custom["services"]["build"]["image"] == f"reg.example/ml/tritonbundle-build:1.2.3-ngc{release}"
    assert custom["services"]["triton"]["image"] == f"reg.example/ml/tritonbundle-server:1.2.3-ngc{release}"
    # The Helm chart's build image defaults to <appVersion>-ngc<release>: appVersion is this version.
    chart = yaml.safe_load((ROOT / "helm" / "tritonbundle" / "Chart.yaml").read_text())
    assert str(chart["appVersion"]) == version


def test_image_builds_pass_the_ca_bundle_as_a_secret_and_use_the_host_network(gpu: Config) -> None:
    for name, service in gpu["services"].items():
        build = service["build"]
        assert build["network"] == "host", name
        assert [s["source"] for s in build["secrets"]] == ["ca"], name
    assert gpu["secrets"]["ca"]["file"] == "/etc/ssl/certs/ca-certificates.crt"


def test_cpu_variant_swaps_the_gpu_services_for_the_cpu_image(cpu: Config) -> None:
    assert sorted(cpu["services"]) == ["build", "edge", "export", "gateway", "triton"]
    for name, service in cpu["services"].items():
        assert not gpu_devices(service), f"{name} still reserves a GPU"
    build, triton = cpu["services"]["build"], cpu["services"]["triton"]
    assert build["image"] == triton["image"] == "tritonbundle-cpu:0.1.0"
    assert ["--target", "cpu"] == build["entrypoint"][5:7] and "onnxruntime" in build["entrypoint"]
    assert triton["command"][:2] == ["tritonbundle", "serve"] and "--model-control-mode" in triton["command"]
    assert triton["build"]["dockerfile"] == "docker/Dockerfile.cpu"
    # kept from the GPU stack: healthcheck (the canary, from the installed package: the CPU image has no
    # /opt/tritonbundle/bin), shm, read-only repository, loopback ports, restart policy
    assert triton["healthcheck"]["test"][:4] == ["CMD", "python3", "-m", "tritonbundle.canary"]
    assert_canary_probes_the_served_repository(triton)
    assert duration_s(triton["healthcheck"]["interval"]) <= 5, "`up --wait` sees the CPU server soon"
    assert int(triton["shm_size"]) >= 1 << 30
    assert any(v["target"] == "/models" and v["read_only"] for v in triton["volumes"])
    assert {p["host_ip"] for p in triton["ports"]} == {"127.0.0.1"}
    assert triton["restart"] == "unless-stopped"
    assert "memlock" not in triton["ulimits"], "memlock is for CUDA pinned memory"
    assert triton["ulimits"]["stack"] in (STACK_BYTES, {"soft": STACK_BYTES, "hard": STACK_BYTES})
    assert [p["target"] for p in triton["ports"]] == [8002], "HTTP and gRPC only through the edge"
    assert cpu["services"]["edge"] == compose_config()["services"]["edge"], "the same edge in both stacks"


def test_edge_fronts_triton_hardened_and_healthy_only_when_triton_answers_through_it(gpu: Config, docker_engine: None) -> None:
    edge = gpu["services"]["edge"]
    assert edge["build"]["dockerfile"] == "docker/Dockerfile.edge"
    assert edge["depends_on"]["triton"] == {"condition": "service_healthy", "restart": True, "required": True}
    assert edge["environment"] == {"TRITONBUNDLE_EDGE_TRITON_HTTP": "triton:8000", "TRITONBUNDLE_EDGE_TRITON_GRPC": "triton:8001",
                                   "TRITONBUNDLE_EDGE_MAX_BODY": EDGE_MAX_BODY, "TRITONBUNDLE_EDGE_CAPACITY": "",
                                   "TRITONBUNDLE_EDGE_CLIENT_REQUESTS": "", "TRITONBUNDLE_EDGE_REQUESTS": "",
                                   "TRITONBUNDLE_EDGE_CLIENT_CONNECTIONS": "256", "TRITONBUNDLE_EDGE_CONNECTIONS": "4096",
                                   "TRITONBUNDLE_EDGE_GATEWAY": "gateway:8090", "TRITONBUNDLE_EDGE_TENANTS": ""}
    assert "network_mode" not in edge, "the default network, where `triton` resolves"
    # Hardened like every container: read-only root, a tmpfs /tmp, no capabilities, no privilege gain.
    assert edge["read_only"] is True and edge["tmpfs"] == ["/tmp"] and edge["cap_drop"] == ["ALL"]
    assert edge["security_opt"] == ["no-new-privileges:true"]
    assert edge["restart"] == "unless-stopped"
    assert edge["stop_signal"] == "SIGQUIT", "nginx finishes in-flight requests on SIGQUIT, drops them on SIGTERM"
    # `up --wait` waits for this: Triton's readiness, answered through the edge itself.
    test = edge["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python3", "-c"] and "http://127.0.0.1:8080/v2/health/ready" in test[3]
    assert duration_s(edge["healthcheck"]["interval"]) <= 5
    raised = compose_config(env={"TRITONBUNDLE_EDGE_MAX_BODY": "4m"})
    assert raised["services"]["edge"]["environment"]["TRITONBUNDLE_EDGE_MAX_BODY"] == "4m"


def test_edge_image_and_config_agree_with_compose() -> None:
    """Dockerfile.edge builds on PYTHON_BASE_IMAGE like the others, runs as 1000:1000 with nginx's graceful stop
    signal; nginx.conf listens where compose publishes; the entry point's defaults are compose's."""
    dockerfile = (DOCKER_DIR / "Dockerfile.edge").read_text()
    assert re.search(r"^ARG PYTHON_BASE_IMAGE=debian:bookworm-slim$", dockerfile, re.M)
    assert re.search(r"^FROM \$\{PYTHON_BASE_IMAGE\}", dockerfile, re.M)
    assert re.search(r"^USER 1000:1000$", dockerfile, re.M) and re.search(r"^STOPSIGNAL SIGQUIT$", dockerfile, re.M)
    assert "COPY docker/edge/nginx.conf docker/edge/settings.conf.template /etc/tritonbundle-edge/" in dockerfile
    assert "http://127.0.0.1:8080/v2/health/ready" in dockerfile
    assert "!docker/edge/" in (ROOT / ".dockerignore").read_text().splitlines()
    nginx = (DOCKER_DIR / "edge" / "nginx.conf").read_text()
    assert re.findall(r"^\s*listen (\d+)[ ;]", nginx, re.M) == ["8080", "8081"]
    assert "include settings.conf;" in nginx and "proxy_request_buffering on;" in nginx
    entrypoint = (DOCKER_DIR / "edge" / "entrypoint.sh").read_text()
    for default in ('TRITONBUNDLE_EDGE_TRITON_HTTP:-triton:8000', 'TRITONBUNDLE_EDGE_TRITON_GRPC:-triton:8001',
                    f'TRITONBUNDLE_EDGE_MAX_BODY:-{EDGE_MAX_BODY}'):
        assert default in entrypoint, default


def test_prometheus_scrapes_triton_and_grafana_is_provisioned_with_the_dashboard() -> None:
    prometheus = yaml.safe_load((DOCKER_DIR / "monitoring" / "prometheus.yml").read_text())
    targets = [t for job in prometheus["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    assert targets == ["triton:8002", "gateway:9091"]
    assert [job["job_name"] for job in prometheus["scrape_configs"]] == ["triton", "gateway"]
    provisioning = DOCKER_DIR / "monitoring" / "grafana" / "provisioning"
    datasource = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
    provider = yaml.safe_load((provisioning / "dashboards" / "tritonbundle.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/etc/grafana/dashboards"


def test_compose_dashboard_is_generated_from_the_helm_dashboard_and_has_the_required_panels() -> None:
    check = subprocess.run([sys.executable, str(DOCKER_DIR / "monitoring" / "make-dashboard.py"), "--check"],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    board = json.loads((DOCKER_DIR / "monitoring" / "grafana" / "dashboards" / "tritonbundle.json").read_text())
    exprs = {p["title"]: " ".join(t["expr"] for t in p.get("targets", [])) for p in board["panels"]}
    assert "nv_inference_queue_duration_us" in exprs["Queue time vs compute time per request"]
    assert "nv_inference_compute_infer_duration_us" in exprs["Queue time vs compute time per request"]
    assert "nv_inference_request_success" in exprs["Throughput"]
    assert "nv_inference_exec_count" in exprs["Average batch size"]
    assert "nv_gpu_utilization" in exprs["GPU utilisation"]
    assert "nv_gpu_memory_used_bytes" in exprs["GPU memory"]
    text = json.dumps(board)
    assert "namespace" not in text and "app_kubernetes_io" not in text and 'job=\\"triton\\"' in text


def readme_compose_commands() -> list[tuple[dict[str, str], list[str]]]:
    """Each `docker compose ...` line of docker/README.md's code blocks: its environment assignments
    (inline and from `export` lines before it in the block) and its global options (-f, -p, --profile,
    --env-file)."""
    commands = []
    text = (DOCKER_DIR / "README.md").read_text()
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        env: dict[str, str] = {}
        for line in block.splitlines():
            line = line.split("  #")[0].strip().rstrip("\\").strip()
            if line.startswith("export ") and "=" in line and "$(" not in line:
                key, value = line.removeprefix("export ").split("=", 1)
                env[key] = value.strip("\"'")
                continue
            words = shlex.split(line) if line else []
            inline = {}
            while words and re.match(r"^[A-Z_]+=", words[0]):
                key, value = words.pop(0).split("=", 1)
                inline[key] = value
            if words[:2] != ["docker", "compose"]:
                continue
            options, rest = [], words[2:]
            while rest and rest[0] in ("-f", "-p", "--profile", "--env-file"):
                options += rest[:2]
                rest = rest[2:]
            commands.append(({**env, **inline}, options))
    return commands


def test_compose_commands_in_the_readme_name_valid_files_and_profiles(docker_engine: None) -> None:
    commands = readme_compose_commands()
    assert len(commands) >= 10
    cpu = [env for env, _ in commands if env.get("COMPOSE_FILE") == "docker/compose.yaml:docker/compose.cpu.yaml"]
    assert len(cpu) >= 3, "the CPU stack's commands (up, loadtest, down)"
    for env, options in commands:
        wanted = {k: v for k, v in env.items() if k.startswith(("COMPOSE_", "TRITONBUNDLE_"))}
        config = compose_config(*options, env=wanted)
        assert "triton" in config["services"], (env, options)
        if "docker/compose.cpu.yaml" in options or "compose.cpu.yaml" in wanted.get("COMPOSE_FILE", ""):
            assert config["services"]["triton"]["image"].startswith("tritonbundle-cpu:")
        elif "--env-file" in options:
            release = read_env_file(ROOT / options[options.index("--env-file") + 1])["NGC_RELEASE"]
            assert config["services"]["triton"]["image"].endswith(f"-ngc{release}"), (env, options)
    alternative = [options for _, options in commands if "--env-file" in options]
    assert {options[options.index("--env-file") + 1] for options in alternative} == {"docker/versions-25.08.env"}
    assert any("-f" in options for options in alternative) and any("-f" not in options for options in alternative)
