"""The pytorch runtime's launch planner (runtimes/pytorch/launch.py): row lengths, the padding rule,
and least-cost launches against brute force."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from tritonbundle.contract import target_index
from tritonbundle.runtimes.pytorch import launch as pe


def test_used_lengths_is_the_position_after_the_last_one() -> None:
    mask = np.array([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0], [1, 1, 0, 1, 0], [1, 1, 1, 1, 1]])
    assert pe.used_lengths(mask).tolist() == [3, 1, 0, 4, 5]
    with pytest.raises(ValueError):
        pe.used_lengths(np.ones(3))


def test_target_index_picks_the_smallest_target_that_holds_the_row() -> None:
    assert target_index([1, 10, 11, 64, 65], [10, 64, 128]).tolist() == [0, 0, 1, 1, 2]
    with pytest.raises(ValueError, match="longer than the longest padding target"):
        target_index([129], [10, 64, 128])


def _check_plan(planner: pe.LaunchPlanner, lengths: np.ndarray) -> list[tuple[int, int, np.ndarray]]:
    launches = planner.plan(lengths)
    seen = np.concatenate([m for _, _, m in launches]) if launches else np.array([], dtype=int)
    assert sorted(seen.tolist()) == list(range(len(lengths))), "every row exactly once"
    for batch, target, members in launches:
        assert 1 <= len(members) <= batch
        assert target in planner.targets
        assert all(lengths[m] <= target for m in members)
        if planner.buckets:
            assert batch in planner.buckets
        else:
            assert batch == len(members)
    return launches


def _plan_cost(planner: pe.LaunchPlanner, cost: dict[tuple[int, int], float], launches: Any) -> float:
    return sum(cost[(b, s)] for b, s, _ in launches)


def _brute_force(lengths: np.ndarray, targets: tuple[int, ...], buckets: tuple[int, ...],
                 cost: dict[tuple[int, int], float]) -> float:
    """Least cost over every way to merge consecutive length groups and split them into buckets."""
    index = target_index(lengths, targets)
    groups = sorted(set(index.tolist()))
    counts = [int((index == g).sum()) for g in groups]

    def split(n: int, s: int) -> float:  # least cost of bucket multisets covering n rows
        best = [0.0] + [math.inf] * n
        for k in range(1, n + 1):
            best[k] = min(cost[(b, s)] + best[max(0, k - b)] for b in buckets)
        return best[n]

    best = math.inf
    for cuts in itertools.product([False, True], repeat=max(0, len(groups) - 1)):
        total, n = 0.0, 0
        for i, g in enumerate(groups):
            n += counts[i]
            if i == len(groups) - 1 or cuts[i]:
                total += split(n, targets[g])
                n = 0
        best = min(best, total)
    return best


@settings(max_examples=80, deadline=None)
@given(lengths=hs.lists(hs.integers(min_value=0, max_value=128), min_size=1, max_size=40),
       fixed=hs.floats(min_value=1e-5, max_value=1e-2), per_token=hs.floats(min_value=1e-8, max_value=1e-5))
def test_the_planner_covers_every_row_and_finds_the_least_cost_plan(lengths: list[int], fixed: float, per_token: float) -> None:
    targets, buckets = (16, 32, 64, 128), (1, 2, 4, 8)
    cost = {(b, s): fixed + per_token * b * s for b in buckets for s in targets}
    planner = pe.LaunchPlanner(targets, buckets, cost)
    arr = np.array(lengths)
    launches = _check_plan(planner, arr)
    assert _plan_cost(planner, cost, launches) == pytest.approx(_brute_force(arr, targets, buckets, cost))


def test_the_planner_merges_small_groups_when_a_launch_costs_more_than_the_padding() -> None:
    targets, buckets = (16, 32), (1, 2, 4)
    lengths = np.array([10, 30])
    expensive_launch = {(b, s): 1.0 + 1e-6 * b * s for b in buckets for s in targets}
    launches = pe.LaunchPlanner(targets, buckets, expensive_launch).plan(lengths)
    assert [(b, s) for b, s, _ in launches] == [(2, 32)]
    cheap_launch = {(b, s): 1e-6 + 1e-3 * b * s for b in buckets for s in targets}
    launches = pe.LaunchPlanner(targets, buckets, cheap_launch).plan(lengths)
    assert sorted((b, s) for b, s, _ in launches) == [(1, 16), (1, 32)]


def test_the_planner_splits_more_rows_than_the_largest_bucket() -> None:
    planner = pe.LaunchPlanner((64,), (1, 8, 32), None)
    launches = _check_plan(planner, np.full(75, 50))
    assert sum(b for b, _, _ in launches) >= 75
    assert max(b for b, _, _ in launches) == 32


def test_without_buckets_each_launch_has_exactly_its_rows() -> None:
    planner = pe.LaunchPlanner((16, 512), eager_cost=(1e-3, 1e-5))
    launches = _check_plan(planner, np.array([3, 4, 500, 12]))
    assert sum(len(m) for _, _, m in launches) == 4
    assert pe.launch_tokens(launches) == sum(b * s for b, s, _ in launches)
    assert planner.batches(5, 16) == [5] and planner.batches(0, 16) == []
