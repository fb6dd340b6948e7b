"""The encoder's per-call histograms (runtimes/pytorch/stats.py): what a level's p50 and p99 read."""

from __future__ import annotations

import math

from tritonbundle.runtimes.pytorch.stats import HISTOGRAM_EDGES_MS, new_stats, observe, quantile_ms


def test_quantiles_are_the_upper_edges_of_the_buckets_that_hold_them() -> None:
    stats = new_stats()
    assert quantile_ms(stats, "execute_ms", 0.5) is None  # nothing counted yet
    for ms in [4.0] * 98 + [12.0, 600.0]:
        observe(stats, "execute_ms", ms)
    assert quantile_ms(stats, "execute_ms", 0.5) == 5.0  # 4 ms falls in the (3, 5] bucket
    assert quantile_ms(stats, "execute_ms", 0.99) == 15.0
    assert quantile_ms(stats, "execute_ms", 1.0) == math.inf  # past the last edge
    assert quantile_ms(stats, "gpu_ms", 0.5) is None  # the other histogram is untouched


def test_a_levels_histogram_is_the_difference_of_two_readings() -> None:
    before = new_stats()
    for _ in range(50):
        observe(before, "gpu_ms", 1.0)
    after = dict(before)
    for _ in range(10):
        observe(after, "gpu_ms", 40.0)
    level = {k: after[k] - before[k] for k in after}
    assert quantile_ms(level, "gpu_ms", 0.5) == 50.0
    assert HISTOGRAM_EDGES_MS == tuple(sorted(HISTOGRAM_EDGES_MS))
