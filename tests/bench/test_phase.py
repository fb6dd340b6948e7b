"""A system that dies or hangs during a load level fails that level with the reason, is restarted,
and the search goes on below it; without a way to restart it (or past the restart limit) the phase
fails naming the crash, instead of every later level reading "0 answered" with status ok (seen on
the H200 at 3.5x capacity)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest

from tritonbundle.bench.options import BenchOptions, Clock
from tritonbundle.bench.phase import Context, NoRate, sweep
from tritonbundle.measure.latency import step_result
from tritonbundle.measure.levels import MAX_RESTARTS, Probes, SystemDown, sending_s
from tritonbundle.server import ServerOptions, TritonServer
from tritonbundle.traffic import synthetic


class Pool:
    """Answers every level within 5 ms; records the rates asked."""

    def __init__(self) -> None:
        self.rates: list[float] = []
        self.sending: list[float] = []

    def step(self, rate: float, *, warmup_s: float, window_s: float, **_: Any) -> Any:
        self.rates.append(rate)
        self.sending.append(warmup_s + window_s)
        return step_result(rate, 1.0, [5.0] * int(rate), 0, sent=int(rate))


CRASH = "tritonserver exited with code -11: Signal (11) received."


def _context(tmp_path: Path, refine: int = 0) -> Context:
    options = BenchOptions(out=tmp_path, slo_ms=50.0, ladder_start=10, ladder_factor=2, refine=refine, max_rate=1000)
    return Context(options=options, clock=Clock(60), work=tmp_path, logs=tmp_path, traffic_path=tmp_path / "t.jsonl",
                   sample=synthetic("chat", n=10), tokenizer=tmp_path / "tok.json", gpu=None, save=lambda: None)


def test_a_level_that_crashes_the_system_fails_and_the_search_goes_on_below_it(tmp_path: Path) -> None:
    pool = Pool()
    downs = iter(["", "", CRASH] + [""] * 10)
    restarts: list[float] = []

    def restart(timeout_s: float) -> float:
        assert 10.0 <= timeout_s <= 60.0, "the restart gets the time the search has left"
        restarts.append(time.monotonic())
        return 1.5

    result = sweep(_context(tmp_path, refine=2), pool, time.monotonic() + 60, "bundle",  # type: ignore[arg-type]
                   Probes(down=lambda: next(downs), restart=restart))
    assert len(restarts) == 1
    crashed = result.steps[2]
    assert crashed.offered_rps == 40 and not crashed.passed and crashed.reason.startswith("the system went down: " + CRASH)
    assert crashed.extra["restart_s"] == 1.5
    assert pool.rates[:3] == [10, 20, 40] and len(pool.rates) == 5 and all(20 < r < 40 for r in pool.rates[3:]), \
        "the bisection goes on between the last pass and the crash"
    assert result.best is not None and result.best.offered_rps > 20


def test_each_level_records_how_long_it_sent_for_the_gpus_time_per_row(tmp_path: Path) -> None:
    """The encoder's counters cover the warm-up and the window; the GPU's utilisation is sampled over the
    window: the busy time per row is the utilisation over the span the level sent in. Reports from
    before it was recorded assume the timing rule's warm-up."""
    pool = Pool()
    result = sweep(_context(tmp_path), pool, time.monotonic() + 60, "bundle", Probes())  # type: ignore[arg-type]
    assert result.steps and [sending_s(s) for s in result.steps] == pool.sending
    assert all(s.extra["sending_s"] == spent for s, spent in zip(result.steps, pool.sending))
    older = step_result(14201.9, 3.1174, [30.0] * 10, 0)  # the fifth H100's texts-1 knee: 0.78 s of warm-up
    assert sending_s(older) == pytest.approx(0.25 * 3.1174 + 3.1174)


def test_a_system_that_keeps_going_down_fails_the_phase_after_the_restart_limit(tmp_path: Path) -> None:
    pool = Pool()
    restarts: list[int] = []
    with pytest.raises(SystemDown, match=rf"restarted {MAX_RESTARTS} times already"):
        sweep(_context(tmp_path, refine=5), pool, time.monotonic() + 60, "bundle",  # type: ignore[arg-type]
              Probes(down=lambda: CRASH, restart=lambda _s: restarts.append(1) or 1.0))
    assert len(restarts) == MAX_RESTARTS and len(pool.rates) == MAX_RESTARTS + 1


