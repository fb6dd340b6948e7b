"""scripts/sharing_gpu_check.py on the CPU (the same loop as on the GPU, eagerly): each process count
measured in turn, every process's calls counted, and a process that cannot start its engine failing the
run by name. Its figures are the script's output on the GPU machine, not asserted here."""

from __future__ import annotations

import importlib.util
import json
import queue
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "sharing_gpu_check.py"


def _run(*args: str) -> tuple[int, list[dict]]:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--precision", "fp32", *args],
                          capture_output=True, text=True, timeout=240, cwd=ROOT, check=False)
    return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_each_process_count_runs_every_process_through_the_window() -> None:
    code, lines = _run("--recipe", "minilm", "--procs", "1,2", "--seconds", "1.5", "--rows", "4", "--calls", "3",
                       "--targets", "32,64,128,512", "--buckets", "1,4")
    assert code == 0, lines
    assert [line["procs"] for line in lines] == [1, 2] and all(line["ok"] for line in lines)
    for line in lines:
        assert len(line["calls"]) == line["procs"] and min(line["calls"]) >= 1
        assert line["rows_per_s"] > 0 and line["rows_per_call"] == 4 and line["graphs"] == 0  # eager on the CPU
        assert line["gpu_util_mean"] is None and line["busy_gpu_ms_per_row"] is None and line["gpu_ms_per_call"] is None
        assert line["alone_gpu_ms_per_row"] is None  # no shape is timed on the CPU
        assert line["launches_per_call"] >= 1 and line["computed_per_useful"] >= 1 and line["mps_servers"] is None


@pytest.mark.timeout(120)
def test_a_process_whose_engine_cannot_start_fails_the_run_by_name(tmp_path: Path) -> None:
    code, lines = _run("--weights", str(tmp_path), "--procs", "2", "--seconds", "1")
    assert code == 1
    (line,) = lines
    assert line["ok"] is False and "config.json" in line["error"] and line["error"].count("FileNotFoundError") == 1


def test_a_process_count_below_one_is_refused() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--procs", "0,2"], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, check=False)
    assert proc.returncode == 2 and "--procs" in proc.stderr


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sharing_gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Process:
    """What the wait reads of a worker process: its exit code (None while it runs)."""

    def __init__(self, exitcode: int | None) -> None:
        self.exitcode = exitcode


def test_a_process_that_dies_without_a_word_ends_the_wait_at_once() -> None:
    """A worker killed before it reports (a crash, the OOM killer) must not hold the run for the whole
    start-up allowance: the wait sees its exit code and says which process ended how."""
    results: queue.Queue[dict] = queue.Queue()
    results.put({"index": 0, "ready": True, "graphs": 0})
    start = time.monotonic()
    got, error = _script()._collect(results, [_Process(None), _Process(-9)], "ready", 2, time.monotonic() + 60)
    assert time.monotonic() - start < 5
    assert list(got) == [0] and error == "process 1 exited with code -9 before it reported"


def test_the_wait_ends_at_its_deadline_and_at_the_first_error() -> None:
    collect = _script()._collect
    got, error = collect(queue.Queue(), [_Process(None)], "calls", 1, time.monotonic() + 1)
    assert got == {} and error == "1 process(es) did not report within the time allowed"
    results: queue.Queue[dict] = queue.Queue()
    results.put({"index": 1, "error": "OutOfMemoryError: CUDA out of memory"})
    got, error = collect(results, [_Process(None), _Process(None)], "calls", 2, time.monotonic() + 60)
    assert error == "process 1: OutOfMemoryError: CUDA out of memory"
