"""A Locust run that outlives its budget: the runner asks it for its stacks, kills it, and keeps the
report when the gates had already written it. Real processes that import the real locustfile (its
signal handlers); what hangs is a sleep standing in for a stuck shutdown."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
import time
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


def _passing_summary(settings: LoadSettings) -> str:
    """A summary.json as the gates write it, of one answered gRPC request."""
    recorder = Recorder()
    recorder.begin(1.0)
    recorder.add("grpc", "auto", 5.0, True, sent_at=1.0)
    recorder.end()
    summary = summarize(recorder, dataclasses.replace(settings, http_url=None), [])
    summary["gates"] = evaluate_gates(summary, settings.slo)
    return json.dumps(finite(summary))


#: Writes the summary (argv[2], from the file argv[1]) as the gates do, then never exits.
GATES_THEN_HANG = """
import shutil, sys, time
shutil.copy(sys.argv[1], sys.argv[2])
print("gates ran", flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(60)
def test_a_run_that_hangs_after_its_gates_keeps_their_report(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _settings(tmp_path / "report", monkeypatch)
    (tmp_path / "gates.json").write_text(_passing_summary(settings))
    monkeypatch.setattr(runner, "locust_command", lambda s: [sys.executable, "-c", GATES_THEN_HANG,
                                                             str(tmp_path / "gates.json"), f"{s.report_dir}/summary.json"])
    result = runner.run(settings)
    assert result.exit_code == 0
    assert result.summary["total"]["requests"] == 1
    assert (tmp_path / "report" / "report.html").exists()


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


#: Fails as Locust does when the locustfile cannot load (a traffic sample that does not exist).
FAILS_TO_START = """
import sys
print("tritonbundle.errors.ConfigError: traffic sample /nonexistent.jsonl does not exist", flush=True)
sys.exit(1)
"""


@pytest.mark.timeout(60)
def test_a_run_that_writes_no_summary_fails_instead_of_reporting_the_previous_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _settings(tmp_path, monkeypatch)
    previous = ("summary.json", "report.html", "timeline.csv", "latency.png", "locust_stats.csv")
    (tmp_path / "summary.json").write_text(_passing_summary(settings))  # a passing run into the same --out
    for name in previous[1:]:
        (tmp_path / name).write_text("previous run")
    (tmp_path / "notes.txt").write_text("the user's")
    monkeypatch.setattr(runner, "locust_command", lambda s: [sys.executable, "-c", FAILS_TO_START])
    with pytest.raises(TritonBundleError, match=r"exited with code 1 and wrote no summary:\n.*traffic sample"):
        runner.run(settings)
    assert not any((tmp_path / name).exists() for name in previous), "a previous run's outputs are not this run's"
    assert (tmp_path / "notes.txt").exists(), "only the files a run writes are removed"


#: Stops on SIGTERM as Locust does with the locustfile's gates: writes its summary, then exits.
GATES_ON_SIGTERM = """
import shutil, signal, sys, time
def stop(*_):
    shutil.copy(sys.argv[1], sys.argv[2])
    print("terminated", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("started", flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_command_stops_locust_and_waits_for_its_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signum: int) -> None:
    settings = dataclasses.replace(_settings(tmp_path / "report", monkeypatch), duration_s=300)
    (tmp_path / "gates.json").write_text(_passing_summary(settings))
    monkeypatch.setattr(runner, "locust_command", lambda s: [sys.executable, "-c", GATES_ON_SIGTERM,
                                                             str(tmp_path / "gates.json"), f"{s.report_dir}/summary.json"])
    before = signal.getsignal(signum)
    t0 = time.monotonic()
    with runner.stop_on_signals() as stop:
        threading.Timer(1.5, os.kill, (os.getpid(), signum)).start()  # as `kill` or Ctrl-C would, mid-run
        result = runner.run(settings, stop)
    assert time.monotonic() - t0 < 20, "it stopped at the signal, not at its 300-s window"
    assert result.stopped and stop.signum == signum and stop.exit_code == 128 + signum
    assert result.summary["total"]["requests"] == 1  # the report Locust wrote as it stopped
    assert (tmp_path / "report" / "locust.log").read_text().split() == ["started", "terminated"]
    assert signal.getsignal(signum) is before, "the previous handler is back"


@pytest.mark.timeout(60)
def test_a_locust_that_ignores_the_stop_is_killed_after_the_stop_grace(tmp_path: Path) -> None:
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    ignores = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('started', flush=True); " \
              "time.sleep(600)"
    t0 = time.monotonic()
    code, output, hung = runner._run_locust([sys.executable, "-c", ignores], {}, 300.0, tmp_path / "locust.log",
                                            stop, stop_grace_s=1.0)
    assert hung and code != 0 and "started" in output
    assert time.monotonic() - t0 < 15, "killed a grace after the stop, not at its 300-s budget"
