"""A hung server: ``/v2/health/ready`` answers (or nothing does) while no inference ever completes. Triton
2.51's crash handler can deadlock under gRPC cancellations and leave exactly that (server #7368); the
canary, ``health --canary``, the compose healthcheck and the chart's probes used to count the timeout as
"busy" and nothing restarted it. The canary now asks Triton's metrics: requests pending and no success
counted since the probe began, or no answer from the metrics either, is hung (fatal)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.supervised import logged, tritonserver_pids
from tests.reliability.test_canary import REPORT, answers, serve, stop
from tritonbundle.canary import Canary, metric_sum


class StandIn(BaseHTTPRequestHandler):
    """Ready, configured, never answers an inference; its metrics as the test sets them."""

    successes = [7.0]
    pending = 1.0
    metrics_hang = False
    #: An HTTP status every inference is refused with at once (None: it never answers); model "ok" answers.
    refuse: int | None = None
    #: A tenant's key the edge wants (None: none): without it an inference is 401, with it answered.
    key: str | None = None
    release = threading.Event()

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, body: bytes, code: int = 200) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/metrics":
            if self.metrics_hang:
                self.release.wait(10)
                return
            body = (f'nv_inference_request_success{{model="m",version="1"}} {self.successes[0]}\n'
                    f'nv_inference_pending_request_count{{model="m",version="1"}} {self.pending}\n')
            self._send(body.encode())
        elif self.path.endswith("/config"):
            self._send(json.dumps({"name": "m", "max_batch_size": 0,
                                   "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}]}).encode())
        else:
            self._send(b"")

    def do_POST(self) -> None:  # noqa: N802
        if self.key is not None:
            given = self.headers.get("Authorization") == f"Bearer {self.key}"
            self._send(b"{}" if given else b'{"error": "no API key"}', 200 if given else 401)
        elif self.path.startswith("/v2/models/ok/"):
            self._send(b"{}")
        elif self.refuse is not None:
            self._send(json.dumps({"error": "refused"}).encode(), self.refuse)
        else:
            self.release.wait(10)  # never within the canary's timeout


@pytest.fixture
def stand_in() -> Iterator[tuple[str, type[StandIn]]]:
    StandIn.successes, StandIn.pending, StandIn.metrics_hang, StandIn.refuse, StandIn.key = [7.0], 1.0, False, None, None
    StandIn.release = threading.Event()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", StandIn
    StandIn.release.set()
    httpd.shutdown()


@pytest.mark.timeout(60)
def test_ready_but_never_answering_with_requests_pending_is_hung(stand_in: tuple[str, type[StandIn]]) -> None:
    url, handler = stand_in
    (problem,) = Canary(url, ["m"], timeout_s=0.5, metrics_url=f"{url}/metrics").check()
    assert problem.fatal and "the server is hung" in problem.message and "1 request(s) are pending" in problem.message
    # Without the metrics, a timeout is only busy (the old rule: nothing restarted such a server).
    (problem,) = Canary(url, ["m"], timeout_s=0.5).check()
    assert not problem.fatal


@pytest.mark.timeout(60)
def test_a_timeout_while_inferences_complete_is_busy_not_hung(stand_in: tuple[str, type[StandIn]]) -> None:
    url, handler = stand_in
    canary = Canary(url, ["m"], timeout_s=0.5, metrics_url=f"{url}/metrics")
    real = canary._progress

    def progressing() -> tuple[float, float] | None:
        handler.successes[0] += 5  # other requests complete meanwhile
        return real()

    canary._progress = progressing  # type: ignore[method-assign]
    (problem,) = canary.check()
    assert not problem.fatal


@pytest.mark.timeout(60)
def test_a_refused_probe_on_an_idle_server_is_not_hung_and_a_full_queue_that_never_drains_is(
        stand_in: tuple[str, type[StandIn]]) -> None:
    """A 4xx is the probe's own refusal, whatever the metrics count (an idle server counts no answer);
    a 503 (the queue full) with no answer counted for ``timeout_s`` is a model stuck with its queue full."""
    url, handler = stand_in
    handler.successes, handler.pending = [0.0], 0.0
    handler.refuse = 400
    (problem,) = Canary(url, ["m"], timeout_s=0.5, metrics_url=f"{url}/metrics").check()
    assert not problem.fatal and problem.message == "HTTP 400: refused", problem
    handler.refuse = 503
    (problem,) = Canary(url, ["m"], timeout_s=0.5, metrics_url=f"{url}/metrics").check()
    assert problem.fatal and "(the model is stuck)" in problem.message, problem


@pytest.mark.timeout(60)
def test_a_release_gate_fails_on_a_refusal_and_sends_a_tenants_key(stand_in: tuple[str, type[StandIn]],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The chart's rollout analysis runs the canary through the edge: with tenants on it was answered 401,
    which a liveness probe rightly does not count as down, so the release gate passed having checked
    nothing. --strict fails on any model that did not answer; --bearer-env sends a tenant's key."""
    from tritonbundle.canary import main

    url, handler = stand_in
    handler.key = "k-123"
    probe = ["--url", url, "--model", "m", "--timeout-s", "2"]
    assert main(probe) == 0, "a liveness probe: a refusal is not the server down"
    assert main([*probe, "--strict"]) == 1, "a release gate: a model that did not answer fails it"
    monkeypatch.setenv("CANARY_KEY", "k-123")
    assert main([*probe, "--strict", "--bearer-env", "CANARY_KEY"]) == 0
    monkeypatch.setenv("CANARY_KEY", "")
    with pytest.raises(SystemExit):
        main([*probe, "--strict", "--bearer-env", "CANARY_KEY"])


