"""The benchmark's bookkeeping: percentiles, SLO checks, the rate search, ratios, padding, ceiling."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from tritonbundle.bench import stats as st


def test_percentile_matches_numpy_on_finite_values() -> None:
    rng = np.random.default_rng(0)
    values = rng.lognormal(size=1001)
    for q in (0, 1, 50, 90, 99, 99.9, 100):
        assert st.percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_is_infinite_once_it_reaches_the_failures() -> None:
    values = [1.0] * 98 + [math.inf] * 2
    assert st.percentile(values, 50) == 1.0
    assert math.isinf(st.percentile(values, 99))


def test_percentile_of_nothing_is_nan_and_q_is_checked() -> None:
    assert math.isnan(st.percentile([], 50))
    with pytest.raises(ValueError):
        st.percentile([1.0], 101)


def test_latency_summary_counts_failures_as_infinite_latencies() -> None:
    ok = list(np.linspace(1, 10, 990))
    assert math.isfinite(st.latency_summary(ok, failures=0)["p99_ms"])
    summary = st.latency_summary(ok, failures=20)
    assert math.isinf(summary["p99_ms"])
    assert summary["mean_ms"] == pytest.approx(5.5)


def test_a_step_passes_only_within_the_slo_and_the_error_budget() -> None:
    good = st.step_result(100, 2.0, [10.0] * 200, 0)
    assert st.judge(good, 50).passed
    assert good.achieved_rps == pytest.approx(100)
    slow = st.judge(st.step_result(100, 2.0, [10.0] * 190 + [80.0] * 10, 0), 50)
    assert not slow.passed and "p99" in slow.reason
    failing = st.judge(st.step_result(100, 2.0, [10.0] * 190, 10), 50)
    assert not failing.passed and "failed" in failing.reason


def test_unanswered_requests_count_as_failures() -> None:
    step = st.step_result(10, 1.0, [5.0] * 8, failed=0, sent=10)
    assert step.failed == 2
    assert math.isinf(step.p99_ms)


def mm1(capacity: float, calls: list[float] | None = None):  # type: ignore[no-untyped-def]
    """An M/M/1 server: p99 of the time in system is ln(100) / (capacity - rate) seconds."""

    def measure(rate: float) -> st.StepResult:
        if calls is not None:
            calls.append(rate)
        if rate >= capacity:
            return st.step_result(rate, 1.0, [], failed=int(rate))
        p99_ms = 1000.0 * math.log(100) / (capacity - rate)
        latencies = [p99_ms] * 100
        step = st.step_result(rate, 1.0, latencies, 0)
        step.achieved_rps = rate  # a perfectly steady answer rate, for exact assertions
        return step

    return measure


def test_search_brackets_then_bisects_to_the_slo_limit() -> None:
    calls: list[float] = []
    capacity, slo = 1000.0, 50.0
    true_limit = capacity - math.log(100) / (slo / 1000.0)  # 907.9 req/s
    sweep = st.search_rate(mm1(capacity, calls), slo_ms=slo, start=50, factor=4, refine=5)
    assert calls[:4] == [50, 200, 800, 3200]
    assert len(calls) == 4 + 5
    assert sweep.stopped == "bracketed"
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
    sweep = st.search_rate(mm1(capacity), slo_ms=slo, start=start, factor=factor, refine=refine)
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
    sweep = st.search_rate(mm1(1e9), slo_ms=50, start=10, factor=10, max_rate=1000)
    assert [s.offered_rps for s in sweep.steps] == [10, 100, 1000]
    assert sweep.stopped == "max rate"
    left = iter([True, True, False])
    sweep = st.search_rate(mm1(1e9), slo_ms=50, start=10, factor=10, can_continue=lambda: next(left))
    assert len(sweep.steps) == 2 and sweep.stopped == "time budget"


def test_search_checks_its_arguments() -> None:
    with pytest.raises(ValueError):
        st.search_rate(mm1(100), slo_ms=50, start=0)
    with pytest.raises(ValueError):
        st.search_rate(mm1(100), slo_ms=50, start=1, factor=1)


def test_ratio_is_none_when_a_side_is_missing_or_zero() -> None:
    assert st.ratio(900, 100) == pytest.approx(9)
    assert st.ratio(None, 100) is None
    assert st.ratio(900, None) is None
    assert st.ratio(900, 0) is None
    assert st.ratio(math.inf, 10) is None


def test_padding_accounting_pads_each_row_to_its_target() -> None:
    lengths = [3, 10, 11, 64, 65, 512]
    result = st.padding_accounting(lengths, [10, 64, 512])
    assert result["useful_tokens"] == sum(lengths)
    assert result["padded_tokens"] == 10 + 10 + 64 + 64 + 512 + 512
    assert result["computed_per_useful"] == pytest.approx((10 + 10 + 64 + 64 + 512 + 512) / sum(lengths))
    assert st.bucket_shares(lengths, [10, 64, 512]) == {10: 2 / 6, 64: 2 / 6, 512: 2 / 6}
    with pytest.raises(ValueError):
        st.bucket_shares([600], [512])


def test_padding_accounting_agrees_with_the_planner() -> None:
    from tritonbundle import traffic
    from tritonbundle.build import planner

    rows = traffic.synthetic("chat", n=3000, seed=1).clipped(512).row_lengths()
    edges = planner.choose_edges(rows, 8, 512)
    expected = planner.waste(rows, edges, 512, [1]).bucketed
    assert st.padding_accounting(rows, edges)["computed_per_useful"] == pytest.approx(expected)


def test_tokens_ratio_reads_the_encoders_counters() -> None:
    r = st.tokens_ratio({"useful_tokens": 100, "seq_tokens": 110, "computed_tokens": 125})
    assert r["seq_padded_per_useful"] == pytest.approx(1.10)
    assert r["computed_per_useful"] == pytest.approx(1.25)
    assert st.tokens_ratio({})["computed_per_useful"] is None


def test_ceiling_weights_each_target_by_its_share_and_respects_the_slo() -> None:
    def t(b: int, s: int) -> float:  # 0.1 ms per launch + 1 us per token
        return 1e-4 + 1e-6 * b * s

    timings = {(b, s): t(b, s) for b in (1, 8, 64, 512) for s in (32, 128)}
    shares = {32: 0.75, 128: 0.25}
    result = st.ceiling(timings, shares, mean_tokens=40.0, slo_s=0.05)
    rows = {r["batch"]: r for r in result["per_batch"]}
    per_row_8 = 0.75 * t(8, 32) / 8 + 0.25 * t(8, 128) / 8
    assert rows[8]["requests_per_s"] == pytest.approx(1 / per_row_8)
    assert rows[8]["useful_tokens_per_s"] == pytest.approx(40.0 / per_row_8)
    assert rows[8]["computed_tokens_per_s"] == pytest.approx((0.75 * 32 + 0.25 * 128) / per_row_8)
    assert rows[512]["worst_batch_ms"] == pytest.approx(t(512, 128) * 1000)
    assert not rows[512]["feasible"]  # 65.6 ms > 50 ms
    assert result["best"]["batch"] == 64
    assert result["best_rps"] == pytest.approx(rows[64]["requests_per_s"])


def test_ceiling_without_a_feasible_batch_has_no_best() -> None:
    result = st.ceiling({(1, 512): 1.0}, {512: 1.0}, 100.0, slo_s=0.05)
    assert result["best"] is None and result["best_rps"] is None
