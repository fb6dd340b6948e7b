"""Harness of the Docker tests: a real engine, the project's images, the CPU compose stack.

Session fixtures, each done once and only when a test needs it:

* ``docker_engine``: ``docker/engine.sh`` installs Debian's docker.io and Compose v2 when missing and
  starts dockerd when none answers. When that is impossible (no root, no apt) the tests skip with the
  script's reason, or fail when ``TRITONBUNDLE_REQUIRE_DOCKER=1``.
* ``base_image``: ``docker/bootstrap-base.sh``: the public Debian image where a registry answers, else a
  debootstrapped local one (its tag stays on the machine, so later runs skip this).
* ``cpu_images`` / ``standin_images``: ``docker compose build`` (the CPU stack's images: export, cpu, edge). Docker's layer cache makes a second run
  take seconds. The GPU images cannot be built here (no NGC registry): ``standin_images`` builds their
  Dockerfiles on the local Debian base in place of the NGC TensorRT / tritonserver images, to check what
  does not depend on NGC (user, packages, the Helm chart's contract, layers).
* ``cpu_stack``: ``docker compose -f docker/compose.yaml -f docker/compose.cpu.yaml up -d --wait`` on free
  loopback ports, under a project name of its own; ``down -v`` afterwards, also when a test failed. Stacks
  left by a run that was killed are removed first.

Every external command runs with a timeout; its output is in the assertion message when it fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER_DIR = ROOT / "docker"
COMPOSE_FILE = DOCKER_DIR / "compose.yaml"
COMPOSE_CPU_FILE = DOCKER_DIR / "compose.cpu.yaml"
VERSIONS_ENV = DOCKER_DIR / "versions.env"
#: The documented alternative NGC release (docker/README.md, "NGC releases").
VERSIONS_25_08_ENV = DOCKER_DIR / "versions-25.08.env"
#: Compose projects of these tests are named PROJECT_PREFIX + pid; leftovers of killed runs are removed.
PROJECT_PREFIX = "tritonbundle-test-"
#: Compose project the images are built under. Compose labels images with their project's name, so a name
#: of its own per run would make every run's images new ones (and re-export every layer); this one is fixed.
BUILD_PROJECT = "tritonbundle-test"
#: TRITONBUNDLE_TAG of the stand-in GPU images (their Dockerfiles built on the local Debian base, not on
#: NGC images); compose adds -ngc<NGC_RELEASE> to it.
STANDIN_TAG = "standin"
#: Variables that steer docker/compose.yaml: taken out of the tests' environment so a developer's shell
#: settings do not change what is tested.
COMPOSE_VARIABLES = (
    "TRITONBUNDLE_", "PYTHON_BASE_IMAGE", "TENSORRT_IMAGE", "TRITONSERVER_IMAGE", "NGC_RELEASE", "TORCH_",
    "PROMETHEUS_", "GRAFANA_", "COMPOSE_", "DOCKER_DEFAULT_PLATFORM",
)

ENGINE_TIMEOUT_S = 900
BOOTSTRAP_TIMEOUT_S = 1200
BUILD_TIMEOUT_S = 1800
UP_TIMEOUT_S = 600
COMMAND_TIMEOUT_S = 120


def tail(text: str | bytes | None, lines: int = 60) -> str:
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def run(
    args: Sequence[str], *, timeout_s: float = COMMAND_TIMEOUT_S, env: dict[str, str] | None = None,
    check: bool = True, cwd: Path = ROOT,
) -> subprocess.CompletedProcess[str]:
    """Run a command with a timeout; on failure (or timeout) raise with its output."""
    shown = " ".join(args)
    try:
        result = subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"`{shown}` timed out after {timeout_s:g} s\n{tail(e.stdout)}\n{tail(e.stderr)}") from e
    if check and result.returncode != 0:
        raise AssertionError(f"`{shown}` exited with {result.returncode}\n{tail(result.stdout)}\n{tail(result.stderr)}")
    return result


def clean_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(COMPOSE_VARIABLES)}


def read_env_file(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            values[key.strip()] = value.strip()
    return values


def free_ports(count: int) -> list[int]:
    """``count`` different free ports on 127.0.0.1 (each socket held until all are chosen)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]


#: The test that takes the CPU stack down (test_cpu_stack.py) runs after every other test that uses it
#: (test_edge.py too), whatever the files' order.
STACK_TEARDOWN_TEST = "test_down_removes_containers_volumes_and_the_network"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    last = [item for item in items if item.name == STACK_TEARDOWN_TEST]
    items[:] = [item for item in items if item.name != STACK_TEARDOWN_TEST] + last


