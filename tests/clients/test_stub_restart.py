"""A model's Python stub dies under a client: Triton 2.51 answers "Stub process '...' is not healthy."
(HTTP 500) until `tritonbundle serve --restart` sees it and restarts the server; the client's default
retry policy rides over that window instead of failing its calls."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.supervised import call_across_a_restart, spawn_serve, stop_serve, tritonserver_pids
from tritonbundle.clients import HttpClient, ServerUnavailableError, core

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_calls_ride_over_a_killed_stub_until_the_supervisor_restarts_the_server(
    repository: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.reliability.test_canary import stub_pids

    seen: list[BaseException] = []
    classify = core.classify

    def recording(error: BaseException, **kwargs: Any) -> Any:
        mapped = classify(error, **kwargs)
        seen.append(mapped)
        return mapped

    monkeypatch.setattr(core, "classify", recording)
    serve, http, _ = spawn_serve(repository, tmp_path, "--restart")
    try:
        url = f"127.0.0.1:{http}"
        with HttpClient(url, connect_timeout_s=180) as client:  # the default RetryPolicy and 30 s deadline
            client.embed(["warm"])
            stubs = stub_pids("minilm_encoder", url)
            assert stubs, "the encoder's Python stub"
            seen.clear()
            server = tritonserver_pids(http)
            for pid in stubs:
                os.kill(pid, signal.SIGKILL)
            calls, failures, back = call_across_a_restart(lambda: client.embed(["still there?"]), http, server)
    finally:
        stop_serve(serve)
    assert back, "the supervisor never restarted the server"
    assert failures == [], f"{len(failures)} of {calls} calls failed: {failures[:2]}"
    restarting = [e for e in seen if isinstance(e, ServerUnavailableError) and "stub is dead and restarting" in str(e)]
    assert restarting, f"the calls never met the dead stub: {seen[:3]}"
