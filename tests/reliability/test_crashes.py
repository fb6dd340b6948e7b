"""Crashes: the supervisor brings a SIGKILLed server back while a load test runs, the clients'
retries carry the requests over, and a Python model that raises or returns garbage costs only the
requests it was given, never the server."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.reliability.supervised import spawn_serve, stop_serve, tritonserver_pids

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]
REPORT = Path(__file__).resolve().parents[2] / "reports" / "reliability"


def wait_ready(url: str, timeout_s: float) -> float:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=1) as r:
                if r.status == 200:
                    return time.monotonic()
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} not ready within {timeout_s} s")


def test_supervisor_restarts_a_killed_server_and_retries_carry_requests_over(repository: Path, tmp_path: Path) -> None:
    from tritonbundle.loadtests import runner
    from tritonbundle.loadtests.settings import LoadSettings
    from tritonbundle.measure.latency import Slo

    serve, http, grpc = spawn_serve(repository, tmp_path, "--restart")
    try:
        wait_ready(f"127.0.0.1:{http}", 120)
        settings = LoadSettings(http_url=f"127.0.0.1:{http}", grpc_url=f"127.0.0.1:{grpc}", users=4, duration_s=25,
                                timeout_s=20, retries=30, report_dir=str(tmp_path / "load"), slo=Slo(max_failure_ratio=0.0))
        outcome: dict[str, Any] = {}
        load = threading.Thread(target=lambda: outcome.update(result=runner.run(settings)))
        load.start()
        time.sleep(8)
        (victim,) = tritonserver_pids(http)
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        back_at = wait_ready(f"127.0.0.1:{http}", 120)
        load.join(timeout=180)
        assert not load.is_alive(), "the load test did not stop by itself"
        summary = outcome["result"].summary
        assert tritonserver_pids(http) and tritonserver_pids(http) != [victim], "no new server process"
        window = back_at - killed_at
        figures = {"crash_window_s": round(window, 2), "requests": summary["total"]["requests"],
                   "failures": summary["total"]["failures"], "errors": summary["errors"]}
        REPORT.mkdir(parents=True, exist_ok=True)
        (REPORT / "crash.json").write_text(json.dumps(figures, indent=2))
        assert window < 60, figures
        for protocol in ("http", "grpc"):
            assert summary["by_protocol"][protocol]["requests"] > 5
        # Retries (idempotent requests, within their 20 s deadline) carry the outage over: nothing is lost.
        assert summary["total"]["failures"] == 0, figures
        assert "restarting tritonserver" in (tmp_path / "serve.log").read_text()
    finally:
        stop_serve(serve)


BROKEN_MODEL = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.calls = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)[0]
            if text == b"raise":
                raise RuntimeError("this model raises on purpose")
            if text == b"garbage":
                responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("WRONG", np.array([1]))]))
                continue
            if text == b"nothing":
                responses.append(None)
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUT", np.ones((1, 2), np.float32))]))
        return responses
'''


@pytest.fixture(scope="module")
def broken_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tritonbundle.modelconfig import InstanceGroup, ModelConfig, TensorSpec, write_config
    from tritonbundle.server import ServerOptions, TritonServer

    repo = tmp_path_factory.mktemp("broken") / "repo"
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.py").write_text(BROKEN_MODEL)
    write_config(ModelConfig(name="broken", backend="python", max_batch_size=0,
                             inputs=(TensorSpec("TEXT", "STRING", (1,)),), outputs=(TensorSpec("OUT", "FP32", (1, 2)),),
                             instance_groups=(InstanceGroup(1, "KIND_CPU"),)), repo / "broken")
    # Requests the model never answers stay "in flight": a short exit timeout keeps teardown quick.
    server = TritonServer(ServerOptions(repo, http_port=0, grpc_port=0, metrics_port=0, log_path=repo.parent / "log",
                                        exit_timeout_s=2))
    server.start(ready_timeout_s=120)
    yield server
    server.stop()


@pytest.mark.parametrize("trigger", ["raise", "garbage", "nothing"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_model_that_raises_or_returns_garbage_fails_only_that_request(broken_server: Any, trigger: str, protocol: str) -> None:
    from tritonbundle.clients import ClientError, DeadlineExceededError, connect

    url = broken_server.http_url if protocol == "http" else broken_server.grpc_url
    with connect(url, protocol=protocol, model="broken", check_model=False, timeout_s=3) as client:
        started = time.monotonic()
        # A model that answers nothing never completes the request: the client's deadline ends it.
        expected = DeadlineExceededError if trigger == "nothing" else ClientError
        with pytest.raises(expected) as e:
            client.infer({"TEXT": np.array([trigger.encode()], dtype=object)}, outputs=["OUT"])
        assert "broken" in str(e.value)
        assert time.monotonic() - started < 3 + 1
        assert client.health() == {"live": True, "ready": True}
        good = client.infer({"TEXT": np.array([b"fine"], dtype=object)}, outputs=["OUT"])
        assert good["OUT"].shape == (1, 2)
