"""The load generator watches its own event loop: a process whose requests keep the loop busy shows it as
timers woken late (the client's share of a measured tail), one whose requests wait on I/O does not."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tritonbundle.measure.loadgen import _p99_ms, _Worker


def test_the_lateness_p99_is_the_latencies_percentile() -> None:
    """One definition of p99 across the bench (linear between order statistics), so a lateness and the
    latency it is read against compare like for like."""
    assert _p99_ms([]) == 0.0
    assert _p99_ms([0.001] * 99 + [0.5]) == pytest.approx(5.99)  # 1 % of the way from the 99th to the 100th
    assert _p99_ms([0.001] * 98 + [0.5] * 2) == pytest.approx(500.0)
    assert _p99_ms([i / 1000 for i in range(1, 201)]) == pytest.approx(198.01)
    assert _p99_ms([0.007]) == pytest.approx(7.0)


def test_a_step_that_fails_leaves_no_watch_running() -> None:
    worker = _Worker()
    worker.kind = "http"  # an empty pool: drawing a request fails

    async def run() -> list[asyncio.Task[Any]]:
        with pytest.raises(ValueError):
            await worker.step({"rate": 100.0, "warmup_s": 0.0, "window_s": 0.5, "grace_s": 1.0, "seed": 0})
        await asyncio.sleep(0.01)
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]

    assert asyncio.run(run()) == []


def _step(one: Any) -> dict[str, Any]:
    worker = _Worker()
    worker.kind = "http"
    worker.pool = [(1, "text")] * 8
    worker.one = one  # type: ignore[method-assign]
    return asyncio.run(worker.step({"rate": 100.0, "warmup_s": 0.0, "window_s": 0.6, "grace_s": 1.0, "seed": 0}))


def test_a_busy_loop_wakes_its_timers_late_and_an_idle_one_does_not() -> None:
    async def blocks(_request: Any) -> None:
        time.sleep(0.006)  # CPU work in the loop: every other callback waits

    async def waits(_request: Any) -> None:
        await asyncio.sleep(0.006)

    busy, idle = _step(blocks), _step(waits)
    assert busy["sent"] > 20 and idle["sent"] > 20 and not busy["errors"] and not idle["errors"]
    assert busy["loop_lag_p99_ms"] >= 3.0, busy["loop_lag_p99_ms"]
    assert idle["loop_lag_p99_ms"] < busy["loop_lag_p99_ms"]
    assert busy["lag_p99_ms"] >= busy["lag_mean_ms"] >= 0


def test_the_report_shows_the_loops_lateness_and_reads_a_large_one_as_the_clients_share() -> None:
    import dataclasses
    import json
    from pathlib import Path

    from tritonbundle.bench import options as bench_options
    from tritonbundle.bench import report
    from tritonbundle.bench.breakdown import hints
    from tritonbundle.bench.records import BundleResult
    from tritonbundle.bench.result import BenchResult

    path = Path(__file__).resolve().parents[2] / "docs/benchmarks/h200-buckets/minilm-fine-3/bench.json"
    result = BenchResult.from_json(json.loads(path.read_text()))
    bundle = result.models["minilm"].systems["bundle"]
    assert isinstance(bundle, BundleResult) and bundle.breakdown is not None
    assert "event loops" not in report.markdown(result)  # measured since: the committed report has none
    late = dataclasses.replace(bundle.breakdown, client_lag_p99_ms=1.25, client_loop_lag_p99_ms=6.5,
                               client_p99_from_send_ms=12.0)
    result.models["minilm"].systems["bundle"] = dataclasses.replace(bundle, breakdown=late)
    assert "load generators late by 0.47 ms (p99 1.25); their event loops woke timers 6.50 ms late at p99; " \
        "p99 from each send 12.00 ms" in report.markdown(result)
    assert BundleResult.from_json(result.models["minilm"].systems["bundle"].to_json()) \
        .breakdown.client_p99_from_send_ms == 12.0  # type: ignore[union-attr]
    options = bench_options.BenchOptions(out=Path("."))
    assert any("event loops woke 6.5 ms late at p99" in h for h in hints(late, options))  # p99 latency 30.5 ms
    calm = dataclasses.replace(late, client_loop_lag_p99_ms=0.4)
    assert not [h for h in hints(calm, options) if "event loops" in h]
    # an idle loop's lateness (under 2 ms) is not read as the client's share, even beside a short p99
    short = dataclasses.replace(late, client_loop_lag_p99_ms=1.5, client_p99_ms=8.0)
    assert not [h for h in hints(short, options) if "event loops" in h]


def test_the_tail_from_each_send_leaves_out_the_load_generators_own_stall() -> None:
    """A stall of the load generator's loop (80 ms, once) makes the requests scheduled inside it late: their
    latency from the schedule holds the stall, from their send it does not (what the server took). On a
    second H100 knees moved 2x between rounds at levels whose sends were 11-25 ms late at p99: this is how
    the bench tells the clients' tail from the server's."""
    async def answers(_request: Any) -> None:
        await asyncio.sleep(0.001)

    async def run() -> dict[str, Any]:
        worker = _Worker()
        worker.kind = "http"
        worker.pool = [(1, "text")] * 8
        worker.one = answers  # type: ignore[method-assign]
        asyncio.get_running_loop().call_later(0.3, time.sleep, 0.08)
        return await worker.step({"rate": 400.0, "warmup_s": 0.0, "window_s": 1.0, "grace_s": 1.0, "seed": 0})

    step = asyncio.run(run())
    from_schedule = _p99_ms([x / 1000 for x in step["latencies_ms"]])
    from_send = _p99_ms([x / 1000 for x in step["from_send_ms"]])
    assert step["sent"] > 300 and not step["errors"] and len(step["from_send_ms"]) == len(step["latencies_ms"])
    assert step["lag_max_ms"] >= 60 and from_schedule >= 40, (step["lag_max_ms"], from_schedule)
    assert from_send < from_schedule / 2, (from_send, from_schedule)
    # a send up to 0.5 ms early (the schedule's sleep threshold) is the only way the send comes first
    assert all(s <= d + 0.51 for s, d in zip(step["from_send_ms"], step["latencies_ms"], strict=True))
