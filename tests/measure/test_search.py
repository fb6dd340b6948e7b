"""The measurement core's rate search against an M/M/1 server model (exact answers known)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from tritonbundle.measure.latency import Slo, StepResult, step_result
from tritonbundle.measure.search import search_rate


def mm1(capacity: float, calls: list[float] | None = None):  # type: ignore[no-untyped-def]
    """An M/M/1 server: p99 of the time in system is ln(100) / (capacity - rate) seconds."""

    def measure(rate: float) -> StepResult:
        if calls is not None:
            calls.append(rate)
        if rate >= capacity:
            return step_result(rate, 1.0, [], failed=int(rate))
        p99_ms = 1000.0 * math.log(100) / (capacity - rate)
        latencies = [p99_ms] * 100
        step = step_result(rate, 1.0, latencies, 0)
        step.achieved_rps = rate  # a perfectly steady answer rate, for exact assertions
        return step

    return measure


def test_search_brackets_then_bisects_to_the_slo_limit() -> None:
    calls: list[float] = []
    capacity, slo = 1000.0, 50.0
    true_limit = capacity - math.log(100) / (slo / 1000.0)  # 907.9 req/s
    sweep = search_rate(mm1(capacity, calls), slo=Slo(p99_ms=slo, max_failure_ratio=0.01), start=50, factor=4, refine=5)
    assert calls[:4] == [50, 200, 800, 3200]
    assert len(calls) == 4 + 5
    assert sweep.stopped == "bracketed" and not sweep.is_floor
    assert sweep.best is not None and sweep.best.passed
    assert true_limit / 4 ** (1 / 2**5) <= sweep.best_rps <= true_limit


@settings(max_examples=60, deadline=None)
@given(capacity=hs.floats(min_value=20, max_value=50_000), start=hs.floats(min_value=1, max_value=100),
       factor=hs.sampled_from([2.0, 3.0, 4.0]), refine=hs.integers(min_value=0, max_value=6))
def test_search_never_reports_a_rate_that_misses_the_slo_and_gets_within_the_bisection_precision(
    capacity: float, start: float, factor: float, refine: int
) -> None:
    slo = 50.0
    limit = capacity - math.log(100) / (slo / 1000.0)
    sweep = search_rate(mm1(capacity), slo=Slo(p99_ms=slo, max_failure_ratio=0.01), start=start, factor=factor, refine=refine)
    if limit < start:
        # Missed at the start: the search steps down (at most 3 times by ``factor``).
        lowest = start / factor**3
        if limit < lowest:
            assert sweep.best is None and sweep.stopped == "missed at the lowest rate"
        else:
            assert sweep.best is not None and sweep.best_rps <= limit * (1 + 1e-9)
            assert sweep.best.offered_rps * factor > limit
        return
    assert sweep.best is not None
    assert sweep.best_rps <= limit * (1 + 1e-9)
    assert sweep.best_rps >= limit / factor ** (1 / 2**refine) * (1 - 1e-9)
    for s in sweep.steps:
        assert s.passed == (s.offered_rps <= limit * (1 + 1e-12))


def test_search_stops_at_the_max_rate_and_on_the_time_budget() -> None:
    sweep = search_rate(mm1(1e9), slo=Slo(p99_ms=50), start=10, factor=10, max_rate=1000)
    assert [s.offered_rps for s in sweep.steps] == [10, 100, 1000]
    assert sweep.stopped == "max rate" and sweep.is_floor
    # A cap between two rungs is the last rung itself: the knee is not left up to a factor above.
    sweep = search_rate(mm1(1e9), slo=Slo(p99_ms=50), start=10, factor=10, max_rate=500)
    assert [s.offered_rps for s in sweep.steps] == [10, 100, 500]
    assert sweep.stopped == "max rate" and sweep.is_floor
    left = iter([True, True, False])
    sweep = search_rate(mm1(1e9), slo=Slo(p99_ms=50), start=10, factor=10, can_continue=lambda: next(left))
    assert len(sweep.steps) == 2 and sweep.stopped == "time budget" and sweep.is_floor


def test_search_checks_its_arguments() -> None:
    with pytest.raises(ValueError):
        search_rate(mm1(100), slo=Slo(p99_ms=50), start=0)
    with pytest.raises(ValueError):
        search_rate(mm1(100), slo=Slo(p99_ms=50), start=1, factor=1)


def test_a_sweep_reads_back_from_its_json() -> None:
    from tritonbundle.measure.latency import step_result
    from tritonbundle.measure.search import Sweep

    steps = [step_result(r, 1.0, [5.0] * int(r), 0) for r in (2.0, 4.0)]
    sweep = Sweep(steps, steps[1], "bracketed")
    back = Sweep.from_json(sweep.to_json())
    assert back.to_json() == sweep.to_json() and back.best_rps == sweep.best_rps
    assert Sweep.from_json(Sweep([], None, "time budget").to_json()).best is None


def _client_bound_above(limit: float, capacity: float):  # type: ignore[no-untyped-def]
    """The M/M/1 server, whose load generators fall behind (3x the limit late) above ``limit`` req/s."""
    server = mm1(capacity)

    def measure(rate: float) -> StepResult:
        step = server(rate)
        step.extra["client_lag_mean_ms"] = 30.0 if rate > limit else 0.1
        return step

    return measure


def test_a_client_bound_level_ends_the_climb_and_leaves_a_floor_not_a_knee() -> None:
    """The clients fell behind above 400 req/s on a server good for 1,000: the search bracketed against
    them and called 400 the server's knee."""
    calls: list[float] = []

    def measure(rate: float) -> StepResult:
        calls.append(rate)
        return _client_bound_above(400, 1000)(rate)  # type: ignore[no-any-return]

    sweep = search_rate(measure, slo=Slo(p99_ms=50.0, max_failure_ratio=0.01), start=100, factor=2, refine=3)
    assert calls == [100, 200, 400, 800], "no bisection against a level that measured the clients"
    assert sweep.stopped == "client-bound" and sweep.best_rps == 400 and sweep.is_floor


