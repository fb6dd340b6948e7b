"""A system that dies or hangs during a load level fails its phase with the reason, instead of every
later level reading "0 answered" with status ok (seen on the H200 at 3.5x capacity)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tritonbundle.bench.options import BenchOptions, Clock
from tritonbundle.bench.phase import Context, sweep
from tritonbundle.measure.latency import step_result
from tritonbundle.measure.levels import Probes, SystemDown
from tritonbundle.server import ServerOptions, TritonServer
from tritonbundle.traffic import synthetic


class Pool:
    """Answers every level within 5 ms; records the rates asked."""

    def __init__(self) -> None:
        self.rates: list[float] = []

    def step(self, rate: float, **_: Any) -> Any:
        self.rates.append(rate)
        return step_result(rate, 1.0, [5.0] * int(rate), 0, sent=int(rate))


def test_a_system_that_goes_down_fails_the_phase_naming_the_crash(tmp_path: Path) -> None:
    options = BenchOptions(out=tmp_path, slo_ms=50.0, ladder_start=10, ladder_factor=2, refine=0, max_rate=1000)
    ctx = Context(options=options, clock=Clock(60), work=tmp_path, logs=tmp_path, traffic_path=tmp_path / "t.jsonl",
                  sample=synthetic("chat", n=10), tokenizer=tmp_path / "tok.json", gpu=None, save=lambda: None)
    pool = Pool()
    downs = iter(["", "", "tritonserver exited with code -11: Signal (11) received."])
    with pytest.raises(SystemDown, match=r"bundle went down during the level at 40.0 req/s .*Signal \(11\) received"):
        sweep(ctx, pool, time.monotonic() + 60, "bundle", Probes(down=lambda: next(downs)))  # type: ignore[arg-type]
    assert pool.rates == [10, 20, 40], "no level is measured after the server went down"


def test_the_crash_line_comes_from_this_start_of_the_log(tmp_path: Path) -> None:
    log = tmp_path / "tritonserver.log"
    server = TritonServer(ServerOptions(tmp_path, log_path=log, unrestricted=True))
    log.write_text("I1201 started\nE1201 interceptor_common.h:239] ASSERTION FAILED: ops_\nSignal (6) received.\n")
    assert server.crash_line().endswith("ASSERTION FAILED: ops_")
