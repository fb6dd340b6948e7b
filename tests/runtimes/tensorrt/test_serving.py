"""The serving side: plans another TensorRT built are refused by name; version-compatible plans get
the backend flag they need (tritonbundle/runtimes/tensorrt/serving.py, standard library only)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tritonbundle.runtimes.tensorrt import serving

SCRIPT = Path(serving.__file__)


def _repository(tmp_path: Path, version: str, *, compatible: bool = False) -> Path:
    repo = tmp_path / "repo"
    (repo / "minilm_encoder" / "1").mkdir(parents=True)
    (repo / "minilm_encoder" / "1" / "model.plan").write_bytes(b"plan")
    (repo / "minilm_encoder" / "1" / "model.plan.json").write_text(
        json.dumps({"tensorrt_version": version, "options": {"version_compatible": compatible}}))
    return repo


def test_a_plan_of_another_tensorrt_is_refused_naming_both_versions(tmp_path: Path) -> None:
    repo = _repository(tmp_path, "10.13.2.6")
    (problem,) = serving.problems(repo, "11.1.0.106")
    assert "minilm_encoder/1/model.plan was built with TensorRT 10.13.2.6, this server has TensorRT 11.1.0.106" in problem
    assert serving.problems(repo, "10.13.2.6") == []
    assert serving.backend_args(repo) == []


def test_a_plan_of_another_build_of_the_same_release_is_refused(tmp_path: Path) -> None:
    """NVIDIA's policy: a plan that is not version-compatible runs only on the build that made it
    (TensorRT refuses 9.2.0.5 on 9.2.0.4: tensorrtllm_backend#194)."""
    repo = _repository(tmp_path, "10.13.2.6")
    (problem,) = serving.problems(repo, "10.13.2.5")
    assert "built with TensorRT 10.13.2.6, this server has TensorRT 10.13.2.5" in problem and "build number" in problem


def test_without_a_build_number_three_parts_are_compared_and_a_note_says_so(tmp_path: Path) -> None:
    repo = _repository(tmp_path, "10.13.2.6")
    notes: list[str] = []
    assert serving.problems(repo, "10.13.2", notes) == []  # a libnvinfer.so.10.13.2 that could not be asked
    assert len(notes) == 1 and "only major.minor.patch was compared" in notes[0]


def test_version_compatible_plans_run_on_newer_tensorrt_with_host_code_allowed(tmp_path: Path) -> None:
    repo = _repository(tmp_path, "10.13.2.6", compatible=True)
    assert serving.problems(repo, "11.1.0.106") == []
    assert serving.backend_args(repo) == ["--backend-config=tensorrt,version-compatible=true"]
    (problem,) = serving.problems(repo, "10.8.0")
    assert "cannot run on the older TensorRT 10.8.0" in problem


def test_version_compatible_plans_cross_only_the_major_steps_nvidia_lists(tmp_path: Path) -> None:
    notes: list[str] = []
    assert serving.problems(_repository(tmp_path / "a", "10.13.2.6", compatible=True), "11.1.0.106", notes) == []
    assert len(notes) == 1 and "Support Matrix 11.1-11.3" in notes[0]  # NVIDIA's pages disagree: say so
    notes.clear()
    assert serving.problems(_repository(tmp_path / "b", "11.0.0.1", compatible=True), "11.1.0.106", notes) == []
    assert notes == []  # within a major version: no doubt
    (problem,) = serving.problems(_repository(tmp_path / "c", "8.6.1.6", compatible=True), "11.1.0.106")
    assert "only TensorRT 8 -> 10 and 10 -> 11" in problem


def test_no_tensorrt_found_is_a_problem_only_when_there_are_plans(tmp_path: Path) -> None:
    assert serving.problems(tmp_path, None) == []
    assert "no TensorRT was found here" in serving.problems(_repository(tmp_path, "11.1.0.106"), None)[0]


def test_the_version_comes_from_the_library_file_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libnvinfer.so.11.1.0").write_bytes(b"")  # not a loadable library: only its name speaks
    monkeypatch.delenv(serving.VERSION_ENV, raising=False)
    monkeypatch.setattr(serving, "LIBRARY_DIRS", (str(lib),))
    assert serving.installed_version() == "11.1.0"
    monkeypatch.setenv(serving.VERSION_ENV, "10.13.2.6")
    assert serving.installed_version() == "10.13.2.6"


def test_the_build_number_is_asked_of_the_library_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in libnvinfer compiled here exports the four version functions NvInferRuntime.h declares
    (10.13 and 11.1: getInferLibMajorVersion .. getInferLibBuildVersion); the check loads it with ctypes."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler here to make the stand-in library")
    lib = tmp_path / "lib"
    lib.mkdir()
    source = tmp_path / "nvinfer.c"
    source.write_text("".join(f"int getInferLib{name}Version(void) {{ return {value}; }}\n"
                              for name, value in (("Major", 11), ("Minor", 1), ("Patch", 0), ("Build", 106))))
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib / "libnvinfer.so.11.1.0"), str(source)], check=True, timeout=60)
    monkeypatch.delenv(serving.VERSION_ENV, raising=False)
    monkeypatch.setattr(serving, "LIBRARY_DIRS", (str(lib),))
    assert serving.installed_version() == "11.1.0.106"


def _run(tmp_path: Path, repo: Path, version: str) -> subprocess.CompletedProcess[str]:
    fake = tmp_path / "bin" / "tritonserver"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text("#!/bin/sh\necho \"started: $*\"\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}", serving.VERSION_ENV: version}
    return subprocess.run([sys.executable, str(SCRIPT), "exec", "tritonserver", f"--model-repository={repo}", "--http-port=1"],
                          capture_output=True, text=True, env=env, timeout=30, check=False)


def test_the_script_refuses_to_start_or_execs_tritonserver_with_the_flag(tmp_path: Path) -> None:
    refused = _run(tmp_path, _repository(tmp_path / "a", "10.13.2.6"), "11.1.0.106")
    assert refused.returncode == 2 and "refusing to start" in refused.stderr and "10.13.2.6" in refused.stderr
    started = _run(tmp_path, _repository(tmp_path / "b", "10.13.2.6", compatible=True), "11.1.0.106")
    assert started.returncode == 0, started.stderr
    assert "--backend-config=tensorrt,version-compatible=true" in started.stdout and "--http-port=1" in started.stdout


def test_the_api_key_stays_out_of_tritonservers_environment(tmp_path: Path) -> None:
    """The chart puts the key in the arguments (Kubernetes expands $(TRITONBUNDLE_API_KEY)); the variable
    itself must not reach tritonserver, whose environment every Python-backend stub inherits."""
    fake = tmp_path / "bin" / "tritonserver"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho \"key=[${TRITONBUNDLE_API_KEY:-}] home=[$HOME] args: $*\"\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}", "TRITONBUNDLE_API_KEY": "s3cret"}
    out = subprocess.run([sys.executable, str(SCRIPT), "exec", "tritonserver", "--http-restricted-api=trace:k=s3cret"],
                         capture_output=True, text=True, env=env, timeout=30, check=True).stdout
    assert "key=[]" in out and f"home=[{os.environ['HOME']}]" in out and "--http-restricted-api=trace:k=s3cret" in out


def test_the_script_imports_only_the_standard_library() -> None:
    """It runs in the NGC tritonserver image, where tritonbundle is not installed."""
    import ast

    tree = ast.parse(SCRIPT.read_text())
    modules = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert modules - set(sys.stdlib_module_names) == {"tensorrt"}  # optional, inside a try
