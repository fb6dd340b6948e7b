"""GPU sharing (tritonbundle/gpu_sharing.py): the private MPS daemon that TritonServer starts with
``TRITONBUNDLE_GPU_SHARING=mps``.

``nvidia-cuda-mps-control`` needs an NVIDIA driver, which this machine has not: a recording double
stands in for it. It reproduces what a caller can get wrong, as NVIDIA's MPS guide describes the
program (https://docs.nvidia.com/deploy/mps/, "nvidia-cuda-mps-control"): ``-f`` runs the daemon in
the foreground until ``quit``, or refuses and exits (exit 100: no GPU it can use); the daemon is found
only through ``CUDA_MPS_PIPE_DIRECTORY``;
commands arrive on standard input (``get_server_list``, ``quit``); with no daemon to talk to the
program exits non-zero. It proves the calls and their environment, not MPS: the real daemon ran on
the H200 (docs/benchmarks.md, "MPS").
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tritonbundle.errors import ServerError
from tritonbundle.gpu_sharing import GPU_SHARING_ENV, PIPE_ENV, MpsDaemon, sharing_from_env

DOUBLE = r'''#!/usr/bin/env bash
# A stand-in for nvidia-cuda-mps-control: records each call, keeps a "daemon" (a sleeper) per pipe folder.
echo "$* pipe=${CUDA_MPS_PIPE_DIRECTORY:-} log=${CUDA_MPS_LOG_DIRECTORY:-}" >> "$MPS_DOUBLE_CALLS"
pipe=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}
if [ "${1:-}" = -f ]; then
  [ -z "${MPS_DOUBLE_REFUSE:-}" ] || { echo "$MPS_DOUBLE_REFUSE"; exit 1; }
  [ -z "${MPS_DOUBLE_NO_GPU:-}" ] || exit 100      # the real one, with no GPU it can use: silent
  [ -z "${MPS_DOUBLE_MUTE:-}" ] || exec sleep 600  # runs, but never answers
  echo $$ > "$pipe/control.pid"
  echo "daemon started" > "${CUDA_MPS_LOG_DIRECTORY:-/var/log/nvidia-mps}/control.log"
  exec sleep 600                      # the daemon, in the foreground: this process until quit
fi
pid=$(cat "$pipe/control.pid" 2>/dev/null) && kill -0 "$pid" 2>/dev/null || { echo "Cannot find MPS control daemon process"; exit 1; }
read -r command
case "$command" in
  get_server_list) echo "${MPS_DOUBLE_SERVERS:-}"; exit 0 ;;
  quit) kill "$pid"; exit 0 ;;
  *) echo "unknown command $command"; exit 1 ;;
esac
'''


@pytest.fixture
def temp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A short private temporary folder (the daemons' folders go there); at the end, every daemon the
    double left is killed and the folder must hold no daemon folder."""
    folder = Path(tempfile.mkdtemp(prefix="tb-", dir="/tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    yield folder
    left = sorted(folder.glob("tritonbundle-mps-*"))
    for pid_file in folder.glob("tritonbundle-mps-*/pipe/control.pid"):
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    shutil.rmtree(folder, ignore_errors=True)
    assert not left, f"daemon folders left behind: {left}"


@pytest.fixture
def double(tmp_path: Path, temp: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The double first on PATH; returns the file its calls are recorded in."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    control = bin_dir / "nvidia-cuda-mps-control"
    control.write_text(DOUBLE)
    control.chmod(0o755)
    calls = tmp_path / "calls"
    calls.touch()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("MPS_DOUBLE_CALLS", str(calls))
    return calls


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sharing_defaults_to_time_slicing_and_refuses_other_words(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(GPU_SHARING_ENV, raising=False)
    assert sharing_from_env() == "time-slicing"
    monkeypatch.setenv(GPU_SHARING_ENV, "mps")
    assert sharing_from_env() == "mps"
    monkeypatch.setenv(GPU_SHARING_ENV, "MPS!")
    with pytest.raises(ServerError, match=r"TRITONBUNDLE_GPU_SHARING='MPS!': must be one of time-slicing, mps"):
        sharing_from_env()


def test_the_daemon_starts_in_its_own_folder_answers_and_quits(double: Path) -> None:
    daemon = MpsDaemon()
    started = time.monotonic()
    env = daemon.start()
    assert time.monotonic() - started < 5
    pipe = Path(env[PIPE_ENV])
    pid = int((pipe / "control.pid").read_text())
    assert _alive(pid)
    calls = double.read_text().splitlines()
    assert [c for c in calls if c.startswith("-f ")] == [f"-f pipe={pipe} log={env['CUDA_MPS_LOG_DIRECTORY']}"]
    assert f" pipe={pipe} log={env['CUDA_MPS_LOG_DIRECTORY']}" in calls  # get_server_list, through the same folder
    assert daemon.servers() == []  # no CUDA client connected yet
    with pytest.MonkeyPatch.context() as m:
        m.setenv("MPS_DOUBLE_SERVERS", "4242")
        assert daemon.servers() == [4242]
    assert pipe.parent.parent == Path(tempfile.gettempdir())
    daemon.stop()
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)
    assert not pipe.parent.exists(), "the daemon's folder outlived it"


def test_under_a_long_tmpdir_the_sockets_go_to_tmp(double: Path, temp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A socket path over ~107 bytes fails, and a client that cannot reach the daemon runs without MPS silently."""
    deep = temp / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    daemon = MpsDaemon()
    pipe = Path(daemon.start()[PIPE_ENV])
    try:
        assert pipe.parent.parent == Path("/tmp") and len(str(pipe / "nvidia-cuda-mps-control.pid")) <= 100
    finally:
        daemon.stop()
    assert not pipe.exists()


def test_a_missing_control_program_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ServerError, match=r"nvidia-cuda-mps-control is not on PATH.*unset TRITONBUNDLE_GPU_SHARING"):
        MpsDaemon().start()


@pytest.mark.parametrize(("setting", "why"), [
    ("MPS_DOUBLE_REFUSE", r"exited 1\): An instance of this daemon is already running"),
    ("MPS_DOUBLE_NO_GPU", r"exited 100\): no GPU it can use \(check CUDA_VISIBLE_DEVICES\)"),
    ("MPS_DOUBLE_MUTE", r"still running\): it did not answer within 1 s"),
])
def test_a_daemon_that_does_not_start_says_why_and_leaves_nothing(
        double: Path, monkeypatch: pytest.MonkeyPatch, setting: str, why: str) -> None:
    from tritonbundle import gpu_sharing

    monkeypatch.setattr(gpu_sharing, "START_S", 1.0)
    monkeypatch.setenv(setting, "An instance of this daemon is already running")
    daemon = MpsDaemon()
    started = time.monotonic()
    with pytest.raises(ServerError, match=r"did not start \(`nvidia-cuda-mps-control -f` " + why):
        daemon.start()
    assert time.monotonic() - started < 1.0 + 2.0
    assert daemon.folder is None  # and the temp fixture finds no folder left


def test_a_server_that_fails_to_start_ends_its_daemon_and_a_retry_gets_a_new_one(
        double: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No daemon outlives a start that failed, whether the daemon or tritonserver failed; the next start
    (supervise retries) starts a daemon of its own instead of tripping on the failed one."""
    from tritonbundle.installation import Installation
    from tritonbundle.server import ServerOptions, TritonServer

    monkeypatch.setenv(GPU_SHARING_ENV, "mps")
    (tmp_path / "repo").mkdir()
    server = TritonServer(ServerOptions(tmp_path / "repo", http_port=0, grpc_port=0, metrics_port=0,
                                        log_path=tmp_path / "log"),
                          installation=Installation(Path("/bin/false"), tmp_path, {}, "a tritonserver that exits at once"))
    monkeypatch.setenv("MPS_DOUBLE_REFUSE", "An instance of this daemon is already running")
    with pytest.raises(ServerError, match="did not start"):
        server.start(ready_timeout_s=10)
    assert server.mps is None and server.process is None
    monkeypatch.delenv("MPS_DOUBLE_REFUSE")
    with pytest.raises(ServerError, match="tritonserver exited with code 1"):
        server.start(ready_timeout_s=10)
    assert server.mps is None, "the daemon outlived the server that failed"
    assert sum(line.startswith("-f ") for line in double.read_text().splitlines()) == 2


MODEL = '''
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        with open(os.environ["MPS_TEST_OUT"], "a") as f:
            f.write(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "-") + "\\n")

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUT", np.ones((1,), np.float32))])
                for _ in requests]
'''


def probe_repository(tmp_path: Path, instances: int) -> Path:
    """A repository with ``probe``: a Python model whose instances each write the MPS pipe folder they see."""
    from tritonbundle.modelconfig import InstanceGroup, ModelConfig, TensorSpec, write_config

    repo = tmp_path / "repo"
    (repo / "probe" / "1").mkdir(parents=True)
    (repo / "probe" / "1" / "model.py").write_text(MODEL)
    write_config(ModelConfig(name="probe", backend="python", max_batch_size=0, inputs=(TensorSpec("IN", "FP32", (1,)),),
                             outputs=(TensorSpec("OUT", "FP32", (1,)),),
                             instance_groups=(InstanceGroup(instances, "KIND_CPU"),)), repo / "probe")
    return repo


@pytest.mark.slow
def test_the_server_s_stubs_reach_the_daemon_and_it_stops_with_the_server(
        double: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real tritonserver with two instances of a Python model: both stubs see the daemon's pipe folder,
    the daemon lives while the server does and goes with it; a refused daemon starts no server."""
    from tritonbundle.server import ServerOptions, TritonServer

    repo = probe_repository(tmp_path, instances=2)
    out = tmp_path / "seen"
    monkeypatch.setenv("MPS_TEST_OUT", str(out))
    monkeypatch.setenv(GPU_SHARING_ENV, "mps")
    server = TritonServer(ServerOptions(repo, http_port=0, grpc_port=0, metrics_port=0, log_path=tmp_path / "log",
                                        exit_timeout_s=2))
    try:
        server.start(ready_timeout_s=120)
        assert server.mps is not None
        pipe = server.mps.env[PIPE_ENV]
        assert out.read_text().splitlines() == [pipe, pipe]
        pid = int((Path(pipe) / "control.pid").read_text())
        assert _alive(pid)
    finally:
        server.stop()
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), "the daemon outlived its server"
    assert not Path(pipe).exists()

    monkeypatch.setenv("MPS_DOUBLE_REFUSE", "no GPU")
    refused = TritonServer(ServerOptions(repo, http_port=0, grpc_port=0, metrics_port=0, log_path=tmp_path / "log2"))
    with pytest.raises(ServerError, match="did not start.*no GPU"):
        refused.start(ready_timeout_s=30)
    assert refused.process is None


def test_a_daemon_that_ignores_quit_is_ended_in_bounded_time(double: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """stop() waits QUIT_S for the daemon to act on quit, then ends its process group."""
    from tritonbundle import gpu_sharing

    monkeypatch.setattr(gpu_sharing, "QUIT_S", 1.0)
    daemon = MpsDaemon()
    env = daemon.start()
    pid = int((Path(env[PIPE_ENV]) / "control.pid").read_text())
    os.kill(pid, signal.SIGSTOP)  # cannot act on quit's SIGTERM until continued
    started = time.monotonic()
    daemon.stop()
    assert time.monotonic() - started < 5
    assert daemon.folder is None and daemon.process is None
    assert not _alive(pid), "a daemon that ignored quit was left running"


KILLED_STARTER = """
import sys, time
from tritonbundle.gpu_sharing import MpsDaemon, PIPE_ENV
print(MpsDaemon().start(die_with_parent=True)[PIPE_ENV], flush=True)
time.sleep(600)
"""


def test_the_daemon_dies_with_a_starter_killed_by_sigkill(double: Path, temp: Path) -> None:
    """A `serve` killed by SIGKILL runs no cleanup: the kernel ends the daemon it started (no idle daemon left)."""
    import subprocess
    import sys

    starter = subprocess.Popen([sys.executable, "-c", KILLED_STARTER], stdout=subprocess.PIPE, text=True,  # noqa: S603
                               env={**os.environ, "TMPDIR": str(temp)})
    try:
        assert starter.stdout is not None
        pipe = Path(starter.stdout.readline().strip())
        pid = int((pipe / "control.pid").read_text())
        assert _alive(pid)
    finally:
        starter.kill()
        starter.wait(timeout=10)
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), "the daemon outlived the process that started it"
    shutil.rmtree(pipe.parent)  # a SIGKILLed starter cannot remove its folder


@pytest.mark.slow
def test_serve_says_whether_the_models_reached_the_daemon_and_ends_it_on_sigterm(
        double: Path, temp: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`tritonbundle serve` with the setting: the log says which MPS servers the models reached (none here:
    the double starts none, and the probe model runs on the CPU); SIGTERM ends the daemon too."""
    from tests.reliability.supervised import spawn_serve, stop_serve

    repo = probe_repository(tmp_path, instances=1)
    for name, value in ((GPU_SHARING_ENV, "mps"), ("TMPDIR", str(temp)), ("MPS_TEST_OUT", str(tmp_path / "seen"))):
        monkeypatch.setenv(name, value)
    ready = tmp_path / "ready.json"
    serve, _, _ = spawn_serve(repo, tmp_path, "--ready-file", str(ready), "--canary-interval-s", "0")
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and serve.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ready.exists(), "serve did not become ready"
        (folder,) = temp.glob("tritonbundle-mps-*")
        pid = int((folder / "pipe" / "control.pid").read_text())
        assert _alive(pid)
    finally:
        stop_serve(serve)
    out = (tmp_path / "serve.log").read_text()
    assert "CUDA MPS: server process(es) none: no model reached it" in out, out[-2000:]
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid) and not folder.exists(), "the daemon outlived serve"
