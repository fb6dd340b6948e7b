"""Your own model, end to end in Docker: an ONNX file the test makes, put into build/models/ of a copy of
the build context with a manifest naming it (`source: {onnx: models/classifier.onnx}`), then the CPU stack
from that copy (`docker compose -f docker/compose.yaml -f docker/compose.cpu.yaml up --wait`: the export
image checks and copies the file while it is built, the CPU image builds and serves the repository),
an inference through the edge compared with ONNX Runtime's answer, and the final stage of
docker/Dockerfile.build (on the local Debian base in place of the NGC TensorRT image) carrying the model and
building a repository from it without torch.

Nothing is written into the repository: the context is a temporary copy of what .dockerignore lets in
(plus the Docker files), the images get a tag of their own (their layers are the session's images' where
the files are the same), and the stack, its volumes and the tags are removed afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.docker.conftest import (
    BUILD_TIMEOUT_S,
    PROJECT_PREFIX,
    ROOT,
    UP_TIMEOUT_S,
    Stack,
    free_ports,
    read_env_file,
    run,
    tail,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(2400)]

#: TRITONBUNDLE_TAG of this module's images (fixed, so a rerun finds the previous build's layers).
TAG = "usermodel-test"
#: Compose project: PROJECT_PREFIX + this suffix + pid; leftovers of killed runs are removed first.
PROJECT_SUFFIX = "usermodel-"
MODEL = "classifier"
#: What the context copy holds: the paths .dockerignore lets in (docker/ whole: the compose files too).
CONTEXT_PATHS = ("pyproject.toml", "README.md", "requirements/constraints.txt", "tritonbundle", "build/traffic",
                 "build/calibration", "docker", ".dockerignore")


def classifier_onnx(path: Path) -> Path:
    """A user's model: pixels FP32 [batch, 3, 8, 8] -> logits FP32 [batch, 10] (a per-channel mean, a dense
    layer with a bias, a ReLU), with weights no other test uses, so an answer can only come from this file."""
    from onnx import TensorProto, helper, numpy_helper

    from tests.build import onnx_models

    rng = np.random.default_rng(20240611)
    weights = numpy_helper.from_array(rng.standard_normal((3, 10)).astype(np.float32), "W")
    bias = numpy_helper.from_array(rng.standard_normal(10).astype(np.float32), "b")
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["pixels"], ["pooled"], axes=[2, 3], keepdims=0),
            helper.make_node("MatMul", ["pooled", "W"], ["dense"]),
            helper.make_node("Add", ["dense", "b"], ["biased"]),
            helper.make_node("Relu", ["biased"], ["logits"]),
        ],
        "user_classifier",
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        [weights, bias],
    )
    return onnx_models.save(graph, path)


MANIFEST = f"""\
# A user's model only (the shipped example left out): build/models/README.md.
version: 1
defaults:
  target: cpu
  runtime: onnxruntime
models:
  - name: {MODEL}
    source: {{onnx: models/{MODEL}.onnx}}
    batch_buckets: [1, 4]
    inputs:
      - {{name: pixels, dtype: FP32, shape: [batch, 3, 8, 8]}}
    outputs:
      - {{name: logits, dtype: FP32, shape: [batch, 10]}}
"""


def make_context(target: Path) -> dict[str, str]:
    """A copy of the build context with a user's model in build/models/; returns {path under build/models:
    sha256} of what the images must carry there (.dockerignore still leaves out .env and caches there)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in CONTEXT_PATHS:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, target / name, symlinks=True, ignore=ignore)
        elif source.exists():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    (target / "build" / "models.yaml").write_text(MANIFEST)
    models = target / "build" / "models"
    classifier_onnx(models / f"{MODEL}.onnx")
    (models / "labels").mkdir()
    (models / "labels" / "classes.json").write_text(json.dumps([f"class-{i}" for i in range(10)]))
    (models / "README.md").write_text("my models\n")
    # Left out by .dockerignore even here: secrets and caches.
    (models / ".env").write_text("TOKEN=never\n")
    (models / "__pycache__").mkdir()
    (models / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"never")
    # ONNX files anywhere else stay out of the context.
    (target / "build" / "artifacts").mkdir(parents=True)
    (target / "build" / "artifacts" / "stray.onnx").write_bytes(b"never")
    wanted = [models / f"{MODEL}.onnx", models / "labels" / "classes.json", models / "README.md"]
    return {str(p.relative_to(models)): hashlib.sha256(p.read_bytes()).hexdigest() for p in wanted}