def test_a_miss_above_a_client_bound_one_still_brackets() -> None:
    """Client-bound at the start, a real miss below it: the step-down brackets against the real one."""
    sweep = search_rate(_client_bound_above(700, 300), slo=Slo(p99_ms=50.0, max_failure_ratio=0.01), start=800,
                        factor=2, refine=2)
    assert [s.offered_rps for s in sweep.steps][:3] == [800, 400, 200]
    assert sweep.stopped == "bracketed" and not sweep.is_floor and sweep.best_rps is not None
    assert 200 <= sweep.best_rps < 400


def test_a_budget_that_ends_during_the_step_down_says_so() -> None:
    """It said "missed at the lowest rate" after one level, and tune kept the point on --resume."""
    budget = iter([True, False])
    sweep = search_rate(mm1(10), slo=Slo(p99_ms=50.0), start=100, factor=2, can_continue=lambda: next(budget))
    assert len(sweep.steps) == 1 and sweep.stopped == "time budget" and sweep.best is None


def test_a_client_bound_midpoint_ends_the_bisection_without_bounding_the_knee() -> None:
    """The ladder brackets on a real miss (a server good for 1,650 misses p99 at 1,600); the clients fall
    behind above 1,000: the midpoint 1,131 measured them, not the server, so it bounds nothing."""
    sweep = search_rate(_client_bound_above(1000, 1650), slo=Slo(p99_ms=50.0, max_failure_ratio=0.01), start=400,
                        factor=4, refine=3)
    assert [round(s.offered_rps) for s in sweep.steps] == [400, 1600, 800, 1131]
    assert sweep.stopped == "client-bound" and sweep.best_rps == 800
