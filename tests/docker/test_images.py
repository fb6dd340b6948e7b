"""The images: non-root users, no CA bundle or secret in any layer or in the history, the Helm chart's
contract with the build image, the server image's TensorRT plan check behind NVIDIA's entry point, the
INT8 calibration folder, what the build context holds.

The GPU images (docker/Dockerfile.build's `build` stage, docker/Dockerfile.server) are built here from
their Dockerfiles on the local Debian base in place of the NGC TensorRT / tritonserver images, which no
registry here serves ("stand-in" images): what these tests check does not depend on the NGC base."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from tests.docker.conftest import (
    BUILD_TIMEOUT_S,
    COMMAND_TIMEOUT_S,
    DOCKER_DIR,
    ROOT,
    Images,
    Stack,
    run,
    tail,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(2400)]

HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
PEM = re.compile(r"-----BEGIN CERTIFICATE-----\s*(.+?)\s*-----END CERTIFICATE-----", re.S)


def pem_bodies(text: str) -> set[str]:
    return {"".join(body.split()) for body in PEM.findall(text)}


def test_bootstrapping_the_base_image_again_is_a_no_op(base_image: str) -> None:
    if os.environ.get("PYTHON_BASE_IMAGE"):
        pytest.skip("PYTHON_BASE_IMAGE is set: docker/bootstrap-base.sh was not used")
    started = time.monotonic()
    again = run([str(DOCKER_DIR / "bootstrap-base.sh")], timeout_s=120).stdout.strip()
    assert again == base_image
    assert time.monotonic() - started < 60
    if base_image.startswith("localhost/"):  # the debootstrapped one: Python 3.11, venv, libpython
        check = "import ctypes.util, sys, venv; print(sys.version_info[:2], bool(ctypes.util.find_library('python3.11')))"
        python = run(["docker", "run", "--rm", base_image, "python3", "-c", check])
        assert python.stdout.strip() == "(3, 11) True"


def test_images_run_as_a_non_root_user(images: Images) -> None:
    for name, image in images.all().items():
        user = run(["docker", "image", "inspect", "-f", "{{.Config.User}}", image]).stdout.strip()
        assert user == "1000:1000", f"{name} image runs as {user!r}"
        uid = run(["docker", "run", "--rm", "--entrypoint", "id", image, "-u"], timeout_s=60).stdout.strip()
        assert uid == "1000", f"{name} image runs as uid {uid}"


def test_no_ca_bundle_or_secret_in_the_image_history(images: Images, cpu_stack_config: Stack) -> None:
    for name, image in images.all().items():
        history = run(["docker", "history", "--no-trunc", "--format", "{{.CreatedBy}}", image]).stdout
        assert "BEGIN CERTIFICATE" not in history and "PRIVATE KEY" not in history, name
        assert cpu_stack_config.api_key not in history, name
        for line in history.splitlines():
            if re.match(r"\s*(COPY|ADD)\b", line):
                assert not re.search(r"\.(crt|pem|key)\b|ca-certificates", line), f"{name}: {line}"
        env = json.loads(run(["docker", "image", "inspect", "-f", "{{json .Config.Env}}", image]).stdout)
        assert not [e for e in env if re.match(r"(PIP_CERT|REQUESTS_CA_BUNDLE|SSL_CERT_FILE|TRITONBUNDLE_API_KEY)=", e)], name


CERT_LIKE = re.compile(r"(\.(crt|pem)$)|ca-certificates|ca-bundle|/certs/")


def layer_dirs(image: str) -> list[Path] | None:
    """The image's layers as directories (overlay2: one `diff` folder per layer), or None when the
    engine's storage cannot be read from here (another driver, not root)."""
    info = json.loads(run(["docker", "image", "inspect", "-f", "{{json .GraphDriver}}", image]).stdout)
    if info.get("Name") != "overlay2":
        return None
    data = info.get("Data") or {}
    dirs = [Path(p) for key in ("UpperDir", "LowerDir") for p in (data.get(key) or "").split(":") if p]
    return dirs if dirs and all(d.is_dir() for d in dirs) else None


