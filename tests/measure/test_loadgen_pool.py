"""The load generators' pool keeps its workers in step: every answer to a command is read before any is
judged, and a worker that does not answer in time has the pool started again. The workers here are
stand-ins speaking the pool's line protocol (the real ones need a server: test_loadgen.py)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tritonbundle.measure.loadgen import LoadError, LoadPool

#: Answers every setup: an error for model "bad" (worker 0 at once, worker 1 after 0.3 s), else ok; a
#: model "slow" keeps worker 1 silent for 30 s.
WORKER = """
import json, sys, time
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd["op"] == "quit":
        break
    index = cmd.get("seed", 0) % 1000
    if cmd.get("model") == "bad":
        time.sleep(0.3 * index)
        answer = {"error": f"worker {index}: no model 'bad'"}
    elif cmd.get("model") == "slow" and index == 1:
        time.sleep(30)
        answer = {"ok": True}
    else:
        answer = {"ok": True, "model": cmd.get("model")}
    print(json.dumps(answer), flush=True)
"""


def _pool(tmp_path: Path) -> LoadPool:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    return LoadPool(2, tmp_path, "stand-in", worker=(sys.executable, str(script)))


def _setup(pool: LoadPool, model: str, ready_timeout_s: float = 10.0) -> None:
    pool.setup(kind="grpc", url="127.0.0.1:1", model=model, traffic="-", seed=0, timeout_s=1.0,
               ready_timeout_s=ready_timeout_s)


def test_an_error_from_one_worker_leaves_no_answer_behind_for_the_next_command(tmp_path: Path) -> None:
    """Worker 0's error was raised before worker 1's was read; the next setup then read that stale error
    ("no model 'bad'" for another model), and a step after it read a setup's answer as its result."""
    with _pool(tmp_path) as pool:
        with pytest.raises(LoadError, match="worker 0: no model 'bad'"):
            _setup(pool, "bad")
        _setup(pool, "good")  # its own answers, not the ones left from the failed setup


def test_a_worker_that_does_not_answer_in_time_has_the_pool_started_again(tmp_path: Path) -> None:
    with _pool(tmp_path) as pool:
        before = pool.pids
        start = time.monotonic()
        with pytest.raises(LoadError, match=r"load generator\(s\) \[1\] .* the pool was started again"):
            _setup(pool, "slow", ready_timeout_s=1.0)
        assert time.monotonic() - start < 15 and pool.pids != before and len(pool.pids) == 2
        _setup(pool, "good")  # the late answer of the old worker 1 is gone with it
