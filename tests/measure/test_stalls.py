"""The host-stall probe: a real child process that sleeps 1 ms at a time; a stall is made by stopping it
(SIGSTOP) for a known time, as a hypervisor that takes the machine's cores away would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tritonbundle.measure import stalls
from tritonbundle.measure.stalls import STALL_KEYS, Stall, StallProbe


def _wait_for_beats(probe: StallProbe, n: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(probe.beats) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(probe.beats) >= n, f"the probe said it was alive {len(probe.beats)} times in {timeout_s} s"


@pytest.mark.skipif(sys.platform != "linux", reason="SIGSTOP and CLOCK_MONOTONIC across processes: Linux")
def test_a_process_stopped_for_a_known_time_is_seen_as_a_stall_of_about_that_long() -> None:
    probe = StallProbe(max_s=60).start()
    try:
        assert probe._proc is not None
        _wait_for_beats(probe, 2)
        t0 = time.monotonic()
        os.kill(probe._proc.pid, signal.SIGSTOP)
        time.sleep(0.08)
        os.kill(probe._proc.pid, signal.SIGCONT)
        _wait_for_beats(probe, len(probe.beats) + 3)
        t1 = time.monotonic()
    finally:
        probe.stop()
    seen = probe.window(t0, t1)
    assert seen["host_probe_s"] is not None and seen["host_probe_s"] > 0.5
    assert seen["host_long_stalls"] is not None and seen["host_long_stalls"] >= 1
    # stopped for 80 ms: the wake-up after it is that late (the machine may add a little, never less)
    assert seen["host_stall_max_ms"] is not None and 70.0 <= seen["host_stall_max_ms"] <= 2000.0
    assert probe._proc is not None and probe._proc.poll() is not None  # stop() ended the child


def test_a_window_the_probe_did_not_watch_has_no_figures() -> None:
    probe = StallProbe()
    assert probe.window(0.0, 1e9) == dict.fromkeys(STALL_KEYS)  # never started
    probe.beats = [100.0, 100.5, 101.0]
    assert probe.window(200.0, 204.0) == dict.fromkeys(STALL_KEYS)  # it had died before the window
    assert stalls.describe(probe.window(200.0, 204.0)) == ""


def test_a_window_counts_the_stalls_inside_it_and_the_long_ones_apart() -> None:
    probe = StallProbe()
    probe.beats = [10.0 + 0.5 * i for i in range(20)]  # alive from 10 s to 19.5 s
    probe.stalls = [Stall(9.0, 50.0), Stall(11.0, 2.5), Stall(12.0, 5.0), Stall(13.0, 17.25), Stall(19.9, 80.0)]
    seen = probe.window(10.5, 18.0)
    assert seen == {"host_stalls": 3, "host_long_stalls": 2, "host_stall_max_ms": 17.25, "host_stalled_ms": 24.8,
                    "host_probe_s": 7.5, "host_cpu_wait": None}
    assert stalls.describe(seen) == ("the probe woke 2+ ms late 3 times (2 of them 5+ ms, the longest 17.2 ms, "
                                     "25 ms in all) in 7.5 s; no CPU pressure reading (/proc/pressure/cpu)")
    quiet = probe.window(14.0, 16.0)
    assert quiet["host_stalls"] == 0 and quiet["host_stall_max_ms"] == 0.0
    assert stalls.describe(quiet).startswith("no wake-up of the probe was 2 ms late or more in 2.0 s")
    # a window of 1 s (the bench's levels on a short budget) between two beats is watched whole
    assert probe.window(14.2, 15.2)["host_probe_s"] == 1.0
    assert probe.window(19.0, 21.0)["host_probe_s"] == 0.5  # the probe's last beat came at 19.5 s


def test_the_probe_alone_prints_what_it_saw() -> None:
    out = subprocess.run([sys.executable, "-m", "tritonbundle.measure.stalls", "--seconds", "1.5"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert "the probe woke" in out or "no wake-up of the probe" in out, out


def test_the_probe_runs_from_any_working_directory_and_says_why_when_it_cannot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # not the checkout: the child finds tritonbundle through its PYTHONPATH
    probe = StallProbe(max_s=30).start()
    try:
        _wait_for_beats(probe, 2)
    finally:
        probe.stop()
    assert probe.error == ""
    # an interpreter that cannot run it (as one without the package would fail its import)
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho 'Traceback (most recent call last):' >&2\n"
                      "echo \"ModuleNotFoundError: No module named 'tritonbundle'\" >&2\nexit 1\n")
    python.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(python))
    broken = StallProbe(max_s=30).start()
    assert broken._thread is not None
    broken._thread.join(timeout=30)
    broken.stop()
    assert broken.error == "ModuleNotFoundError: No module named 'tritonbundle'"
    assert broken.window(0.0, 1e12) == dict.fromkeys(STALL_KEYS)


def test_the_cpu_wait_is_the_pressure_counters_growth_between_the_heartbeats_inside_the_window(tmp_path: Path) -> None:
    psi = tmp_path / "cpu"
    psi.write_text("some avg10=0.14 avg60=3.32 avg300=3.47 total=179045508\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    assert stalls.cpu_pressure_us(psi) == 179045508
    psi.write_text("garbage\n")
    assert stalls.cpu_pressure_us(psi) is None and stalls.cpu_pressure_us(tmp_path / "absent") is None
    probe = StallProbe()
    probe.beats = [10.0 + 0.5 * i for i in range(20)]
    # 0.1 s of waiting per 0.5 s from 12 s on (20 %), none before
    probe.pressure = [(t, 0 if t <= 12.0 else int((t - 12.0) * 200_000)) for t in probe.beats]
    assert probe.window(10.2, 11.9)["host_cpu_wait"] == 0.0
    assert probe.window(12.0, 18.0)["host_cpu_wait"] == 0.2
    assert probe.window(12.1, 12.4)["host_cpu_wait"] is None  # no two heartbeats inside: no reading
    assert stalls.describe(probe.window(12.0, 18.0)).endswith("; a task waited for a CPU 20.0 % of the time (/proc/pressure/cpu)")


@pytest.mark.slow  # it takes every core for 2 s: not beside the other unit tests
@pytest.mark.skipif(stalls.cpu_pressure_us() is None, reason="this kernel has no /proc/pressure/cpu")
def test_more_busy_processes_than_cores_read_as_cpu_wait_on_the_real_kernel() -> None:
    """Twice as many spinning processes as cores for 2 s: some task waits for a CPU nearly all the time
    (the reading that tells this machine's own crowding from a hypervisor's, where the probe is late)."""
    probe = StallProbe(max_s=60).start()
    spin = "import time\nend = time.monotonic() + 2.0\nwhile time.monotonic() < end: pass\n"
    try:
        _wait_for_beats(probe, 2)
        busy = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2 * len(os.sched_getaffinity(0)))]
        time.sleep(0.4)  # all of them started and spinning
        t0 = time.monotonic()
        time.sleep(1.2)
        t1 = time.monotonic()
        for b in busy:
            b.wait(timeout=30)
    finally:
        probe.stop()
    wait = probe.window(t0, t1)["host_cpu_wait"]
    assert wait is not None and wait > 0.5, wait
