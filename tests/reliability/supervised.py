"""``tritonbundle serve`` as the reliability tests run it: a subprocess on free loopback ports with the
tests' API key, its console in ``serve.log`` and tritonserver's log in ``tritonserver.log``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.conftest import API_KEY
from tritonbundle.proc import free_ports


def spawn_serve(repository: Path, tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[bytes], int, int]:
    """Start ``serve`` (not waiting for it); returns the process and its HTTP and gRPC ports."""
    http, grpc, metrics = free_ports(3)
    process = subprocess.Popen(
        [sys.executable, "-m", "tritonbundle", "serve", "--repository", str(repository), "--http-port", str(http),
         "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--log-file", str(tmp_path / "tritonserver.log"), *extra],
        stdout=open(tmp_path / "serve.log", "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
        env={**os.environ, "TRITONBUNDLE_API_KEY": API_KEY},
    )
    return process, http, grpc


def stop_serve(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (serve drains and stops tritonserver), SIGKILL after 60 s."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()


def logged(path: Path, *needles: str, timeout_s: float = 30.0) -> str:
    """The log once it holds every one of ``needles``, or as it is after ``timeout_s``: a supervised server
    answers a moment before ``serve``'s own readiness poll returns and logs "ready again"."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = path.read_text()
        if all(n in text for n in needles) or time.monotonic() > deadline:
            return text
        time.sleep(0.2)


def tritonserver_pids(http_port: int) -> list[int]:
    """PIDs of tritonserver processes listening on ``http_port`` (read from /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"tritonserver") and f"--http-port={http_port}".encode() in argv:
            pids.append(int(entry.name))
    return pids


def call_across_a_restart(call: Callable[[], object], http_port: int, old: list[int], *, settle_s: float = 3.0,
                          limit_s: float = 60.0) -> tuple[int, list[BaseException], bool]:
    """Make ``call`` over and over until a tritonserver other than ``old`` has served ``http_port`` for
    ``settle_s`` (``limit_s`` at most): the calls made, the errors they raised, and whether one came.
    (A fixed 20-s loop waited ~15 s past restarts that took 2-5.)"""
    calls, failures, started, back_at = 0, [], time.monotonic(), None
    while time.monotonic() - started < limit_s and (back_at is None or time.monotonic() - back_at < settle_s):
        calls += 1
        try:
            call()
        except Exception as e:  # noqa: BLE001 - counted
            failures.append(e)
        if back_at is None and tritonserver_pids(http_port) not in ([], old):
            back_at = time.monotonic()
    return calls, failures, back_at is not None