# -- the engine -----------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def docker_engine() -> None:
    """A Docker engine and Compose v2, installed and started by docker/engine.sh when missing."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the Docker tests install and start a Linux Docker engine; this is not Linux")
    try:
        result = subprocess.run([str(DOCKER_DIR / "engine.sh")], capture_output=True, text=True, timeout=ENGINE_TIMEOUT_S)
        problem = None if result.returncode == 0 else tail(result.stderr or result.stdout, 15)
    except subprocess.TimeoutExpired as e:
        problem = f"docker/engine.sh timed out after {ENGINE_TIMEOUT_S} s\n{tail(e.stderr, 15)}"
    if problem is not None:
        reason = f"no Docker engine could be started (docker/engine.sh): {problem}"
        if os.environ.get("TRITONBUNDLE_REQUIRE_DOCKER") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    remove_leftover_projects()


def remove_leftover_projects() -> None:
    """Stacks of earlier test runs that were killed before their cleanup (the name carries their pid)."""
    result = run(["docker", "compose", "ls", "--all", "--format", "json"], check=False)
    try:
        projects = json.loads(result.stdout or "[]")
    except json.JSONDecodeError:
        projects = []
    names = {p.get("Name", "") for p in projects}
    # Volumes outlive their containers: find projects by their volumes' labels too.
    volumes = run(["docker", "volume", "ls", "--format", '{{.Label "com.docker.compose.project"}}'], check=False)
    names |= set(volumes.stdout.split())
    for name in sorted(n for n in names if n.startswith(PROJECT_PREFIX)):
        pid = name.removeprefix(PROJECT_PREFIX)
        if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
            run(["docker", "compose", "-p", name, "down", "-v", "--remove-orphans", "--timeout", "5"],
                check=False, timeout_s=180)


# -- images -----------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def base_image(docker_engine: None) -> str:
    """The Debian/Python base: $PYTHON_BASE_IMAGE, else docker/bootstrap-base.sh's answer."""
    if os.environ.get("PYTHON_BASE_IMAGE"):
        return os.environ["PYTHON_BASE_IMAGE"]
    result = run([str(DOCKER_DIR / "bootstrap-base.sh")], timeout_s=BOOTSTRAP_TIMEOUT_S)
    return result.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def local_wheels() -> list[Path]:
    """torch's CPU wheel from the wheel folders pip is configured with (its find-links, from the
    environment or pip's config files), linked into the git-ignored docker/wheels so the export
    image does not need download.pytorch.org."""
    version = pinned_version("torch")
    wanted = f"torch-{version}+cpu-*.whl"
    target = DOCKER_DIR / "wheels"
    links = os.environ.get("PIP_FIND_LINKS", "").split()
    config = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                            timeout=60, check=False).stdout
    for line in config.splitlines():
        key, _, value = line.partition("=")
        if key.strip().endswith("find-links"):
            links += value.strip().strip("'\"").split()
    folders = list(dict.fromkeys(Path(p.removeprefix("file://")) for p in links))
    linked = []
    for folder in folders:
        if not folder.is_dir():
            continue
        for wheel in folder.glob(wanted):
            dest = target / wheel.name
            if not dest.exists():
                try:
                    os.link(wheel, dest)
                except OSError:
                    shutil.copy2(wheel, dest)
            linked.append(dest)
    return linked


def pinned_version(name: str) -> str:
    for line in (ROOT / "requirements" / "constraints.txt").read_text().splitlines():
        if line.lower().startswith(f"{name}=="):
            return line.split("==", 1)[1].strip()
    raise AssertionError(f"requirements/constraints.txt pins no {name}")


@dataclass
class Stack:
    """One compose project of the tests: its name, files, environment and published ports."""

    project: str
    files: tuple[Path, ...]
    env: dict[str, str]
    http_port: int = 0
    grpc_port: int = 0
    metrics_port: int = 0
    api_key: str = ""
    reports: Path = Path()

    def compose(self, *args: str, timeout_s: float = COMMAND_TIMEOUT_S, check: bool = True) -> subprocess.CompletedProcess[str]:
        base = ["docker", "compose", "--progress", "plain", "-p", self.project]
        for f in self.files:
            base += ["-f", str(f)]
        return run([*base, *args], env=self.env, timeout_s=timeout_s, check=check)

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def container(self, service: str) -> str:
        ids = self.compose("ps", "--all", "-q", service).stdout.split()
        assert ids, f"no container for service {service}"
        return ids[0]

    def logs(self, *services: str, since: str | None = None) -> str:
        args = ["logs", "--no-color", "--no-log-prefix"]
        if since:
            args += ["--since", since]
        return self.compose(*args, *services, check=False).stdout

    def down(self) -> None:
        self.compose("down", "-v", "--remove-orphans", "--timeout", "10", timeout_s=300, check=False)