def image_files(image: str, folder: str) -> dict[str, str]:
    """{path relative to folder: sha256} of the files under ``folder`` in ``image``, read as uid 1000."""
    script = f'cd {folder} && find . -type f | sort | while read -r f; do sha256sum "$f"; done'
    out = run(["docker", "run", "--rm", "--network", "none", "--user", "1000:1000", "--entrypoint", "sh", image,
               "-c", script]).stdout
    return {path.removeprefix("./"): digest for digest, path in (line.split(None, 1) for line in out.splitlines())}


@dataclass
class UserStack:
    stack: Stack
    context: Path
    carried: dict[str, str]
    build_seconds: float
    up_seconds: float

    def image(self, name: str) -> str:
        return f"tritonbundle-{name}:{TAG}"


def remove_leftovers() -> None:
    """This module's stacks of earlier runs that were killed before their cleanup."""
    result = run(["docker", "volume", "ls", "--format", '{{.Label "com.docker.compose.project"}}'], check=False)
    for name in sorted(set(result.stdout.split())):
        pid = name.removeprefix(PROJECT_PREFIX + PROJECT_SUFFIX)
        if name.startswith(PROJECT_PREFIX + PROJECT_SUFFIX) and pid.isdigit() and int(pid) != os.getpid() \
                and not Path(f"/proc/{pid}").exists():
            run(["docker", "compose", "-p", name, "down", "-v", "--remove-orphans", "--timeout", "5"],
                check=False, timeout_s=180)


@pytest.fixture(scope="module")
def user_stack(cpu_stack_config: Stack) -> Iterator[UserStack]:
    """The CPU stack built from a context copy that holds the user's model, up and healthy; down -v and
    the module's image tags removed afterwards, also when a test failed."""
    remove_leftovers()
    with tempfile.TemporaryDirectory(prefix="tritonbundle-usermodel-") as tmp:
        context = Path(tmp)
        carried = make_context(context)
        http, grpc, metrics = free_ports(3)
        env = {**cpu_stack_config.env, "TRITONBUNDLE_TAG": TAG, "TRITONBUNDLE_HTTP_PORT": str(http),
               "TRITONBUNDLE_GRPC_PORT": str(grpc), "TRITONBUNDLE_METRICS_PORT": str(metrics),
               "TRITONBUNDLE_REPORTS_DIR": str(context / "reports")}
        stack = Stack(project=f"{PROJECT_PREFIX}{PROJECT_SUFFIX}{os.getpid()}",
                      files=(context / "docker" / "compose.yaml", context / "docker" / "compose.cpu.yaml"), env=env,
                      http_port=int(env["TRITONBUNDLE_HTTP_PORT"]), grpc_port=int(env["TRITONBUNDLE_GRPC_PORT"]),
                      metrics_port=int(env["TRITONBUNDLE_METRICS_PORT"]), api_key=env["TRITONBUNDLE_API_KEY"])
        tags = [f"tritonbundle-{name}:{TAG}" for name in ("export", "cpu", "edge")]
        try:
            started = time.monotonic()
            stack.compose("build", timeout_s=BUILD_TIMEOUT_S)
            built = time.monotonic() - started
            started = time.monotonic()
            result = stack.compose("up", "-d", "--wait", "--wait-timeout", "300", timeout_s=UP_TIMEOUT_S, check=False)
            if result.returncode != 0:
                raise AssertionError(f"`docker compose up --wait` failed ({result.returncode})\n{tail(result.stderr)}\n"
                                     f"--- logs ---\n{tail(stack.logs(), 120)}")
            up = time.monotonic() - started
            sys.stderr.write(f"\n[docker tests] user model stack: images {built:.0f} s, healthy after {up:.0f} s\n")
            yield UserStack(stack, context, carried, built, up)
        finally:
            stack.down()
            run(["docker", "rmi", *tags], check=False, timeout_s=300)


