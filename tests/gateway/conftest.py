"""Starting ``tritonbundle gateway`` for the tests (a real process in front of the real tritonserver), and the
edge's nginx with its rules (docker/edge) on free ports."""

from __future__ import annotations

import os
import socket
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


def edge_config(folder: Path, env: dict[str, str], ports: dict[str, int]) -> Path:
    """The compose edge's configuration (its entry point's --render), moved to free ports and this folder."""
    full = {"PATH": os.environ["PATH"], "TRITONBUNDLE_EDGE_RULES": str(ROOT / "docker" / "edge"),
            "TRITONBUNDLE_EDGE_CONF_DIR": str(folder), "TRITONBUNDLE_EDGE_REPOSITORY": str(folder / "none"), **env}
    done = subprocess.run(["/bin/sh", str(ROOT / "docker" / "edge" / "entrypoint.sh"), "--render"], env=full,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    conf = folder / "nginx.conf"
    text = conf.read_text()
    for fixed, port in (("18080", ports["http_inner"]), ("18081", ports["grpc_inner"])):
        text = text.replace(f"127.0.0.1:{fixed}", f"127.0.0.1:{port}")
    text = text.replace("listen 8080 ", f"listen 127.0.0.1:{ports['http']} ").replace(
        "listen 8081 ", f"listen 127.0.0.1:{ports['grpc']} ")
    text = text.replace("/tmp/nginx.pid", str(folder / "nginx.pid")).replace("/tmp/nginx-", str(folder / "nginx-"))
    conf.write_text(text)
    return conf


@contextmanager
def running_nginx(nginx: str, conf: Path, port: int) -> Iterator[subprocess.Popen[bytes]]:
    """nginx in the foreground with ``conf``, once it accepts connections on ``port``; its output next to it."""
    with open(conf.parent / "nginx.log", "w") as log:
        proc = subprocess.Popen([nginx, "-c", str(conf), "-e", "stderr", "-g", "daemon off;"], stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    assert proc.poll() is None and time.monotonic() < deadline, (conf.parent / "nginx.log").read_text()
                    time.sleep(0.1)
            yield proc
        finally:
            proc.terminate()
            proc.wait(timeout=20)
