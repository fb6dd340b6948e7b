"""Every Locust user's client is closed, even where Locust runs no ``on_stop``: a user whose
``on_start`` failed after connecting, and one killed while ``on_stop`` waits for requests in flight.
What is still open when Locust quits is closed then, before interpreter exit, where a gRPC client
left to the garbage collector can hang the run (a CI run's Locust hung in grpc's ``_channel.close``
from tritonclient's ``__del__``). Real clients on the real server."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gevent
import pytest

from tritonbundle.errors import ConfigError
from tritonbundle.loadtests import locustfile
from tritonbundle.loadtests.settings import LoadSettings


@pytest.fixture
def env(server: Any, tmp_path: Path, fresh_locust_events: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from locust.env import Environment

    monkeypatch.setattr(locustfile, "SETTINGS", LoadSettings(http_url=server.http_url, grpc_url=server.grpc_url,
                                                            report_dir=str(tmp_path), timeout_s=30))
    monkeypatch.setattr(locustfile, "OPEN_CLIENTS", set())
    yield Environment(user_classes=[locustfile.GrpcUser], events=fresh_locust_events)
    locustfile.close_open_clients()


def test_a_user_whose_start_fails_after_connecting_closes_its_client(env: Any, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(locustfile, "SETTINGS", dataclasses.replace(locustfile.SETTINGS,
                                                                    inputs=str(tmp_path / "missing.npz")))
    user = locustfile.GrpcUser(env)
    with pytest.raises(ConfigError, match="missing.npz"):
        user.on_start()
    assert user.client is not None and user.client._closed
    assert not locustfile.OPEN_CLIENTS


def test_an_open_user_killed_while_waiting_for_requests_in_flight_closes_its_client(env: Any) -> None:
    user = locustfile.OpenGrpcUser(env)
    user.on_start()
    assert locustfile.OPEN_CLIENTS == {user.client}
    user.in_flight = 1  # a request that never answers: on_stop waits up to timeout_s (30 s) for it
    stopping = gevent.spawn(user.on_stop)
    gevent.sleep(0.2)
    assert not stopping.dead and not user.client._closed
    stopping.kill(block=True)  # as Locust does after --stop-timeout
    assert user.client._closed and not locustfile.OPEN_CLIENTS


def test_what_users_left_open_is_closed_when_locust_quits(env: Any, capsys: pytest.CaptureFixture[str]) -> None:
    users = [locustfile.GrpcUser(env), locustfile.OpenGrpcUser(env)]
    for user in users:
        user.on_start()
    env.events.quit.fire(exit_code=0)
    assert all(user.client._closed for user in users) and not locustfile.OPEN_CLIENTS
    assert "closing 2 client(s) whose user did not close them" in capsys.readouterr().err
