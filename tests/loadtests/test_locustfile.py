"""The locustfile's parts that need no server: load shapes timed from the sending window, the open
model's rate following the shape, the first error that ended a user on the console and in the gates,
and the gates stopping users that still run (Locust fires ``quitting`` before stopping them on SIGTERM)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tritonbundle.errors import ClientError
from tritonbundle.loadtests import locustfile
from tritonbundle.loadtests.recorder import Recorder
from tritonbundle.loadtests.settings import LoadSettings


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    fresh = Recorder()
    monkeypatch.setattr(locustfile, "RECORDER", fresh)
    return fresh


def _runner(headless: bool) -> Any:
    return SimpleNamespace(environment=SimpleNamespace(parsed_options=SimpleNamespace(headless=headless)))


def test_a_shape_is_timed_from_the_window_and_leaves_a_headless_runs_end_to_the_window(
        recorder: Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(locustfile, "SETTINGS", LoadSettings(users=8, shape="step", duration_s=40, spawn_rate=50))
    shape = locustfile.TrafficShape()
    shape.runner = _runner(headless=True)
    assert shape.tick() == (2, 50)  # users still connecting: the first step, waiting for the window
    recorder.begin(time.time() - 15)
    assert shape.tick() == (4, 50)  # 15 s into the window, however long Locust has run
    recorder.begin(time.time() - 45)
    # Past the window: the shape holds on, and the window's closer ends the run once requests in
    # flight drain (a shape ending it raced the closer and the summary lost requests still in flight).
    assert shape.tick() == (4, 50)
    shape.runner = _runner(headless=False)
    assert shape.tick() is None  # the web UI: the shape's end is the run's


def test_the_shape_is_used_only_for_a_shape_other_than_constant() -> None:
    from locust.util.load_locustfile import is_shape_class

    assert locustfile.SETTINGS.shape == "constant" and not is_shape_class(locustfile.TrafficShape)


def test_an_open_users_gaps_follow_the_rate_the_shape_wants(recorder: Recorder, monkeypatch: pytest.MonkeyPatch,
                                                            fresh_locust_events: Any) -> None:
    from locust.env import Environment

    monkeypatch.setattr(locustfile, "SETTINGS", LoadSettings(mode="open", shape="spike", users=20, rate=60,
                                                            duration_s=100, grpc_url=None))
    user = locustfile.OpenHttpUser(Environment(user_classes=[locustfile.OpenHttpUser], events=fresh_locust_events))
    recorder.begin(time.time() - 10)  # before the spike: a quarter of the users, so a quarter of the rate
    base = sum(user._gap() for _ in range(4000)) / 4000
    assert base == pytest.approx(1 / 15, rel=0.1)  # the one source running sends all 15/s
    recorder.started = time.time() - 50  # in the spike: the full rate
    spike = sum(user._gap() for _ in range(4000)) / 4000
    assert spike == pytest.approx(1 / 60, rel=0.1)


def test_the_first_error_that_ends_a_user_is_on_the_console_and_fails_the_gates(
        recorder: Recorder, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        fresh_locust_events: Any) -> None:
    from locust.env import Environment

    monkeypatch.setattr(locustfile, "SETTINGS", LoadSettings(report_dir=str(tmp_path)))
    monkeypatch.setattr(locustfile, "USER_ERRORS", {})
    error = ClientError("the client expects model 'nosuch', but the server at 127.0.0.1:8000 over http does not "
                        "serve it")
    locustfile._on_user_error(user_instance=SimpleNamespace(protocol="http"), exception=error, tb=None)  # on_start
    task_set = SimpleNamespace(user=SimpleNamespace(protocol="http"))  # an error in a task: Locust passes its TaskSet
    locustfile._on_user_error(user_instance=task_set, exception=error, tb=None)
    assert capsys.readouterr().err.splitlines() == [f"loadtest: a http user failed: {error}"]  # once, as it happens

    env = Environment(user_classes=[locustfile.HttpUser, locustfile.GrpcUser], events=fresh_locust_events)
    env.create_local_runner()
    locustfile._gate(env)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["gates"]["failures"] == [
        "http: no requests were sent", "grpc: no requests were sent", f"users failed 2 time(s): http: {error}"]
    assert summary["user_errors"] == [{"error": f"http: {error}", "occurrences": 2}]
    assert env.process_exit_code == 1


def test_the_gates_stop_users_that_still_run_before_writing_the_summary(
        recorder: Recorder, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fresh_locust_events: Any) -> None:
    from locust.env import Environment
    from locust.runners import STATE_RUNNING, STATE_STOPPED

    monkeypatch.setattr(locustfile, "SETTINGS", LoadSettings(report_dir=str(tmp_path), grpc_url=None))
    monkeypatch.setattr(locustfile, "USER_ERRORS", {})
    env = Environment(user_classes=[locustfile.HttpUser], events=fresh_locust_events)
    runner = env.create_local_runner()
    stopped: list[bool] = []
    fresh_locust_events.test_stopping.add_listener(lambda **_: stopped.append(True))
    runner.state = STATE_RUNNING  # as on SIGTERM: Locust fires quitting while the users still send
    locustfile._gate(env)
    assert stopped and runner.state == STATE_STOPPED, "the users were stopped (and drained) before the summary"
    assert (tmp_path / "summary.json").exists()
