"""``proc``: a stopped group leaves no process behind, whatever its children do on SIGTERM; the CPUs a process may use."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tritonbundle import proc

# The leader starts a child that ignores SIGTERM (a web server's worker in its own graceful shutdown,
# as the bench's peer's was; it writes its pid once it ignores it), and exits on SIGTERM itself.
_CHILD = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(60)
"""
_LEADER = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
subprocess.Popen([sys.executable, "-c", sys.argv[2], sys.argv[1]])
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent: here init) counts as gone.
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_child_that_outlives_its_leaders_graceful_stop_is_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    leader = proc.start_group([sys.executable, "-c", _LEADER, str(pid_file), _CHILD], log=tmp_path / "leader.log")
    proc.wait_until(pid_file.exists, timeout_s=20, proc=leader,
                    what="the leader's child", interval_s=0.05)
    child = int(pid_file.read_text())
    started = time.monotonic()
    assert proc.stop_group(leader, grace_s=10) == 0  # the leader stopped on SIGTERM, within the grace
    assert time.monotonic() - started < 5
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the child that ignores SIGTERM outlived stop_group"


def test_the_usable_cpus_are_the_affinity_that_taskset_narrows() -> None:
    """``os.cpu_count()`` counts every CPU under ``taskset`` too; what the bench sizes its load generators,
    the host probe and tune's space from must be the CPUs the process may run on."""
    import shutil

    if shutil.which("taskset") is None:
        pytest.skip("no taskset here")
    code = "import os; from tritonbundle import proc; print(len(proc.usable_cpus()), os.cpu_count())"
    out = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[1]).stdout.split()
    assert out == ["1", str(os.cpu_count())]


def test_the_load_generators_are_sized_from_the_usable_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    from tritonbundle.bench.workspace import load_procs

    monkeypatch.setattr(proc, "usable_cpus", lambda: set(range(16)))
    assert load_procs(0) == 7 and load_procs(3) == 3
    monkeypatch.setattr(proc, "usable_cpus", lambda: set(range(6)))
    assert load_procs(0) == 2
