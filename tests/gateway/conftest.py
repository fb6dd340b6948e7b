"""Starting ``tritonbundle gateway`` for the tests: a real process in front of the real tritonserver."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tritonbundle.proc import free_port

ROOT = Path(__file__).resolve().parents[2]


class GatewayURL(str):
    """The gateway's base URL (``http://127.0.0.1:<port>``), and its process id."""

    pid: int


@contextmanager
def running_gateway(server: Any, folder: Path, *options: str, models: Sequence[str] = ("minilm",)) -> Iterator[GatewayURL]:
    """The gateway's base URL while it runs; its output in ``folder/gateway.log``."""
    port = free_port()
    log = folder / "gateway.log"
    argv = [sys.executable, "-m", "tritonbundle", "gateway", "--url", server.grpc_url, "--port", str(port)]
    for model in models:
        argv += ["--model", model]
    with open(log, "w") as out:
        proc = subprocess.Popen([*argv, *options], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    url = GatewayURL(f"http://127.0.0.1:{port}")
    url.pid = proc.pid
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2):
                    break
            except OSError:
                assert proc.poll() is None, f"the gateway exited: {log.read_text()}"
                assert time.monotonic() < deadline, f"the gateway did not come up in 60 s: {log.read_text()}"
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)
