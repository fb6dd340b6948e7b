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
    # The cost the packing search compares (no launches built) is what the built launches cost.
    assert planner.plan_cost(arr) == pytest.approx(planner.launch_cost(launches))
    eager = pe.LaunchPlanner(targets, (), eager_cost=(fixed, per_token))
    assert eager.plan_cost(arr) == pytest.approx(eager.launch_cost(eager.plan(arr)))


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


# -- packing ---------------------------------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(lengths=hs.lists(hs.integers(min_value=1, max_value=128), min_size=1, max_size=60),
       width=hs.sampled_from([16, 64, 128]))
def test_packing_puts_every_short_row_in_one_bin_within_its_width_and_slots(lengths: list[int], width: int) -> None:
    short = [n for n in lengths if n <= width]
    bins = pe.pack_rows(short, width, pe.max_slots(width))
    assert sorted(i for b in bins for i in b) == list(range(len(short)))
    for b in bins:
        assert sum(short[i] for i in b) <= width
        assert len(b) <= pe.max_slots(width)
        # the target a bin lands on (at least its unit length) always has a slot for each of its texts
        assert pe.max_slots(pe.unit_length(sum(short[i] for i in b), len(b))) >= len(b)


@settings(max_examples=100, deadline=None)
@given(lengths=hs.lists(hs.integers(min_value=1, max_value=512), min_size=1, max_size=80))
def test_packed_plan_carries_every_text_once_and_never_costs_more(lengths: list[int]) -> None:
    targets, buckets = (22, 32, 59, 121, 241, 512), (1, 2, 4, 8, 16, 32)
    cost = {(b, s): 2e-4 + 1e-7 * b * s for b in buckets for s in targets}
    planner = pe.LaunchPlanner(targets, buckets, cost)
    arr = np.array(lengths)
    units, launches = planner.plan_packed(arr)
    texts = np.concatenate([units[u] for _, _, members in launches for u in members])
    assert sorted(texts.tolist()) == list(range(len(lengths)))
    for batch, target, members in launches:
        assert batch in buckets and len(members) <= batch
        for u in members:
            assert pe.unit_length(int(arr[units[u]].sum()), len(units[u])) <= target
            assert len(units[u]) <= pe.max_slots(target)
    assert planner.launch_cost(launches) <= planner.launch_cost(planner.plan(arr)) + 1e-12


def test_chat_traffic_packs_to_little_padding() -> None:
    """The H200 bench's bert-base plan on chat-like lengths: packed, the computed tokens come close to the
    useful ones; one text per row, empty rows and padded lengths cost about twice as much."""
    from tritonbundle.traffic import synthetic

    targets = (22, 32, 41, 50, 59, 71, 85, 102, 121, 143, 169, 199, 241, 299, 384, 512)
    buckets = (1, 2, 4, 8, 16, 32)
    # The H200's measured graph times for this model (docs/benchmarks/h200-bert-base.json, timings_ms:
    # 0.71 ms for 1x22, 7.68 ms for 128x121, 39.9 ms for 128x512): a launch cost plus a cost per token.
    cost = {(b, s): 6.5e-4 + 5.5e-7 * b * s for b in buckets for s in targets}
    planner = pe.LaunchPlanner(targets, buckets, cost)
    lengths = np.minimum(synthetic("chat", n=2000, seed=1).row_lengths(), 512)
    plain = packed = useful = 0
    plain_s = packed_s = 0.0
    for batch in np.array_split(lengths, len(lengths) // 24):
        one_per_row, (_, launches) = planner.plan(batch), planner.plan_packed(batch)
        plain += pe.launch_tokens(one_per_row)
        packed += pe.launch_tokens(launches)
        plain_s += planner.launch_cost(one_per_row)
        packed_s += planner.launch_cost(launches)
        useful += int(batch.sum())
    print(f"chat, 24 texts per call: computed/useful {plain / useful:.2f} one text per row, {packed / useful:.2f} packed; "
          f"GPU time {packed_s / plain_s:.2f} of one text per row")
    assert packed / useful <= 1.25 and plain / useful >= 1.5
    assert packed_s <= 0.7 * plain_s


def test_pack_inputs_places_each_text_back_to_back_with_its_number_and_positions() -> None:
    ids = np.array([[101, 5, 6, 102, 0], [101, 7, 102, 0, 0], [101, 8, 9, 10, 102]])
    masks = (ids != 0).astype(np.int64)
    lengths = pe.used_lengths(masks)
    host, rows, slots, texts = pe.pack_inputs(ids, masks, lengths, [np.array([0, 1]), np.array([2])], 2, 8)
    assert host[0].tolist() == [[101, 5, 6, 102, 101, 7, 102, 0], [101, 8, 9, 10, 102, 0, 0, 0]]
    assert host[1].tolist() == [[1, 1, 1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 1, 0, 0, 0]]
    assert host[2].tolist() == [[0, 1, 2, 3, 0, 1, 2, 0], [0, 1, 2, 3, 4, 0, 0, 0]]
    assert rows.tolist() == [0, 0, 1] and slots.tolist() == [0, 1, 0] and texts.tolist() == [0, 1, 2]