def test_a_system_that_goes_down_fails_the_phase_naming_the_crash(tmp_path: Path) -> None:
    ctx = _context(tmp_path)
    pool = Pool()
    downs = iter(["", "", CRASH])
    with pytest.raises(SystemDown, match=r"bundle went down during the level at 40.0 req/s .*Signal \(11\) received") as e:
        sweep(ctx, pool, time.monotonic() + 60, "bundle", Probes(down=lambda: next(downs)))  # type: ignore[arg-type]
    assert pool.rates == [10, 20, 40], "no level is measured after the server went down"
    # what the search found before is kept (it was thrown away): the levels, the crashed one failed
    found = e.value.sweep
    assert [(s.offered_rps, s.passed) for s in found.steps] == [(10, True), (20, True), (40, False)]
    assert found.best_rps == 20 and found.stopped == "system down" and "Signal (11)" in found.steps[-1].extra["down"]


def test_the_crash_line_comes_from_this_start_of_the_log(tmp_path: Path) -> None:
    log = tmp_path / "tritonserver.log"
    server = TritonServer(ServerOptions(tmp_path, log_path=log, unrestricted=True))
    log.write_text("I1201 started\nE1201 interceptor_common.h:239] ASSERTION FAILED: ops_\nSignal (6) received.\n")
    assert server.crash_line().endswith("ASSERTION FAILED: ops_")


def test_a_system_named_in_start_rates_climbs_its_ladder_from_there(tmp_path: Path) -> None:
    ctx = _context(tmp_path)
    ctx.options.start_rates = {"peer": 100.0}
    peer, bundle = Pool(), Pool()
    sweep(ctx, peer, time.monotonic() + 60, "peer", Probes())  # type: ignore[arg-type]
    sweep(ctx, bundle, time.monotonic() + 60, "bundle", Probes())  # type: ignore[arg-type]
    assert peer.rates[0] == 100 and bundle.rates[0] == 10


def test_a_phase_whose_start_up_took_its_time_fails_naming_the_budget(tmp_path: Path) -> None:
    """On the H200 a 45 s run spent 22 s starting tritonserver; its phase measured no level and reported "ok"
    with no rate. It fails instead, says what to change, and carries the empty search."""
    pool = Pool()
    with pytest.raises(NoRate, match=r"bundle: no load level was measured: 0 s of the phase were left after "
                                              r"the system started, .*give the run more --budget-s") as caught:
        sweep(_context(tmp_path), pool, time.monotonic() - 1.0, "bundle", Probes())  # type: ignore[arg-type]
    assert pool.rates == [] and caught.value.sweep.steps == [] and caught.value.sweep.stopped == "time budget"


def test_a_ladder_that_starts_above_its_maximum_fails_naming_both_rates(tmp_path: Path) -> None:
    context = _context(tmp_path)
    context.options = dataclasses.replace(context.options, max_rate=5)
    with pytest.raises(NoRate, match=r"no load level was measured: the first rate, 10 req/s, is above "
                                              r"--max-rate 5"):
        sweep(context, Pool(), time.monotonic() + 60, "peer", Probes())  # type: ignore[arg-type]


class SlowPool(Pool):
    """Answers every level at 80 ms: over the 50 ms SLO at any rate."""

    def step(self, rate: float, *, warmup_s: float, window_s: float, **_: Any) -> Any:
        self.rates.append(rate)
        return step_result(rate, 1.0, [80.0] * int(rate), 0, sent=int(rate))


def test_a_phase_where_no_rate_met_the_slo_fails_and_keeps_its_levels(tmp_path: Path) -> None:
    """It was recorded "ok" with no rate (a "-" beside "ok", exit 0)."""
    with pytest.raises(NoRate, match=r"peer: no rate met the SLO \(missed at the lowest rate\); the lowest level, "
                                     r"1 req/s: p99 80.0 ms > SLO 50 ms") as caught:
        sweep(_context(tmp_path), SlowPool(), time.monotonic() + 60, "peer", Probes())  # type: ignore[arg-type]
    assert [s.offered_rps for s in caught.value.sweep.steps] == [10, 5, 2.5, 1.25]
