"""docker/entrypoint.sh run on this machine with `sh`, a fake `tritonserver` on PATH and the TensorRT plan
check (tritonbundle/runtimes/tensorrt/serving.py, the file the server image carries as
/opt/tritonbundle/bin/tensorrt-plans.py): the check runs right before the server starts, refuses plans
another TensorRT built, and adds the backend flag version-compatible plans need. No Docker engine is
needed; test_images.py runs the same entry point inside the (stand-in) server image."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.docker.conftest import DOCKER_DIR, ROOT

pytestmark = [pytest.mark.docker]

ENTRYPOINT = DOCKER_DIR / "entrypoint.sh"
PLANS_CHECK = ROOT / "tritonbundle" / "runtimes" / "tensorrt" / "serving.py"
BACKEND_FLAG = "--backend-config=tensorrt,version-compatible=true"
#: A "tritonserver" that prints a marker, its pid and its arguments, one a line.
FAKE_TRITONSERVER = '#!/bin/sh\nprintf "%s\\n" fake-tritonserver "pid=$$" "$@"\n'


def plan_repository(root: Path, *, built_with: str, version_compatible: bool) -> Path:
    repository = root / "repository"
    version_dir = repository / "m" / "1"
    version_dir.mkdir(parents=True)
    (version_dir / "model.plan").write_bytes(b"not a real plan")
    (version_dir / "model.plan.json").write_text(json.dumps(
        {"tensorrt_version": built_with, "options": {"version_compatible": version_compatible}}))
    return repository


@dataclass(frozen=True)
class Started:
    returncode: int
    stdout: str
    stderr: str
    pid: int


def start(tmp_path: Path, *args: str, tensorrt: str | None = "11.1.0.106",
          plans_check: Path | None = PLANS_CHECK, environment: dict[str, str] | None = None) -> Started:
    """`sh docker/entrypoint.sh tritonserver ARGS...` as the server image runs it (NVIDIA's entry point
    skipped: there is none here), with this machine's Python as python3."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "tritonserver"
    fake.write_text(FAKE_TRITONSERVER)
    fake.chmod(0o755)
    if not (bin_dir / "python3").exists():
        (bin_dir / "python3").symlink_to(sys.executable)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITONBUNDLE_")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}", TRITONBUNDLE_SKIP_NVIDIA_ENTRYPOINT="1",
               TRITONBUNDLE_API_KEY="s3cret")
    if tensorrt is not None:
        env["TRITONBUNDLE_TENSORRT_VERSION"] = tensorrt
    if plans_check is not None:
        env["TRITONBUNDLE_TENSORRT_PLANS"] = str(plans_check)
    env.update(environment or {})
    process = subprocess.Popen(["sh", str(ENTRYPOINT), "tritonserver", *args], env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout, stderr = process.communicate(timeout=60)
    return Started(process.returncode, stdout, stderr, process.pid)


def test_a_plan_of_another_tensorrt_stops_the_start_naming_both_versions(tmp_path: Path) -> None:
    repository = plan_repository(tmp_path, built_with="10.13.2.6", version_compatible=False)
    result = start(tmp_path, f"--model-repository={repository}", tensorrt="11.1.0.106")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "fake-tritonserver" not in result.stdout, "tritonserver was started"
    assert "refusing to start" in result.stderr
    assert "10.13.2.6" in result.stderr and "11.1.0.106" in result.stderr, result.stderr
    assert "m/1/model.plan" in result.stderr


def test_plans_of_this_tensorrt_start_the_server_with_the_restricted_apis_and_no_backend_flag(tmp_path: Path) -> None:
    repository = plan_repository(tmp_path, built_with="10.13.2.6", version_compatible=False)
    result = start(tmp_path, "--model-repository", str(repository), "--strict-readiness=true", tensorrt="10.13.2.6")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "fake-tritonserver"
    # exec all the way (sh -> python3 -> tritonserver): the server has the entry point's pid, so docker's
    # SIGTERM reaches it.
    assert lines[1] == f"pid={result.pid}"
    assert lines[2:5] == ["--model-repository", str(repository), "--strict-readiness=true"]
    assert "--http-restricted-api=model-repository:tritonbundle-key=s3cret" in lines
    assert BACKEND_FLAG not in lines
    assert "tensorrt-plans" not in result.stderr


def test_version_compatible_plans_get_the_backend_flag_on_a_later_tensorrt(tmp_path: Path) -> None:
    repository = plan_repository(tmp_path, built_with="10.13.2.6", version_compatible=True)
    result = start(tmp_path, f"--model-repository={repository}", tensorrt="11.1.0.106")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "fake-tritonserver"
    assert lines.count(BACKEND_FLAG) == 1
    assert lines.index(BACKEND_FLAG) > lines.index(f"--model-repository={repository}")


def test_a_version_compatible_plan_of_a_later_tensorrt_is_refused(tmp_path: Path) -> None:
    repository = plan_repository(tmp_path, built_with="11.1.0.106", version_compatible=True)
    result = start(tmp_path, f"--model-repository={repository}", tensorrt="10.13.2.6")
    assert result.returncode == 2 and "fake-tritonserver" not in result.stdout
    assert "older" in result.stderr and "10.13.2.6" in result.stderr


def test_a_repository_without_plans_starts_the_server_unchanged(tmp_path: Path) -> None:
    (tmp_path / "repository" / "tok" / "1").mkdir(parents=True)
    result = start(tmp_path, f"--model-repository={tmp_path / 'repository'}", tensorrt=None)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "fake-tritonserver" and BACKEND_FLAG not in result.stdout


def test_without_the_check_in_the_image_tritonserver_starts_directly(tmp_path: Path) -> None:
    """The default location (/opt/tritonbundle/bin/tensorrt-plans.py) is only in the server image."""
    if Path("/opt/tritonbundle/bin/tensorrt-plans.py").exists():
        pytest.skip("this machine has /opt/tritonbundle/bin/tensorrt-plans.py")
    repository = plan_repository(tmp_path, built_with="10.13.2.6", version_compatible=False)
    result = start(tmp_path, f"--model-repository={repository}", plans_check=None)
    assert result.returncode == 0 and result.stdout.splitlines()[0] == "fake-tritonserver"


def test_a_check_named_but_missing_stops_the_start(tmp_path: Path) -> None:
    result = start(tmp_path, "--model-repository=/nowhere", plans_check=tmp_path / "missing.py")
    assert result.returncode == 1 and "fake-tritonserver" not in result.stdout
    assert "TRITONBUNDLE_TENSORRT_PLANS" in result.stderr


def test_other_commands_do_not_run_the_check(tmp_path: Path) -> None:
    env = {**os.environ, "TRITONBUNDLE_SKIP_NVIDIA_ENTRYPOINT": "1", "TRITONBUNDLE_TENSORRT_PLANS": str(tmp_path / "x.py")}
    result = subprocess.run(["sh", str(ENTRYPOINT), "echo", "--model-repository=/nowhere"], env=env,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and result.stdout.strip() == "--model-repository=/nowhere"


def test_gpu_sharing_is_said_to_be_ignored_by_the_image_s_tritonserver(tmp_path: Path) -> None:
    """TRITONBUNDLE_GPU_SHARING=mps is `tritonbundle serve`'s (Python-backend instances); the image's
    tritonserver serves one-process TensorRT/ONNX Runtime models and says it ignores it, then starts."""
    repository = plan_repository(tmp_path, built_with="11.1.0.106", version_compatible=False)
    result = start(tmp_path, f"--model-repository={repository}", environment={"TRITONBUNDLE_GPU_SHARING": "mps"})
    assert result.returncode == 0 and "fake-tritonserver" in result.stdout, result.stderr
    assert "TRITONBUNDLE_GPU_SHARING=mps is ignored by tritonserver here" in result.stderr
    quiet = start(tmp_path, f"--model-repository={repository}")
    assert "TRITONBUNDLE_GPU_SHARING" not in quiet.stderr
