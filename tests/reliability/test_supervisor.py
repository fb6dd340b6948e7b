"""The supervisor's rules, on a stand-in for the server process (the real server's crashes and dead
stubs are in test_crashes.py and test_canary.py): what counts as a failed start, the backoff, never
giving up silently, refusing a port someone else holds; and the canary's requests."""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tritonbundle.canary import Problem, request_for
from tritonbundle.errors import ServerError
from tritonbundle.server import ServerOptions, TritonServer, supervise


class _Exited:
    returncode = 1

    def poll(self) -> int:
        return 1


@dataclass
class FakeServer:
    """Starts as scripted: "up" (ready, then exits at once), "flash" (exits before ready, but its log
    says it came up), "never" (never comes up)."""

    script: list[str]
    options: ServerOptions = field(default_factory=lambda: ServerOptions(Path("."), unrestricted=True, exit_timeout_s=1))
    process: Any = field(default_factory=_Exited)
    starts: int = 0
    last: str = "up"

    def start(self, *, ready_timeout_s: float = 0, stop: threading.Event | None = None) -> None:
        self.starts += 1
        self.last = self.script.pop(0) if self.script else "stop"
        if self.last in ("flash", "never"):
            raise ServerError(f"{self.last}: exited before becoming ready")
        if self.last == "stop":
            raise KeyboardInterrupt

    def came_up(self) -> bool:
        return self.last == "flash"

    def stop(self, *, timeout_s: float | None = None) -> int:
        return 1

    def log_tail(self) -> str:
        return "(log)"

    def start_log(self) -> str:
        return "E1201 model_lifecycle.cc:654] failed to load 'm' version 2: bad" if self.last == "never" else ""


def run(script: list[str], **kw: Any) -> tuple[FakeServer, Any]:
    server = FakeServer(script)
    try:
        outcome: Any = supervise(server, restart=True, already_started=True, **{"backoff_s": 0.001, **kw})  # type: ignore[arg-type]
    except (ServerError, KeyboardInterrupt) as e:
        outcome = e
    return server, outcome


def test_crashes_after_coming_up_never_exhaust_the_restarts() -> None:
    server, outcome = run(["flash"] * 8 + ["up"] * 4, max_restarts=3)
    assert isinstance(outcome, KeyboardInterrupt), "it kept restarting past --max-restarts crash-after-start loops"
    assert server.starts == 13


def test_starts_that_never_come_up_end_the_run_with_the_reason() -> None:
    server, outcome = run(["up", "never", "never", "never"], max_restarts=3)
    assert isinstance(outcome, ServerError) and "failed to start 3 times in a row" in str(outcome)
    assert server.starts == 4


def test_a_good_start_resets_the_failed_start_count() -> None:
    _, outcome = run(["never", "never", "up", "never", "never", "up"], max_restarts=3)
    assert isinstance(outcome, KeyboardInterrupt)


def test_without_restart_a_crash_is_an_exit_code_not_silence() -> None:
    server = FakeServer([])
    assert supervise(server, restart=False, already_started=True) == 1  # type: ignore[arg-type]


def test_a_canary_problem_stops_the_server_only_when_fatal() -> None:
    class Alive:
        returncode = None

        def poll(self) -> None:
            return None

    class Canary:
        def __init__(self, problems: list[list[Problem]]) -> None:
            self.problems = problems

        def check(self) -> list[Problem]:
            return self.problems.pop(0) if self.problems else []

    busy = [Problem("m", "HTTP 503", fatal=False)]
    dead = [Problem("m", "HTTP 500: Stub process 'm_0_0' is not healthy.", fatal=True)]
    server = FakeServer([])
    server.process = Alive()
    stop = threading.Event()
    timer = threading.Timer(3.0, stop.set)
    timer.start()
    try:
        code = supervise(server, restart=False, already_started=True, stop_event=stop,  # type: ignore[arg-type]
                         canary=Canary([busy, busy, busy, dead, dead]), canary_interval_s=0.05)  # type: ignore[arg-type]
    finally:
        timer.cancel()
    assert code == 1 and not stop.is_set(), "two fatal answers in a row end the run; busy ones do not"


def test_a_port_held_by_someone_else_is_refused_naming_the_holder(tmp_path: Path) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        server = TritonServer(ServerOptions(tmp_path, http_port=port, grpc_port=0, metrics_port=0))
        with pytest.raises(ServerError, match=rf"HTTP port 127.0.0.1:{port} is taken by pid \d+"):
            server.start(wait=False)
        assert server.process is None
        # A restart refused so, after a start that came up: not "came up and went down" (a crash, restarted at
        # once and never counted), or `serve --restart` spun ~4 times a second, never backing off.
        log = tmp_path / "triton.log"
        log.write_text("I1201 grpc_server.cc:2495] Started GRPCInferenceService at 0.0.0.0:8001\n"
                       "I1201 http_server.cc:4643] Started HTTPService at 0.0.0.0:8000\n")
        server = TritonServer(ServerOptions(tmp_path, http_port=port, grpc_port=0, metrics_port=0, log_path=log))
        with pytest.raises(ServerError, match="is taken by"):
            server.start(wait=False)
        assert not server.came_up()
    finally:
        holder.close()


