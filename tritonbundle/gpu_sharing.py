"""How the served model instances share a GPU: time-slicing (CUDA's default) or CUDA MPS.

Each instance of a Python-backend model is its own stub process with its own CUDA context, and a GPU
runs one context at a time: four BERT-base encoder instances on one H200 time-slice it. Under MPS
(NVIDIA's Multi-Process Service) their work goes through one server process and their kernels may run
side by side. Measured on the H200 (docs/benchmarks.md, "MPS"): +10.7 % at the knee with token rows,
6 interleaved rounds each (13,489 [12,163-14,095] req/s against 12,184 [12,144-12,927]).

``TRITONBUNDLE_GPU_SHARING=mps`` makes whatever starts ``tritonserver`` here (``serve``, ``bench``,
``tune``; :class:`tritonbundle.server.TritonServer`) start a private MPS control daemon first and point
the server's processes at it (``CUDA_MPS_PIPE_DIRECTORY``); it is stopped with the server. It matters
for Python-backend models with several instances on a GPU (the pytorch runtime). TensorRT and ONNX
Runtime models run inside tritonserver's own process, whose instances already share one context: the
images, which serve those, do not start MPS.

What MPS changes beyond speed (NVIDIA's MPS guide, "Limitations" and "Error containment",
https://docs.nvidia.com/deploy/mps/): on Volta and later a fatal GPU fault in one client (an illegal
address, an assertion in a kernel) ends every client of that MPS server, so all instances of the
server's models fail together instead of one; and a non-MPS CUDA process cannot use the GPU while an
MPS server runs on it. The default stays ``time-slicing``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from tritonbundle.errors import ServerError
from tritonbundle.log import LOG
from tritonbundle.proc import start_group, stop_group

GPU_SHARING_ENV = "TRITONBUNDLE_GPU_SHARING"
SHARINGS = ("time-slicing", "mps")
CONTROL = "nvidia-cuda-mps-control"
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
#: Seconds the daemon may take to answer after it started, and to exit after ``quit``.
START_S = 10.0
QUIT_S = 10.0
#: The foreground daemon's own output, in its log folder.
FOREGROUND_LOG = "foreground.log"


def sharing_from_env() -> str:
    """``$TRITONBUNDLE_GPU_SHARING`` (default ``time-slicing``); anything else is refused, naming it."""
    value = os.environ.get(GPU_SHARING_ENV, "").strip() or SHARINGS[0]
    if value not in SHARINGS:
        raise ServerError(f"{GPU_SHARING_ENV}={value!r}: must be one of {', '.join(SHARINGS)}")
    return value


class MpsDaemon:
    """A private MPS control daemon: ``env = daemon.start()`` (the variables the CUDA processes that
    should use it need), ``daemon.stop()``. Its pipe and log folders live in a fresh temporary folder,
    so it neither finds nor disturbs a daemon someone else runs on the host.

    Run in the foreground (``-f``) as this process's child, in a process group of its own, its output
    in ``<folder>/log/foreground.log``. With ``die_with_parent`` the kernel kills it when the starting
    thread dies, even by SIGKILL, which no handler sees (:func:`tritonbundle.proc.start_group`): a
    killed ``serve`` leaves no daemon behind. (``-d`` would fork it away from us.)"""

    def __init__(self, control: str | None = None) -> None:
        self.control = control or CONTROL
        self.folder: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def env(self) -> dict[str, str]:
        assert self.folder is not None, "start() first"
        return {PIPE_ENV: str(self.folder / "pipe"), LOG_ENV: str(self.folder / "log")}

    def start(self, *, die_with_parent: bool = False) -> dict[str, str]:
        binary = shutil.which(self.control)
        if binary is None:
            raise ServerError(
                f"{GPU_SHARING_ENV}=mps, but {self.control} is not on PATH: install the NVIDIA driver's utilities "
                "(in a container: NVIDIA_DRIVER_CAPABILITIES must include compute), or unset "
                f"{GPU_SHARING_ENV} to let the instances time-slice the GPU")
        self.folder = _short_temp_folder()
        for path in self.env.values():
            Path(path).mkdir(mode=0o700)
        deadline = time.monotonic() + START_S
        self.process = start_group([binary, "-f"], log=self.folder / "log" / FOREGROUND_LOG, env=self.env,
                                   die_with_parent=die_with_parent)
        while self.process.poll() is None and time.monotonic() < deadline:
            if self._answers(deadline):
                LOG.info("CUDA MPS control daemon started (pipes in %s)", self.env[PIPE_ENV])
                return self.env
            time.sleep(0.1)
        code = self.process.poll()
        why = self._log_tail() or (
            "no GPU it can use (check CUDA_VISIBLE_DEVICES)" if code == 100
            else f"it did not answer within {START_S:g} s" if code is None else "it said nothing")
        self.stop()
        raise ServerError(f"{GPU_SHARING_ENV}=mps: the MPS control daemon did not start "
                          f"(`{CONTROL} -f` {'still running' if code is None else f'exited {code}'}): {why}")

    def servers(self) -> list[int]:
        """The MPS servers' process ids (``get_server_list``): the daemon starts one when the first CUDA
        client connects. None running after the models loaded on a GPU means they did not come: a client
        that cannot reach the daemon runs without MPS and says nothing (NVIDIA's MPS guide)."""
        if self.folder is None:
            return []
        done = self._server_list(time.monotonic() + START_S)
        return [int(w) for w in done.stdout.split() if w.isdigit()] if done.returncode == 0 else []

    def stop(self) -> None:
        """``quit``, then wait (``QUIT_S``) for the daemon to exit, else end its process group; remove its
        folder."""
        if self.folder is None:
            return
        if self.process is not None and self.process.poll() is None:
            deadline = time.monotonic() + QUIT_S
            quit_sent = self._call([self._binary()], "quit\n", deadline).returncode == 0
            try:  # one that never answered is not waited for
                self.process.wait(timeout=max(0.1, deadline - time.monotonic()) if quit_sent else 0.1)
            except subprocess.TimeoutExpired:
                if quit_sent:
                    LOG.warning("the CUDA MPS control daemon in %s did not quit within %g s: ending its "
                                "process group", self.env[PIPE_ENV], QUIT_S)
                stop_group(self.process, grace_s=1.0)
        self.process = None
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder = None

    def _binary(self) -> str:
        return shutil.which(self.control) or self.control

    def _server_list(self, deadline: float) -> subprocess.CompletedProcess[str]:
        return self._call([self._binary()], "get_server_list\n", deadline)

    def _answers(self, deadline: float) -> bool:
        """Whether the daemon answers ``get_server_list`` (exit 0) before ``deadline``."""
        return self._server_list(deadline).returncode == 0

    def _call(self, argv: list[str], stdin: str, deadline: float) -> subprocess.CompletedProcess[str]:
        """Run the control program (a client of the daemon) until ``deadline`` at most. Its output goes
        through a file, not a pipe: should it start anything that inherits the descriptors, a pipe would
        not reach its end. (Not :func:`tritonbundle.proc.run`, which reads through pipes.)"""
        LOG.debug("$ %s <<< %r (%s)", " ".join(argv), stdin, self.env[PIPE_ENV])
        with tempfile.TemporaryFile("w+") as out:
            try:
                done = subprocess.run(argv, input=stdin, text=True, stdout=out, stderr=subprocess.STDOUT,  # noqa: S603
                                      timeout=max(0.1, deadline - time.monotonic()), env={**os.environ, **self.env},
                                      check=False)
            except (OSError, subprocess.TimeoutExpired) as e:
                return subprocess.CompletedProcess(argv, -1, str(e), "")
            out.seek(0)
            return subprocess.CompletedProcess(argv, done.returncode, out.read(), "")

    def _log_tail(self) -> str:
        """The last lines the daemon wrote: its own output, else its control log."""
        if self.folder is None:
            return ""
        for log in (self.folder / "log" / FOREGROUND_LOG, self.folder / "log" / "control.log"):
            lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
            if lines:
                return " | ".join(lines[-3:])
        return ""


def servers_words(servers: list[int]) -> str:
    """What a log says of :meth:`MpsDaemon.servers` once the models loaded."""
    return (f"CUDA MPS: server process(es) {servers}" if servers else
            "CUDA MPS: server process(es) none: no model reached it (models on the CPU, or clients that cannot "
            "reach its pipes)")


def _short_temp_folder() -> Path:
    """A fresh private folder for the daemon's sockets. A UNIX socket's path holds at most 107 bytes,
    and a client whose socket path does not work runs without MPS, silently: under a long ``$TMPDIR``
    the folder goes to /tmp instead."""
    folder = Path(tempfile.mkdtemp(prefix="tritonbundle-mps-"))
    if len(str(folder / "pipe" / "nvidia-cuda-mps-control.pid")) <= 100:
        return folder
    folder.rmdir()
    return Path(tempfile.mkdtemp(prefix="tritonbundle-mps-", dir="/tmp"))