def test_the_images_carry_the_users_model_files_and_leave_out_secrets_and_caches(user_stack: UserStack) -> None:
    for name in ("export", "cpu"):
        assert image_files(user_stack.image(name), "/opt/tritonbundle/build/models") == user_stack.carried, name
    # The export image checked and copied the file while it was built (no torch export for an ONNX source).
    exported = image_files(user_stack.image("export"), "/opt/tritonbundle/build/artifacts")
    assert exported == {f"{MODEL}/model.onnx": user_stack.carried[f"{MODEL}.onnx"]}


def test_serves_the_users_model_and_answers_as_onnx_runtime_does(user_stack: UserStack) -> None:
    """Through the edge, over HTTP and gRPC, a batch of two: the same logits as ONNX Runtime on this machine
    with the same file."""
    import onnxruntime as ort
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    pixels = np.random.default_rng(7).random((2, 3, 8, 8), dtype=np.float32)
    session = ort.InferenceSession(str(user_stack.context / "build" / "models" / f"{MODEL}.onnx"),
                                   providers=["CPUExecutionProvider"])
    (expected,) = session.run(["logits"], {"pixels": pixels})
    stack = user_stack.stack
    with httpclient.InferenceServerClient(stack.http_url, network_timeout=30, connection_timeout=10) as client:
        index = client.get_model_repository_index(headers={"tritonbundle-key": stack.api_key})
        assert [(m["name"], m.get("state")) for m in index] == [(MODEL, "READY")], index
        inp = httpclient.InferInput("pixels", list(pixels.shape), "FP32")
        inp.set_data_from_numpy(pixels, binary_data=True)
        # network_timeout bounds the call (tritonclient's `timeout` would be Triton's queue timeout, in µs).
        http_logits = client.infer(MODEL, [inp]).as_numpy("logits")
    with grpcclient.InferenceServerClient(stack.grpc_url) as client:
        inp = grpcclient.InferInput("pixels", list(pixels.shape), "FP32")
        inp.set_data_from_numpy(pixels)
        grpc_logits = client.infer(MODEL, [inp], client_timeout=30).as_numpy("logits")
    assert http_logits.shape == grpc_logits.shape == (2, 10)
    np.testing.assert_allclose(http_logits, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grpc_logits, expected, rtol=1e-5, atol=1e-6)
    assert (expected > 0).any() and (expected == 0).any(), "the ReLU cuts some logits: a real comparison"


def test_healthy_means_the_users_model_answered_the_canary(user_stack: UserStack) -> None:
    container = user_stack.stack.container("triton")
    log = json.loads(run(["docker", "inspect", "-f", "{{json .State.Health.Log}}", container]).stdout)
    assert log and log[-1]["ExitCode"] == 0 and "canary: 1 of 1 models answered" in log[-1]["Output"], log


def test_the_build_image_carries_the_model_and_builds_a_repository_from_it_without_torch(
    user_stack: UserStack, base_image: str,
) -> None:
    """docker/Dockerfile.build's final stage (on the local Debian base in place of the NGC TensorRT image, which
    cannot be pulled here) from the same context: build/models/ and the export stage's copy are in it, and
    `tritonbundle build` (CPU target: no TensorRT here) writes the user's model from them, as the Helm
    chart's engine-build init container does with the GPU target."""
    stack = user_stack.stack
    env = {**stack.env, "TENSORRT_IMAGE": base_image, "TRITONSERVER_IMAGE": base_image}
    standin = Stack(project=stack.project + "-standin", files=(stack.files[0],), env=env)
    release = read_env_file(user_stack.context / "docker" / "versions.env")["NGC_RELEASE"]
    image = f"tritonbundle-build:{TAG}-ngc{release}"
    try:
        standin.compose("build", "build", timeout_s=BUILD_TIMEOUT_S)
        assert image_files(image, "/opt/tritonbundle/build/models") == user_stack.carried
        # The image's own manifest, build/models/ and artifacts (the export stage's copy), as uid 1000.
        built = run(["docker", "run", "--rm", "--network", "none", image, "tritonbundle", "build",
                     "--target", "cpu", "--runtime", "onnxruntime", "--repository", "/tmp/repository"],
                    check=False, timeout_s=300)
    finally:
        run(["docker", "rmi", image], check=False, timeout_s=300)
    assert built.returncode == 0, tail(built.stdout + built.stderr)
    assert f"wrote /tmp/repository: {MODEL}" in built.stdout + built.stderr, tail(built.stdout + built.stderr)
