"""Security: the repository, model-control and shared-memory APIs need the key, over HTTP and gRPC;
`tritonbundle serve` never leaves them open; keys never reach a log; dependencies are audited."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import API_KEY
from tritonbundle.proc import free_ports

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_restricted_apis_refuse_calls_without_the_key_and_accept_it(server: Any, protocol: str) -> None:
    from tritonbundle.clients import ServerUnavailableError, UnauthorizedError, connect
    from tritonbundle.clients.shm import leftover_regions

    url = server.http_url if protocol == "http" else server.grpc_url
    with connect(url, protocol=protocol, check_model=False) as anonymous:
        assert anonymous.embed(["inference stays open"]).shape == (1, 384)
        with pytest.raises(UnauthorizedError, match="restricted"):
            anonymous.load_model("minilm_tokenizer")
        with pytest.raises(UnauthorizedError, match="restricted"):
            anonymous.models()  # the repository index
    with connect(url, protocol=protocol, shared_memory=True, shared_memory_min_bytes=0) as no_key_shm:
        with pytest.raises(UnauthorizedError, match="restricted"):
            no_key_shm.embed(["shared memory registration needs the key"])
    assert leftover_regions() == []
    with connect(url, protocol=protocol, check_model=False, api_key="wrong-key") as wrong:
        with pytest.raises(UnauthorizedError):
            wrong.models()
    with connect(url, protocol=protocol, api_key=API_KEY, shared_memory=True, shared_memory_min_bytes=0) as keyed:
        assert {m["name"] for m in keyed.models()} == {"minilm", "minilm_encoder", "minilm_tokenizer"}
        assert keyed.embed(["with the key"]).shape == (1, 384)
        # With the key, a load gets past the restriction; this server runs with model control
        # "none", so Triton itself then refuses it (explicit load/unload is not allowed).
        with pytest.raises(ServerUnavailableError, match="explicit model load / unload is not allowed"):
            keyed.load_model("minilm_tokenizer")


def _serve(tmp_path: Path, repository: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], int]:
    http, grpc, metrics = free_ports(3)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tritonbundle", "-v", "serve", "--repository", str(repository), "--http-port", str(http),
         "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--log-file", str(tmp_path / "server.log")],
        stdout=open(tmp_path / "serve.out", "w"), stderr=subprocess.STDOUT, env=env,  # noqa: SIM115
    )
    from tests.reliability.test_crashes import wait_ready

    wait_ready(f"127.0.0.1:{http}", 120)
    return proc, http


def _status(http: int, path: str, headers: dict[str, str] | None = None) -> int:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"http://127.0.0.1:{http}{path}", data=b"{}", method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def test_serve_locks_restricted_apis_with_a_random_key_when_none_is_set(repository: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITONBUNDLE_API_KEY"}
    proc, http = _serve(tmp_path, repository, env)
    try:
        assert _status(http, "/v2/repository/index") == 403
        assert _status(http, "/v2/repository/models/minilm/load") == 403
        assert _status(http, "/v2/systemsharedmemory/region/x/register") == 403
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert "locked with a random key" in (tmp_path / "serve.out").read_text()


def test_no_key_reaches_a_log(repository: Path, tmp_path: Path) -> None:
    secret = "sk-never-log-this-3f9a1c"
    proc, http = _serve(tmp_path, repository, {**os.environ, "TRITONBUNDLE_API_KEY": secret})
    try:
        assert _status(http, "/v2/repository/index") == 403
        assert _status(http, "/v2/repository/index", {"tritonbundle-key": secret}) == 200
        assert _status(http, "/v2/repository/index", {"tritonbundle-key": "guess"}) == 403
        # Nor the environment of tritonserver or of any Python stub it started (they may log it).
        children = _descendants(proc.pid)
        assert any(name.endswith("tritonserver") for name, _ in children.values())
        assert any("stub" in name for name, _ in children.values()), children
        leaked = [name for name, environ in children.values() if secret.encode() in environ]
        assert not leaked, f"the API key is in the environment of {leaked}"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    for log in (tmp_path / "server.log", tmp_path / "serve.out"):
        text = log.read_text()
        assert text, f"{log} is empty"
        assert secret not in text, f"the API key leaked into {log.name}"


def test_pinned_dependencies_pass_the_audit_or_are_documented() -> None:
    """pip-audit over requirements/constraints.txt; every finding must be in audit-allowlist.txt."""
    pip_audit = Path(sys.executable).parent / "pip-audit"
    result = subprocess.run(
        [str(pip_audit), "-r", str(ROOT / "requirements" / "constraints.txt"), "--no-deps", "--disable-pip",
         "--progress-spinner", "off", "--format", "json"],
        capture_output=True, text=True, timeout=600,
    )
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"pip-audit gave no report (exit {result.returncode}): {result.stderr[-1500:]}")
    dependencies = report.get("dependencies", [])
    audited = [d for d in dependencies if "skip_reason" not in d]
    if not audited:
        reasons = {d.get("skip_reason", "") for d in dependencies}
        pytest.skip("the vulnerability service could not audit any pinned package from this machine "
                    f"(its PyPI mirror serves no JSON API): {sorted(reasons)[:1]}")
    allowed = {line.split()[0] for line in (ROOT / "requirements" / "audit-allowlist.txt").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    findings = [f"{d['name']} {d['version']}: {v['id']}" for d in audited for v in d.get("vulns", []) if v["id"] not in allowed]
    assert not findings, "fix or document in requirements/audit-allowlist.txt: " + "; ".join(findings)


def _descendants(root: int) -> dict[int, tuple[str, bytes]]:
    """pid -> (program, environment) of every process below ``root``, read from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = {}, [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in found:
                try:
                    argv0 = (Path("/proc") / str(child) / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
                    environ = (Path("/proc") / str(child) / "environ").read_bytes()
                except OSError:
                    continue
                found[child] = (argv0, environ)
                frontier.append(child)
    return found