@pytest.mark.timeout(60)
def test_after_a_hang_the_models_not_yet_probed_are_named_once_each(stand_in: tuple[str, type[StandIn]]) -> None:
    url, _ = stand_in
    problems = Canary(url, ["ok", "m", "c"], timeout_s=0.5, metrics_url=f"{url}/metrics").check()
    assert [p.model for p in problems] == ["m", "c"], problems
    assert all(p.fatal for p in problems) and problems[1].message == "not probed: the server is hung"


@pytest.mark.timeout(60)
def test_no_answer_from_the_metrics_either_is_hung(stand_in: tuple[str, type[StandIn]]) -> None:
    url, handler = stand_in
    handler.metrics_hang = True
    (problem,) = Canary(url, ["m"], timeout_s=0.5, metrics_url=f"{url}/metrics").check()
    assert problem.fatal and "metrics endpoint did not answer either" in problem.message


@pytest.mark.timeout(60)
def test_a_silent_server_whose_processes_work_is_busy_and_an_idle_one_hung(stand_in: tuple[str, type[StandIn]]) -> None:
    """No answer counted with a request pending is hung only if the server's processes are idle too: a long
    execute() keeps a core busy (WORKING_CORES) and counts nothing until it ends."""
    url, _ = stand_in
    clock = [100.0]

    def working() -> float:
        clock[0] += 1.0  # a core's second for every reading, ~0.5 s apart: ~2 cores
        return clock[0]

    (problem,) = Canary(url, ["m"], timeout_s=0.5, metrics_url=f"{url}/metrics", cpu_s=working).check()
    assert not problem.fatal and "busy, not hung" in problem.message, problem
    (problem,) = Canary(url, ["m"], timeout_s=0.5, metrics_url=f"{url}/metrics", cpu_s=lambda: 100.0).check()
    assert problem.fatal and "the server is hung" in problem.message and "idle: 0.00 cores" in problem.message


def test_server_cpu_is_read_from_proc_by_process_group_or_by_name(tmp_path: Path) -> None:
    from tritonbundle.canary import server_cpu_s

    ticks = os.sysconf("SC_CLK_TCK")

    def process(pid: int, name: str, pgrp: int, utime: int, stime: int) -> None:
        (tmp_path / str(pid)).mkdir()
        fields = ["S", "1", str(pgrp), str(pgrp), "0", "-1", "4194560", "0", "0", "0", "0", str(utime), str(stime)]
        (tmp_path / str(pid) / "stat").write_text(f"{pid} ({name}) {' '.join(fields)} 0 0 20 0 1 0 1 0 0\n")

    process(10, "tritonserver", 10, 3 * ticks, ticks)
    process(11, "triton_python_b", 10, 2 * ticks, 0)
    process(12, "python3 (x) y", 12, 50 * ticks, 0)  # a name with spaces and parentheses
    process(13, "tritonserver", 13, 7 * ticks, 0)  # another server
    (tmp_path / "self").mkdir()
    assert server_cpu_s(10, proc=tmp_path) == 6.0
    assert server_cpu_s(12, proc=tmp_path) == 50.0
    assert server_cpu_s(proc=tmp_path) == 13.0  # by name: every server this /proc shows
    assert server_cpu_s(99, proc=tmp_path) is None
    assert server_cpu_s(proc=tmp_path / "absent") is None
    assert (server_cpu_s(os.getpgrp()) or 0.0) > 0.0  # this test's own process group, from the real /proc


