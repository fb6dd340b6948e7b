"""A Locust run that outlives its budget: the runner asks it for its stacks, kills it, and keeps the
report when the gates had already written it. Real processes that import the real locustfile (its
signal handlers); what hangs is a sleep standing in for a stuck shutdown."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tritonbundle.errors import TritonBundleError
from tritonbundle.loadtests import runner
from tritonbundle.loadtests.recorder import Recorder
from tritonbundle.loadtests.report import evaluate_gates, finite, summarize
from tritonbundle.loadtests.settings import LoadSettings

#: Imports the locustfile as Locust does (gevent's patches first), then never exits.
HANG = """
import time
from gevent import monkey
monkey.patch_all()
import tritonbundle.loadtests.locustfile
print("started", flush=True)
time.sleep(600)
"""


def _settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LoadSettings:
    monkeypatch.setattr(runner, "locust_command", lambda settings: [sys.executable, "-c", HANG])
    monkeypatch.setattr(runner, "STARTUP_GRACE_S", 0.0)
    monkeypatch.setattr(runner, "SHUTDOWN_GRACE_S", 1.0)  # killed before or after its handlers: either way
    return LoadSettings(duration_s=1, timeout_s=1, report_dir=str(tmp_path))


@pytest.mark.timeout(60)
def test_a_run_that_does_not_stop_is_killed_with_its_stacks_in_the_log(tmp_path: Path) -> None:
    log = tmp_path / "locust.log"
    code, output, hung = runner._run_locust([sys.executable, "-c", HANG], {}, 6.0, log)
    assert hung and code != 0
    assert "started" in output
    assert "most recent call first" in output  # faulthandler: every thread's stack
    assert "Greenlets" in output  # gevent's run info: every greenlet
    assert log.read_text() == output


@pytest.mark.timeout(60)
def test_a_hung_run_without_a_summary_is_an_error_naming_its_log(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _settings(tmp_path, monkeypatch)
    with pytest.raises(TritonBundleError, match=r"did not stop within 3 s and wrote no summary.*locust\.log"):
        runner.run(settings)


@pytest.mark.timeout(60)
def test_a_run_that_hangs_after_its_gates_keeps_their_report(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _settings(tmp_path, monkeypatch)
    recorder = Recorder()
    recorder.begin(1.0)
    recorder.add("grpc", "auto", 5.0, True, sent_at=1.0)
    recorder.end()
    summary = summarize(recorder, settings, [])
    summary["gates"] = evaluate_gates(summary, settings.slo)  # what the gates write before Locust exits
    (tmp_path / "summary.json").write_text(json.dumps(finite(summary)))
    result = runner.run(settings)
    assert result.exit_code == 0
    assert result.summary["total"]["requests"] == 1
    assert (tmp_path / "report.html").exists()


#: Stops on SIGTERM as Locust's handler does: says so and exits 0.
POLITE = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (print("terminated", flush=True), sys.exit(0)))
print("started", flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(60)
def test_a_run_asked_to_stop_is_sent_sigterm_once_and_not_counted_hung(tmp_path: Path) -> None:
    import threading
    import time

    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    t0 = time.monotonic()
    code, output, hung = runner._run_locust([sys.executable, "-c", POLITE], {}, 30.0, tmp_path / "locust.log", stop)
    assert (code, hung) == (0, False) and output.split() == ["started", "terminated"]
    assert time.monotonic() - t0 < 10, "it stopped when asked, not at its 30-s budget"


#: Writes its summary (as the gates do), then hangs as Locust did at exit in a CI run (a gRPC channel
#: closed from a client's __del__ under gevent).
WRITES_THEN_HANGS = """
import sys, time
open(sys.argv[1], "w").write("{}")
print("written", flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(60)
def test_a_run_that_hangs_after_writing_its_summary_is_killed_after_the_exit_grace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setattr(runner, "EXIT_GRACE_S", 1.0)
    summary = tmp_path / "summary.json"
    t0 = time.monotonic()
    code, output, hung = runner._run_locust([sys.executable, "-c", WRITES_THEN_HANGS, str(summary)], {}, 300.0,
                                            tmp_path / "locust.log", summary=summary)
    assert hung and "written" in output
    assert time.monotonic() - t0 < 20, "killed a grace after the summary, not at its 300-s budget"


@pytest.mark.timeout(60)
def test_a_summary_older_than_the_run_does_not_shorten_its_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import time

    monkeypatch.setattr(runner, "EXIT_GRACE_S", 0.5)
    summary = tmp_path / "summary.json"
    summary.write_text("{}")
    os.utime(summary, (time.time() - 60, time.time() - 60))  # a previous run's
    code, output, hung = runner._run_locust([sys.executable, "-c", "import time; time.sleep(3); print('done')"], {},
                                            30.0, tmp_path / "locust.log", summary=summary)
    assert (code, hung) == (0, False) and output.strip() == "done"
