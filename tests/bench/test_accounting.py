"""The benchmark's arithmetic: ratios, padding accounting, the engine ceiling."""

from __future__ import annotations

import math

import pytest

from tritonbundle.bench import accounting as st


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
    with pytest.raises(ValueError, match="longer than the longest padding target 512"):
        st.bucket_shares([600], [512])


def test_padding_accounting_agrees_with_the_planner() -> None:
    from tritonbundle import plan as planner
    from tritonbundle import traffic

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
    per_batch, best = st.ceiling(timings, shares, mean_tokens=40.0, slo_s=0.05)
    rows = {r.batch: r for r in per_batch}
    per_row_8 = 0.75 * t(8, 32) / 8 + 0.25 * t(8, 128) / 8
    assert rows[8].requests_per_s == pytest.approx(1 / per_row_8)
    assert rows[8].useful_tokens_per_s == pytest.approx(40.0 / per_row_8)
    assert rows[8].computed_tokens_per_s == pytest.approx((0.75 * 32 + 0.25 * 128) / per_row_8)
    assert rows[512].worst_batch_ms == pytest.approx(t(512, 128) * 1000)
    assert not rows[512].feasible  # 65.6 ms > 50 ms
    assert best is not None and best.batch == 64
    assert best.requests_per_s == pytest.approx(rows[64].requests_per_s)


def test_ceiling_without_a_feasible_batch_has_no_best() -> None:
    rows, best = st.ceiling({(1, 512): 1.0}, {512: 1.0}, 100.0, slo_s=0.05)
    assert best is None and len(rows) == 1 and not rows[0].feasible
