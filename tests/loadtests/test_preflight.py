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


def test_the_requests_come_from_the_models_own_traffic_sample(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """loadtest drew every model's requests from the chat sample: an image model planned from its own
    traffic got chat lengths and the plan's typical sizes. The manifest's sample comes first."""
    from tritonbundle.cli.loadtest import planned_traffic

    shipped = (Path(__file__).parents[2] / "build" / "models.yaml").read_text()
    (tmp_path / "build" / "traffic").mkdir(parents=True)
    for name in ("chat.jsonl", "mine.jsonl"):
        (tmp_path / "build" / "traffic" / name).write_text('{"tokens": 12}\n')
    monkeypatch.chdir(tmp_path)
    assert planned_traffic("minilm") == Path("build/traffic/chat.jsonl")  # no manifest here yet
    (tmp_path / "build" / "models.yaml").write_text(shipped.replace("traffic: traffic/chat.jsonl", "traffic: traffic/mine.jsonl"))
    assert planned_traffic("minilm") == Path("build/traffic/mine.jsonl")
    assert planned_traffic("served-elsewhere") == Path("build/traffic/chat.jsonl")


def test_a_remote_triton_url_without_a_grpc_address_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """$TRITON_URL points the HTTP users at a remote server; the gRPC users called 127.0.0.1:8001."""
    from tritonbundle.cli import main

    _no_locust(monkeypatch)
    monkeypatch.setenv("TRITON_URL", "10.1.2.3:8000")
    assert main(["loadtest", "--window-s", "1"]) != 0
    assert "$TRITON_URL (10.1.2.3:8000) names the HTTP address only" in capsys.readouterr().err
    monkeypatch.setattr(runner, "preflight", lambda settings: pytest.fail(f"settings passed: {settings.grpc_url}"))
    with pytest.raises(pytest.fail.Exception, match="settings passed: 10.1.2.3:8001"):
        main(["loadtest", "--window-s", "1", "--grpc-url", "10.1.2.3:8001"])