def test_the_canary_request_is_the_smallest_the_config_accepts() -> None:
    config = {"max_batch_size": 32, "input": [
        {"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1]},
        {"name": "input_ids", "data_type": "TYPE_INT64", "dims": [-1]},
        {"name": "image", "data_type": "TYPE_FP32", "dims": [3, 2]},
        {"name": "extra", "data_type": "TYPE_FP32", "dims": [-1], "optional": True},
    ]}
    inputs = {i["name"]: i for i in request_for(config)["inputs"]}
    assert inputs["TEXT"] == {"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": ["ok"]}
    assert inputs["input_ids"]["shape"] == [1, 1] and inputs["input_ids"]["data"] == [1]
    assert inputs["image"]["shape"] == [1, 3, 2] and len(inputs["image"]["data"]) == 6
    assert "extra" not in inputs
    assert request_for({"max_batch_size": 0, "input": [{"name": "x", "data_type": "TYPE_INT32", "dims": [-1]}]})[
        "inputs"][0]["shape"] == [1]


@pytest.mark.slow
def test_a_failed_start_names_its_cause(tmp_path: Path) -> None:
    from tritonbundle.modelconfig import InstanceGroup, ModelConfig, TensorSpec, write_config

    repo = tmp_path / "repo"
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"this is not an ONNX model")
    write_config(ModelConfig(name="broken", backend="onnxruntime", max_batch_size=0,
                             inputs=(TensorSpec("x", "FP32", (1,)),), outputs=(TensorSpec("y", "FP32", (1,)),),
                             instance_groups=(InstanceGroup(1, "KIND_CPU"),)), repo / "broken")
    server = TritonServer(ServerOptions(repo, http_port=0, grpc_port=0, metrics_port=0, log_path=tmp_path / "log"))
    with pytest.raises(ServerError) as failed:
        server.start(ready_timeout_s=120)
    first_line = str(failed.value).splitlines()[0]
    assert "before becoming ready" in first_line and "broken" in first_line, first_line
    assert "Protobuf parsing failed" in first_line or "failed to load" in first_line, first_line


def test_a_server_gets_three_different_ports_and_a_refused_command_line_names_why(tmp_path: Path) -> None:
    """Ports asked for one at a time once came back the same (HTTP and gRPC on one port in a clean-clone CI
    run): tritonserver printed its usage and refused, and the error said only "no error line"."""
    from tritonbundle.proc import free_ports

    assert all(len(set(free_ports(3))) == 3 for _ in range(200))
    options = [TritonServer(ServerOptions(tmp_path, http_port=0, grpc_port=0, metrics_port=0)).options for _ in range(50)]
    assert all(len({o.http_port, o.grpc_port, o.metrics_port}) == 3 for o in options)
    port = free_ports(1)[0]
    server = TritonServer(ServerOptions(tmp_path, http_port=port, grpc_port=port, metrics_port=0, log_path=tmp_path / "log"))
    with pytest.raises(ServerError) as refused:
        server.start(ready_timeout_s=60)
    first_line = str(refused.value).splitlines()[0]
    assert "cannot listen to HTTP requests and GRPC requests at the same address and port" in first_line, first_line


def test_a_crash_of_a_server_that_was_up_is_restarted_at_once() -> None:
    """A backoff there let six small poison requests a minute keep a bare `serve` down; only failed
    starts back off."""
    import time

    start = time.monotonic()
    server, outcome = run(["up"] * 6, max_restarts=3, backoff_s=5.0)
    assert isinstance(outcome, KeyboardInterrupt) and server.starts == 7
    assert time.monotonic() - start < 3.0, "a crash after a good start waited for a backoff"


def test_a_start_that_fails_on_a_new_version_quarantines_it_and_serves_the_old_one(tmp_path: Path) -> None:
    from tritonbundle.server import quarantine_failed_version

    for version in ("1", "2"):
        (tmp_path / "m" / version).mkdir(parents=True)
    server = FakeServer(["never"], options=ServerOptions(tmp_path, unrestricted=True))
    server.last = "never"
    moved = quarantine_failed_version(server)  # type: ignore[arg-type]
    assert moved is not None and not (tmp_path / "m" / "2").exists() and (tmp_path / "m" / "1").exists()
    assert "refused it at start: bad" in (moved / "error.txt").read_text()
    assert quarantine_failed_version(server) is None, "the last version of a model is never moved away"  # type: ignore[arg-type]


def test_a_stop_while_the_server_starts_ends_the_wait_at_once(tmp_path: Path) -> None:
    """SIGTERM while the models load: the wait used to run to the models' readiness (or the 180-s timeout),
    past Kubernetes' grace period."""
    import time

    stop = threading.Event()
    server = TritonServer(ServerOptions(tmp_path, http_port=0, grpc_port=0, metrics_port=0))
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    assert server.wait_ready(timeout_s=30, stop=stop) is False
    assert time.monotonic() - started < 5


def test_a_repository_path_with_a_space_is_refused_naming_it(tmp_path: Path) -> None:
    """Triton's Python backend stub aborted on it ("terminate called ... stol"), and the start waited out its
    ready timeout to say "no error line"."""
    repository = tmp_path / "with space" / "repo"
    repository.mkdir(parents=True)
    with pytest.raises(ServerError, match="has a space in its path"):
        TritonServer(ServerOptions(repository, http_port=0, grpc_port=0, metrics_port=0)).start(wait=False)
