"""The measured system on the real server: a tritonserver that crashes during a load level is restarted
on the same ports, the level fails naming the crash, and the search goes on (bench and tune alike)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tritonbundle.measure.latency import Slo
from tritonbundle.measure.levels import Ladder, Timing
from tritonbundle.measure.loadgen import LoadPool
from tritonbundle.served import ServedRepository

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

TRAFFIC = Path(__file__).resolve().parents[2] / "build" / "traffic" / "chat.jsonl"


def test_a_server_that_crashes_during_a_level_is_restarted_and_measured_again(repository: Path, tmp_path: Path) -> None:
    with ServedRepository(repository, tmp_path / "served") as served, LoadPool(1, tmp_path, "crash") as pool:
        served.start(timeout_s=180)
        served.connect(pool, model="minilm", traffic=TRAFFIC, seed=0, timeout_s=5.0, ready_timeout_s=120)
        assert served.server.process is not None
        first = served.server.process.pid
        ports = (served.server.options.grpc_port, served.server.options.metrics_port)
        # SIGSEGV as Triton 2.51's gRPC frontend gets it under cancellations: its handler logs
        # "Signal (11) received." and the process exits.
        killer = threading.Timer(1.5, os.kill, (first, signal.SIGSEGV))
        killer.start()
        try:
            result = served.measure(system="bundle", slo=Slo(p99_ms=2000.0, max_failure_ratio=0.5),
                                    timing=Timing(warmup_s=0.5, window_s=2.0, grace_s=2.0),
                                    ladder=Ladder(start=4.0, factor=2.0, refine=0, max_rate=8.0),
                                    deadline=time.monotonic() + 300, seed=0)
        finally:
            killer.cancel()
        assert served.server.process is not None
        second = served.server.process.pid
    crashed = result.steps[0]
    assert not crashed.passed and "went down" in crashed.reason and "-11" in crashed.reason, crashed.reason
    assert crashed.extra["restart_s"] > 0
    assert second != first and (served.server.options.grpc_port, served.server.options.metrics_port) == ports
    later = result.steps[1:]
    assert later and all(s.extra.get("down") is None for s in later)
    assert any(s.passed and s.completed > 0 for s in later), [(s.offered_rps, s.reason) for s in later]
