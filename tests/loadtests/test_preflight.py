"""What Locust would otherwise fail on only in its own log is checked before it starts, and said on
the console in one line: files that do not exist, a server that does not answer, a model it does not
serve."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from tritonbundle.errors import ConfigError
from tritonbundle.loadtests import runner
from tritonbundle.loadtests.settings import LoadSettings


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _no_locust(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "run", lambda *a, **k: pytest.fail("Locust was started"))


def test_recorded_inputs_that_do_not_exist_are_named_before_locust_starts(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"recorded inputs /nonexistent\.npz do not exist.*--inputs"):
        runner.preflight(LoadSettings(inputs="/nonexistent.npz", http_url=f"127.0.0.1:{_closed_port()}"))


def test_a_traffic_sample_that_does_not_exist_is_named_before_locust_starts() -> None:
    with pytest.raises(ConfigError, match=r"traffic sample /nonexistent\.jsonl does not exist"):
        runner.preflight(LoadSettings(traffic="/nonexistent.jsonl", http_url=f"127.0.0.1:{_closed_port()}"))


@pytest.mark.timeout(30)
def test_an_unreachable_server_is_a_one_line_error_not_an_empty_report(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tritonbundle.cli import main

    monkeypatch.setattr(runner, "CONNECT_TIMEOUT_S", 0.5)
    _no_locust(monkeypatch)
    port = _closed_port()
    code = main(["loadtest", "--protocol", "http", "--http-url", f"127.0.0.1:{port}", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code != 0 and f"127.0.0.1:{port}" in err and "no requests were sent" not in err
    assert err.startswith("tritonbundle loadtest: error: ") and "Traceback" not in err


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_model_the_server_does_not_serve_is_named_before_locust_starts(
        server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tritonbundle.cli import main

    _no_locust(monkeypatch)
    code = main(["loadtest", "--http-url", server.http_url, "--grpc-url", server.grpc_url, "--model", "nosuch",
                 "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code != 0 and "'nosuch'" in err and "does not serve it" in err, err