@pytest.fixture(scope="session")
def cpu_stack_config(base_image: str, local_wheels: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Stack:
    reports = tmp_path_factory.mktemp("compose-reports")
    reports.chmod(0o777)  # the load test container writes as uid 1000
    key = "test-" + secrets.token_hex(12)
    http, grpc, metrics = free_ports(3)
    stack = Stack(
        project=f"{PROJECT_PREFIX}{os.getpid()}",
        files=(COMPOSE_FILE, COMPOSE_CPU_FILE),
        env={},
        http_port=http, grpc_port=grpc, metrics_port=metrics,
        api_key=key, reports=reports,
    )
    stack.env = {
        **clean_environment(),
        "PYTHON_BASE_IMAGE": base_image,
        "TRITONBUNDLE_HTTP_PORT": str(stack.http_port),
        "TRITONBUNDLE_GRPC_PORT": str(stack.grpc_port),
        "TRITONBUNDLE_METRICS_PORT": str(stack.metrics_port),
        "TRITONBUNDLE_API_KEY": key,
        "TRITONBUNDLE_REPORTS_DIR": str(reports),
    }
    return stack


@dataclass(frozen=True)
class Images:
    export: str
    cpu: str
    edge: str
    build_standin: str
    server_standin: str

    def all(self) -> dict[str, str]:
        return {"export": self.export, "cpu": self.cpu, "edge": self.edge, "build (stand-in base)": self.build_standin,
                "server (stand-in base)": self.server_standin}


@pytest.fixture(scope="session")
def cpu_images(cpu_stack_config: Stack) -> Iterator[tuple[str, str, str]]:
    """tritonbundle-export, tritonbundle-cpu and tritonbundle-edge, built through compose (cached layers make
    reruns fast).
    Afterwards, earlier builds of the project's images that a rebuild left untagged are removed (only
    those: they carry the label io.tritonbundle.image)."""
    builder = Stack(project=BUILD_PROJECT, files=cpu_stack_config.files, env=cpu_stack_config.env)
    builder.compose("build", timeout_s=BUILD_TIMEOUT_S)
    yield "tritonbundle-export:0.1.0", "tritonbundle-cpu:0.1.0", "tritonbundle-edge:0.1.0"
    run(["docker", "image", "prune", "--force", "--filter", "label=io.tritonbundle.image"], check=False, timeout_s=300)


@pytest.fixture(scope="session")
def standin_images(cpu_stack_config: Stack, base_image: str, cpu_images: tuple[str, str, str]) -> tuple[str, str]:
    """docker/Dockerfile.build and docker/Dockerfile.server built through the GPU compose file, on the
    local Debian base in place of the NGC TensorRT / tritonserver images (which cannot be pulled here)."""
    env = {**cpu_stack_config.env, "TENSORRT_IMAGE": base_image, "TRITONSERVER_IMAGE": base_image,
           "TRITONBUNDLE_TAG": STANDIN_TAG}
    standin = Stack(project=BUILD_PROJECT + "-standin", files=(COMPOSE_FILE,), env=env)
    standin.compose("build", "build", "triton", timeout_s=BUILD_TIMEOUT_S)
    tag = f"{STANDIN_TAG}-ngc{read_env_file(VERSIONS_ENV)['NGC_RELEASE']}"
    return f"tritonbundle-build:{tag}", f"tritonbundle-server:{tag}"


@pytest.fixture(scope="session")
def images(cpu_images: tuple[str, str, str], standin_images: tuple[str, str]) -> Images:
    return Images(*cpu_images, *standin_images)


# -- the CPU stack ----------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def cpu_stack(cpu_stack_config: Stack, cpu_images: tuple[str, str, str]) -> Iterator[Stack]:
    """The CPU variant up and healthy (`up -d --wait`), torn down with its volumes afterwards."""
    stack = cpu_stack_config
    try:
        started = time.monotonic()
        result = stack.compose("up", "-d", "--wait", "--wait-timeout", "300", timeout_s=UP_TIMEOUT_S, check=False)
        if result.returncode != 0:
            raise AssertionError(
                f"`docker compose up --wait` failed ({result.returncode})\n{tail(result.stderr)}\n"
                f"--- logs ---\n{tail(stack.logs(), 120)}"
            )
        sys.stderr.write(f"\n[docker tests] CPU stack healthy after {time.monotonic() - started:.0f} s\n")
        yield stack
    finally:
        stack.down()