def certificate_files(image: str) -> dict[str, bytes]:
    """Every certificate-like file in every layer of ``image`` (files deleted by a later layer included)."""
    found: dict[str, bytes] = {}
    dirs = layer_dirs(image)
    if dirs is not None:
        for layer in dirs:
            for folder, _, names in os.walk(layer):
                for name in names:
                    path = Path(folder) / name
                    rel = "/" + str(path.relative_to(layer))
                    if CERT_LIKE.search(rel) and path.is_file() and not path.is_symlink():
                        found[f"{layer.parent.name}:{rel}"] = path.read_bytes()
        return found
    with tempfile.TemporaryFile() as out:  # any other engine: `docker save`, read back
        subprocess.run(["docker", "save", image], stdout=out, check=True, timeout=600)
        out.seek(0)
        with tarfile.open(fileobj=out, mode="r:") as outer:
            for member in outer:
                layer = outer.extractfile(member) if member.isfile() else None
                if layer is None:
                    continue
                try:
                    with tarfile.open(fileobj=layer, mode="r:*") as inner:
                        for item in inner:
                            if item.isfile() and CERT_LIKE.search("/" + item.name):
                                data = inner.extractfile(item)
                                found[f"{member.name}:{item.name}"] = data.read() if data else b""
                except tarfile.ReadError:
                    continue  # a config or manifest blob, not a layer
    return found


