"""``tritonbundle serve`` as the reliability tests run it: a subprocess on free loopback ports with the
tests' API key, its console in ``serve.log`` and tritonserver's log in ``tritonserver.log``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
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
