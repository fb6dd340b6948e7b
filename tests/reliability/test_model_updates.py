"""Model updates with explicit model control: a new version loaded while a load test runs drops
no request; a broken new version fails to load and the old one keeps serving."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import API_KEY
from tests.reliability.conftest import load_test

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
REPORT = Path(__file__).resolve().parents[2] / "reports" / "reliability"


def _new_version(repo: Path, version: int, *, broken: bool = False) -> None:
    source = repo / "minilm_encoder" / "1"
    target = repo / "minilm_encoder" / str(version)
    shutil.copytree(source, target)
    if broken:
        (target / "model.onnx").unlink()
        (target / "model.onnx").write_bytes(b"this is not an ONNX model")


def test_loading_a_new_version_during_a_load_test_drops_nothing(explicit_server: tuple[Any, Path], tmp_path: Path) -> None:
    from tritonbundle.clients import HttpClient

    server, repo = explicit_server
    with load_test(server, tmp_path / "load", duration_s=60, retries=1, stop_after_block_s=4) as outcome:
        time.sleep(6)
        _new_version(repo, 2)
        with HttpClient(server.http_url, api_key=API_KEY) as client:
            started = time.monotonic()
            client.load_model("minilm_encoder")
            reload_s = time.monotonic() - started
            assert client.model_info("minilm_encoder").version == "2"
    summary = outcome["summary"]
    REPORT.mkdir(parents=True, exist_ok=True)
    (REPORT / "reload.json").write_text(json.dumps({"reloads": 1, "reload_s": round(reload_s, 2),
                                                   "requests": summary["total"]["requests"],
                                                   "failures": summary["total"]["failures"],
                                                   "errors": summary["errors"]}, indent=2))
    assert summary["total"]["requests"] > 20
    assert summary["total"]["failures"] == 0, summary["errors"]
    # Stopped 4 s after the reload, not at its 60-s window's end: the window spans the reload.
    assert outcome["block_s"] - 6 < summary["duration_s"] < 50


def test_a_broken_new_version_fails_to_load_and_the_old_one_keeps_serving(explicit_server: tuple[Any, Path]) -> None:
    from tritonbundle.clients import ClientError, HttpClient

    server, repo = explicit_server
    with HttpClient(server.http_url, api_key=API_KEY) as client:
        serving = client.model_info("minilm_encoder").version
        before = client.embed(["unchanged"])
        _new_version(repo, 9, broken=True)
        with pytest.raises(ClientError, match="load failed for model 'minilm_encoder': version 9"):
            client.load_model("minilm_encoder")
        assert client.model_info("minilm_encoder").version == serving
        assert client.health() == {"live": True, "ready": True}
        np.testing.assert_allclose(client.embed(["unchanged"]), before, atol=1e-6)
    shutil.rmtree(repo / "minilm_encoder" / "9")


def test_cli_load_needs_the_key(explicit_server: tuple[Any, Path]) -> None:
    server, _ = explicit_server
    base = [sys.executable, "-m", "tritonbundle", "load", "--url", server.http_url, "minilm_tokenizer"]
    env = {k: v for k, v in os.environ.items() if k != "TRITONBUNDLE_API_KEY"}
    refused = subprocess.run(base, capture_output=True, text=True, timeout=120, env=env)
    assert refused.returncode == 1 and "locks this API with a key: set $TRITONBUNDLE_API_KEY" in refused.stderr
    allowed = subprocess.run(base, capture_output=True, text=True, timeout=120, env={**env, "TRITONBUNDLE_API_KEY": API_KEY})
    assert allowed.returncode == 0, allowed.stderr
    assert "loaded minilm_tokenizer" in allowed.stdout


def test_a_refused_version_is_quarantined_and_a_restart_serves_the_old_one(explicit_server: tuple[Any, Path]) -> None:
    from tritonbundle.clients import HttpClient
    from tritonbundle.server import ServerOptions, TritonServer

    server, repo = explicit_server
    with HttpClient(server.http_url, api_key=API_KEY) as client:
        serving = client.model_info("minilm_encoder").version
        before = client.embed(["unchanged"])
    _new_version(repo, 11, broken=True)
    env = {**os.environ, "TRITONBUNDLE_API_KEY": API_KEY}
    done = subprocess.run([sys.executable, "-m", "tritonbundle", "load", "--url", server.http_url, "--repository",
                           str(repo), "minilm_encoder"], capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 1, done.stderr
    assert "refused version(s) 11" in done.stderr and f"serving version {serving}" in done.stderr, done.stderr
    assert not (repo / "minilm_encoder" / "11").exists()
    assert (repo / "minilm_encoder" / "1").is_dir(), "only the version this load refused is moved"
    (moved,) = (repo.parent / f"{repo.name}.quarantine" / "minilm_encoder").glob("11-*")
    assert "version 11 is at UNAVAILABLE state" in (moved / "error.txt").read_text()

    # A restart (a new server on the same repository) loads the known-good version.
    restarted = TritonServer(ServerOptions(repo, http_port=0, grpc_port=0, metrics_port=0, log_path=repo.parent / "log2",
                                           model_control_mode="explicit", load_models=("*",), restricted_api_key=API_KEY))
    restarted.start(ready_timeout_s=120)
    try:
        with HttpClient(restarted.http_url, api_key=API_KEY) as client:
            assert client.model_info("minilm_encoder").version == serving
            np.testing.assert_allclose(client.embed(["unchanged"]), before, atol=1e-5)
    finally:
        restarted.stop(timeout_s=10)