def test_no_layer_holds_the_build_machines_ca_certificates(images: Images, base_image: str) -> None:
    """The host's CA bundle reaches pip only as a BuildKit secret: the certificates it has beyond the base
    image's own (a TLS proxy's CA here) are in no layer of any image."""
    host = pem_bodies(HOST_CA_BUNDLE.read_text()) if HOST_CA_BUNDLE.exists() else set()
    base_bundle = run(["docker", "run", "--rm", "--entrypoint", "cat", base_image, str(HOST_CA_BUNDLE)], check=False).stdout
    secret_only = host - pem_bodies(base_bundle)
    if not secret_only:
        pytest.skip("this machine's CA bundle has no certificate the base image lacks: nothing to look for")
    markers = {body[len(body) // 2: len(body) // 2 + 64].encode() for body in secret_only}
    for name, image in images.all().items():
        for path, data in certificate_files(image).items():
            compact = b"".join(data.split())
            leaked = [m for m in markers if m in compact]
            assert not leaked, f"{name} image: {path} holds a certificate of the build machine's CA bundle"


def test_build_image_meets_the_helm_charts_contract(images: Images) -> None:
    """What helm/tritonbundle's init containers run in the build image, run in the (stand-in) build image
    as the chart runs it: uid 1000, read-only root, HOME=/tmp."""
    files = ROOT / "helm" / "tritonbundle" / "files"
    script = """
        set -e
        for tool in tritonbundle python3 flock cmp; do command -v "$tool"; done
        python3 -c 'import tokenizers; print("tokenizers", tokenizers.__version__)'
        test -f /opt/tritonbundle/build/models.yaml
        traffic=$(python3 -c 'import yaml; print(yaml.safe_load(open("/opt/tritonbundle/build/models.yaml"))["traffic"])')
        test -s "/opt/tritonbundle/build/$traffic"
        for f in model.onnx export.json tokenizer.json; do test -s /opt/tritonbundle/build/artifacts/minilm/$f; done
        python3 /opt/tritonbundle/scripts/copy-python-packages.py /tmp/pkgs tokenizers
        PYTHONPATH=/tmp/pkgs python3 -S -c 'import sys; sys.path.insert(0, "/tmp/pkgs"); import tokenizers'
        tritonbundle --version
        echo contract-ok
    """
    result = run([
        # /tmp as the chart's emptyDir is: writable, and executable (Docker's tmpfs default is noexec).
        "docker", "run", "--rm", "--read-only", "--tmpfs", "/tmp:exec", "--user", "1000:1000", "-e", "HOME=/tmp",
        "-v", f"{files}:/opt/tritonbundle/scripts:ro", "--entrypoint", "sh", images.build_standin, "-c", script,
    ], timeout_s=COMMAND_TIMEOUT_S)
    assert "contract-ok" in result.stdout, result.stdout + result.stderr


def test_build_image_carries_the_export_made_in_the_export_image(images: Images) -> None:
    def record(image: str) -> dict:
        out = run(["docker", "run", "--rm", "--entrypoint", "cat", image,
                   "/opt/tritonbundle/build/artifacts/minilm/export.json"]).stdout
        return json.loads(out)

    built, exported = record(images.build_standin), record(images.export)
    assert built["sha256"] == exported["sha256"]
    assert max(p["max_abs_diff"] for p in exported["parity"]) <= 1e-4
    assert exported["fingerprint"]["torch"].startswith("2.13.0"), "torch's CPU build, pinned"
    torch = run(["docker", "run", "--rm", "--entrypoint", "python3", images.build_standin, "-c",
                 "import importlib.util; print(importlib.util.find_spec('torch') is None)"]).stdout.strip()
    assert torch == "True", "the build image is the TensorRT image without torch"


def test_server_image_gives_the_python_models_tokenizers(images: Images) -> None:
    out = run(["docker", "run", "--rm", "--entrypoint", "python3", images.server_standin, "-c",
               "import tokenizers, os; print(os.environ['PYTHONPATH'], tokenizers.__version__)"]).stdout.split()
    constraints = (ROOT / "requirements" / "constraints.txt").read_text()
    assert out[0] == "/opt/tritonbundle/python" and f"tokenizers=={out[1]}" in constraints


CANARY = ROOT / "tritonbundle" / "canary.py"


def test_images_health_checks_run_the_canary_they_carry(images: Images) -> None:
    """The server image carries tritonbundle/canary.py as /opt/tritonbundle/bin/canary.py (no tritonbundle
    package there); the CPU image runs the installed module. Each image's own HEALTHCHECK command, run in it
    as its user on a read-only root with a one-model repository and no server listening, reports the model
    down (exit 1): the command, its interpreter and the file it names are all there."""
    carried = run(["docker", "run", "--rm", "--entrypoint", "cat", images.server_standin,
                   "/opt/tritonbundle/bin/canary.py"]).stdout
    assert carried == CANARY.read_text()
    with tempfile.TemporaryDirectory() as tmp:
        repository = Path(tmp) / "model_repository"
        (repository / "m").mkdir(parents=True)
        (repository / "m" / "config.pbtxt").write_text('name: "m"\n')
        for path in (Path(tmp), repository, repository / "m"):
            path.chmod(0o755)
        (repository / "m" / "config.pbtxt").chmod(0o644)
        for image in (images.server_standin, images.cpu):
            test = json.loads(run(["docker", "image", "inspect", "--format", "{{json .Config.Healthcheck.Test}}",
                                   image]).stdout)
            assert test[0] == "CMD" and "--repository" in test, test
            down = run(["docker", "run", "--rm", "--read-only", "--tmpfs", "/tmp", "--network", "none",
                        "-v", f"{repository}:/models/model_repository:ro", "--entrypoint", test[1], image, *test[2:]],
                       check=False)
            assert down.returncode == 1, f"{image}: {down.stdout}{down.stderr}"
            assert "canary: m: no answer" in down.stderr and "0 of 1 models answered" in down.stdout, down.stderr


def test_entrypoint_locks_the_restricted_apis_when_no_key_is_set(images: Images) -> None:
    """The GPU server's entrypoint turns `tritonserver ARGS` into ARGS + --http-restricted-api and
    --grpc-restricted-protocol for the four APIs; with no key set the key is random (APIs locked)."""
    # a "tritonserver" that prints its arguments
    script = "ln -s /bin/echo /tmp/tritonserver && exec tritonbundle-entrypoint /tmp/tritonserver --model-repository=/m"
    base = ["docker", "run", "--rm", "--tmpfs", "/tmp", "--entrypoint", "sh"]
    locked = run([*base, images.server_standin, "-c", script]).stdout.split()
    keyed = run([*base, "-e", "TRITONBUNDLE_API_KEY=s3cret", images.server_standin, "-c", script]).stdout.split()
    assert locked[0] == keyed[0] == "--model-repository=/m"
    for api in ("model-repository", "shared-memory", "trace", "logging"):
        assert f"--http-restricted-api={api}:tritonbundle-key=s3cret" in keyed
        assert f"--grpc-restricted-protocol={api}:tritonbundle-key=s3cret" in keyed
        random_key = [a for a in locked if a.startswith(f"--http-restricted-api={api}:tritonbundle-key=")]
        assert random_key and len(random_key[0].rsplit("=", 1)[1]) >= 32


PLANS_CHECK = ROOT / "tritonbundle" / "runtimes" / "tensorrt" / "serving.py"
BACKEND_FLAG = "--backend-config=tensorrt,version-compatible=true"


def test_server_image_starts_tritonserver_through_nvidias_entrypoint_and_the_plan_check(images: Images) -> None:
    """The server image carries serving.py as /opt/tritonbundle/bin/tensorrt-plans.py, and its entry point
    runs NVIDIA's (a stand-in here, mounted where the NGC image has it), then the plan check, then
    tritonserver (a fake that prints its arguments), as the container's user, read-only root."""
    carried = run(["docker", "run", "--rm", "--entrypoint", "cat", images.server_standin,
                   "/opt/tritonbundle/bin/tensorrt-plans.py"]).stdout
    assert carried == PLANS_CHECK.read_text()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        nvidia = work / "nvidia_entrypoint.sh"
        nvidia.write_text('#!/bin/sh\necho "nvidia-entrypoint: $*" >&2\nexec "$@"\n')
        fake = work / "tritonserver"
        fake.write_text('#!/bin/sh\nprintf "%s\\n" fake-tritonserver "$@"\n')
        for script in (nvidia, fake):
            script.chmod(0o755)

        def serve(built_with: str, version_compatible: bool) -> subprocess.CompletedProcess[str]:
            repository = work / f"repository-{built_with}-{version_compatible}"
            (repository / "m" / "1").mkdir(parents=True)
            meta = repository / "m" / "1" / "model.plan.json"
            meta.write_text(json.dumps({"tensorrt_version": built_with, "options": {"version_compatible": version_compatible}}))
            for path in (repository, repository / "m", repository / "m" / "1"):
                path.chmod(0o755)
            meta.chmod(0o644)
            return run([
                "docker", "run", "--rm", "--read-only", "--tmpfs", "/tmp", "-e", "TRITONBUNDLE_TENSORRT_VERSION=11.1.0.106",
                "-v", f"{nvidia}:/opt/nvidia/nvidia_entrypoint.sh:ro", "-v", f"{fake}:/usr/local/bin/tritonserver:ro",
                "-v", f"{repository}:/models/model_repository:ro", images.server_standin,
                "tritonserver", "--model-repository=/models/model_repository",
            ], check=False)

        refused = serve("10.13.2.6", False)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "fake-tritonserver" not in refused.stdout
        # NVIDIA's entry point first, handing over to the check (which then execs tritonserver).
        assert "nvidia-entrypoint: python3 /opt/tritonbundle/bin/tensorrt-plans.py exec /usr/local/bin/tritonserver" in refused.stderr
        assert refused.stderr.index("nvidia-entrypoint") < refused.stderr.index("refusing to start")
        assert "10.13.2.6" in refused.stderr and "11.1.0.106" in refused.stderr

        compatible = serve("10.13.2.6", True)
        assert compatible.returncode == 0, compatible.stderr
        lines = compatible.stdout.splitlines()
        assert lines[0] == "fake-tritonserver" and BACKEND_FLAG in lines
        assert "--model-repository=/models/model_repository" in lines


def dockerfile_instructions(dockerfile: Path) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined (comments and blank lines left out)."""
    out: list[str] = []
    current: list[str] = []
    for line in dockerfile.read_text().splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current.append(line)
        if not line.rstrip().endswith("\\"):
            out.append("\n".join(current))
            current = []
    return out


def calibration_step(dockerfile: Path) -> str:
    steps = [i for i in dockerfile_instructions(dockerfile) if "/opt/tritonbundle/build/calibration" in i]
    assert len(steps) == 1, f"{dockerfile.name}: {len(steps)} calibration steps"
    return steps[0]


def image_files(image: str, folder: str) -> dict[str, str]:
    """{path relative to folder: sha256} of the files under ``folder`` in ``image``, read as uid 1000."""
    script = f'test -d {folder} && cd {folder} && find . -type f | sort | while read -r f; do sha256sum "$f"; done'
    out = run(["docker", "run", "--rm", "--user", "1000:1000", "--entrypoint", "sh", image, "-c", script]).stdout
    return {path.removeprefix("./"): digest for digest, path in (line.split(None, 1) for line in out.splitlines())}


def test_calibration_data_reaches_the_images_and_a_checkout_without_it_still_builds(
    images: Images, base_image: str, cpu_stack_config: Stack,
) -> None:
    """INT8 calibration data lives under build/calibration/ (the manifest's `calibration` is relative to
    build/models.yaml). The images' calibration step, built with the repository's .dockerignore from a
    throwaway context, lands a file there in the image, readable by uid 1000, leaves ONNX files out, and
    builds (an empty folder) where the checkout has no build/calibration/. The build and CPU images hold
    what this checkout has there."""
    step = calibration_step(DOCKER_DIR / "Dockerfile.build")
    assert calibration_step(DOCKER_DIR / "Dockerfile.cpu") == step
    buffer = io.BytesIO()
    np.savez(buffer, input_ids=np.arange(12, dtype=np.int64).reshape(3, 4))
    npz = buffer.getvalue()
    project = cpu_stack_config.project + "-calibration"
    tags = {case: f"tritonbundle-calibration-test:{case}" for case in ("with", "without")}
    services = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case, tag in tags.items():
            context = Path(tmp) / case
            (context / "build" / "traffic").mkdir(parents=True)
            (context / "build" / "artifacts").mkdir()
            shutil.copy(ROOT / ".dockerignore", context / ".dockerignore")
            (context / "build" / "models.yaml").write_text("version: 1\n")
            (context / "build" / "traffic" / "chat.jsonl").write_text("{}\n")
            (context / "build" / "artifacts" / "model.onnx").write_bytes(b"export")
            if case == "with":
                (context / "build" / "calibration" / "more").mkdir(parents=True)
                data = context / "build" / "calibration" / "mymodel.npz"
                data.write_bytes(npz)
                data.chmod(0o600)  # the image must still let uid 1000 read it
                (context / "build" / "calibration" / "more" / "other.npz").write_bytes(npz[::-1])
                (context / "build" / "calibration" / "more" / "model.onnx").write_bytes(b"never")
            dockerfile = Path(tmp) / f"Dockerfile.{case}"
            dockerfile.write_text(f"ARG BASE\nFROM ${{BASE}}\n{step}\n")
            services[case] = {"image": tag, "build": {"context": str(context), "dockerfile": str(dockerfile),
                                                     "args": {"BASE": base_image}}}
        compose = Path(tmp) / "compose.yaml"
        compose.write_text(json.dumps({"services": services}))
        try:
            run(["docker", "compose", "--progress", "plain", "-p", project, "-f", str(compose), "build"],
                env=cpu_stack_config.env, timeout_s=BUILD_TIMEOUT_S)
            landed = image_files(tags["with"], "/opt/tritonbundle/build/calibration")
            empty = image_files(tags["without"], "/opt/tritonbundle/build/calibration")
            folder = run(["docker", "run", "--rm", "--entrypoint", "test", tags["without"], "-d",
                          "/opt/tritonbundle/build/calibration"], check=False)
        finally:
            run(["docker", "rmi", "-f", *tags.values()], check=False)
    assert landed == {"mymodel.npz": hashlib.sha256(npz).hexdigest(),
                      "more/other.npz": hashlib.sha256(npz[::-1]).hexdigest()}
    assert empty == {} and folder.returncode == 0, "no build/calibration/: the folder is there, empty"

    checkout = ROOT / "build" / "calibration"
    wanted = {str(p.relative_to(checkout)): hashlib.sha256(p.read_bytes()).hexdigest()
              for p in (checkout.rglob("*") if checkout.is_dir() else ()) if p.is_file()
              and p.suffix not in (".onnx", ".pyc") and "__pycache__" not in p.parts and p.name != ".env"}
    for image in (images.build_standin, images.cpu):
        assert image_files(image, "/opt/tritonbundle/build/calibration") == wanted, image
        assert run(["docker", "run", "--rm", "--entrypoint", "test", image, "-d",
                    "/opt/tritonbundle/build/calibration"], check=False).returncode == 0, image


def test_build_context_leaves_out_venvs_artifacts_reports_caches_and_git(cpu_stack_config: Stack, base_image: str) -> None:
    """The context as BuildKit receives it (after .dockerignore), listed by a throwaway build."""
    with tempfile.TemporaryDirectory() as tmp:
        dockerfile = Path(tmp) / "Dockerfile"
        dockerfile.write_text(
            "ARG BASE\nFROM ${BASE}\n"
            "RUN --mount=type=bind,target=/ctx cd /ctx && find . -mindepth 1 -maxdepth 2 | sort | sed 's/^/CTX /'"
            " && du -sk . | sed 's/^/SIZE /'\n"
        )
        compose = Path(tmp) / "compose.yaml"
        compose.write_text(json.dumps({
            "services": {"context": {"image": "tritonbundle-context-listing:test", "build": {
                "context": str(ROOT), "dockerfile": str(dockerfile), "args": {"BASE": base_image}}}}
        }))
        result = run(["docker", "compose", "--progress", "plain", "-p", cpu_stack_config.project + "-ctx",
                      "-f", str(compose), "build", "--no-cache"], env=cpu_stack_config.env, timeout_s=600)
    run(["docker", "rmi", "-f", "tritonbundle-context-listing:test"], check=False)
    output = result.stdout + result.stderr
    listed = {m.group(1) for m in re.finditer(r"CTX \./(\S+)", output)}
    assert "tritonbundle" in listed and "pyproject.toml" in listed, tail(output)
    for excluded in (".venv", ".tools", ".git", "build/artifacts", "reports", ".pytest_cache", ".mypy_cache",
                     ".ruff_cache", ".hypothesis", "tests", "helm", "model_repository", ".env", "docker/.env"):
        assert excluded not in listed, f"{excluded} is in the build context"
    assert not [p for p in listed if p.endswith((".onnx", ".pyc")) or "__pycache__" in p]
    assert {p for p in listed if p.startswith("docker/wheels/")} <= {
        f"docker/wheels/{w.name}" for w in (DOCKER_DIR / "wheels").glob("torch-*.whl")}