def test_metric_sums_read_every_label_set() -> None:
    text = ('# HELP nv_inference_request_success x\nnv_inference_request_success{model="a"} 3\n'
            'nv_inference_request_success{model="b"} 4.5\nnv_inference_request_success_total 99\n')
    assert metric_sum(text, "nv_inference_request_success") == 7.5


def _tritonserver_pid(http: str) -> int:
    pids = tritonserver_pids(int(http.rsplit(":", 1)[1]))
    assert pids, f"no tritonserver serving {http}"
    return pids[0]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_stopped_tritonserver_is_found_hung_and_restarted(repository: Path, tmp_path: Path) -> None:
    """SIGSTOP: every request times out, the metrics too. serve's canary (every second, 2 s per request,
    two misses in a row) finds it hung and restarts it."""
    process, http = serve(repository, tmp_path, "--restart", "--canary-interval-s", "1", "--canary-timeout-s", "2")
    try:
        pid = _tritonserver_pid(http)
        t0 = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        assert not answers(http)
        deadline = t0 + 90
        while not answers(http):
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-3000:]
            time.sleep(0.2)
        back = round(time.monotonic() - t0, 2)
        assert _tritonserver_pid(http) != pid
        logged(tmp_path / "serve.log", "the server is hung", "ready again")  # before stop() cuts it short
    finally:
        with_pid: Any = locals().get("pid")
        if with_pid:
            try:
                os.kill(with_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        stop(process)
    log = (tmp_path / "serve.log").read_text()
    assert "the server is hung" in log and "ready again" in log
    REPORT.mkdir(parents=True, exist_ok=True)
    (REPORT / "hang.json").write_text(json.dumps({"sigstopped_tritonserver_answers_again_after_s": back,
                                                  "canary_interval_s": 1, "canary_timeout_s": 2}, indent=2))
    print(f"\nSIGSTOPped tritonserver: answering again after {back} s")
    assert back < 45


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_sigkilled_serve_takes_its_tritonserver_along(repository: Path, tmp_path: Path) -> None:
    """No handler sees a SIGKILL: the kernel kills tritonserver with its parent (PR_SET_PDEATHSIG). Before,
    the orphan kept serving and held the ports."""
    process, http = serve(repository, tmp_path)
    pid = _tritonserver_pid(http)
    process.kill()
    process.wait(timeout=30)
    deadline = time.monotonic() + 20
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        try:
            if (Path(f"/proc/{pid}") / "stat").read_text().split(") ", 1)[1].startswith("Z"):
                break  # a zombie waiting for its (new) parent to reap it: dead
        except OSError:
            break
        time.sleep(0.2)
    alive = Path(f"/proc/{pid}").exists() and not (Path(f"/proc/{pid}") / "stat").read_text().split(") ", 1)[1].startswith("Z")
    if alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, "tritonserver outlived a SIGKILLed serve"


@pytest.mark.timeout(60)
def test_a_check_ends_by_its_deadline_and_never_cuts_a_verdict_short(stand_in: tuple[str, type[StandIn]]) -> None:
    """Three requests per model, each given --timeout-s: three silent models took 3 x (3 + metrics) s,
    past the kubelet's probe timeout, which counts as a failure. With --deadline-s a model after the first
    is asked only while its worst case fits, the others are busy; no request is cut short, so a hang (or a
    dead stub's 500, after its 1 s check) is still told whatever the deadline."""
    url, handler = stand_in
    handler.successes, handler.pending = [0.0], 0.0  # idle: a silent model is busy, not hung
    started = time.monotonic()
    problems = Canary(url, ["m", "m2", "m3"], timeout_s=1.0, metrics_url=f"{url}/metrics", deadline_s=5.5).check()
    took = time.monotonic() - started
    assert 1.9 < took < 3.0, took  # m and m2 timed out (1 s each); 3.5 s left < 4 timeouts: m3 not asked
    assert [p.model for p in problems] == ["m", "m2", "m3"] and not any(p.fatal for p in problems), problems
    assert "timed out" in problems[1].message and "(--deadline-s) would not hold" in problems[2].message, problems
    handler.pending = 1.0  # requests pending, none answered: hung, even past a deadline the check outlasts
    (problem, *rest) = Canary(url, ["m", "m2"], timeout_s=0.5, metrics_url=f"{url}/metrics", deadline_s=0.1).check()
    assert problem.fatal and "the server is hung" in problem.message, problem
    assert [p.message for p in rest] == ["not probed: the server is hung"]
