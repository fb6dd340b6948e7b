"""The measurement core's latency bookkeeping: one percentile convention, load levels, the SLO gate."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tritonbundle.measure import latency as st
from tritonbundle.measure.latency import Slo


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
    assert st.judge(good, Slo(p99_ms=50, max_failure_ratio=0.01)).passed
    assert good.achieved_rps == pytest.approx(100)
    slow = st.judge(st.step_result(100, 2.0, [10.0] * 190 + [80.0] * 10, 0), Slo(p99_ms=50, max_failure_ratio=0.01))
    assert not slow.passed and "p99" in slow.reason
    failing = st.judge(st.step_result(100, 2.0, [10.0] * 190, 10), Slo(p99_ms=50, max_failure_ratio=0.01))
    assert not failing.passed and "failure ratio 0.050 > 0.01" in failing.reason


def test_unanswered_requests_count_as_failures() -> None:
    step = st.step_result(10, 1.0, [5.0] * 8, failed=0, sent=10)
    assert step.failed == 2
    assert math.isinf(step.p99_ms)




def test_the_slo_gate_names_every_broken_bound() -> None:
    slo = Slo(p95_ms=100, p99_ms=250, max_failure_ratio=0.01)
    summary = {"p95_ms": 120.0, "p99_ms": math.inf}
    problems = slo.violations(summary, sent=100, failed=2, label="http")
    assert problems == ["http: failure ratio 0.020 > 0.01", "http: p95 120.0 ms > SLO 100 ms", "http: p99 inf ms > SLO 250 ms"]
    assert slo.violations({"p95_ms": 50.0, "p99_ms": 90.0}, sent=100, failed=0) == []
    assert slo.violations({}, sent=0, failed=0) == ["no requests were sent"]


def test_a_level_whose_clients_fell_behind_is_client_bound_and_not_counted() -> None:
    step = st.step_result(100, 2.0, [10.0] * 200, 0, extra={"client_lag_mean_ms": 7.5})
    judged = st.judge(step, Slo(p99_ms=50))
    assert not judged.passed and judged.extra["client_bound"]
    assert "client-bound: the load generators sent 7.5 ms late" in judged.reason
    assert st.judge(st.step_result(100, 2.0, [10.0] * 200, 0, extra={"client_lag_mean_ms": 0.4}), Slo(p99_ms=50)).passed


def test_scheduling_jitter_well_under_the_slo_is_not_client_bound() -> None:
    """A fixed 2 ms limit rejected every level of an H200 tune at 0.5-4 req/s (3.4 ms late, p99 8-13 ms,
    SLO 50 ms): the limit is a tenth of the objective when that is more."""
    late = st.step_result(4, 2.0, [10.0] * 8, 0, extra={"client_lag_mean_ms": 3.4})
    assert st.judge(late, Slo(p99_ms=50)).passed
    assert not st.judge(late, Slo(p99_ms=10)).passed  # against a 10 ms objective 3.4 ms late is the clients


def test_a_level_reads_back_from_its_json_with_infinities_and_gaps() -> None:
    failed = st.step_result(10, 1.0, [], failed=10, extra={"cpu_cores": {"load0": 0.2}})
    data = failed.to_json()
    assert data["p50_ms"] == "inf" and data["mean_ms"] is None
    back = st.StepResult.from_json(data)
    assert math.isinf(back.p99_ms) and math.isnan(back.mean_ms) and back.extra == {"cpu_cores": {"load0": 0.2}}
    assert back.to_json() == data
    older = {k: v for k, v in data.items() if k != "p95_ms"}  # reports from before p95 was recorded
    assert math.isnan(st.StepResult.from_json(older).p95_ms)
