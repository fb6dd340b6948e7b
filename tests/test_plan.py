"""Planning is pure: property tests over random traffic, no server."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tritonbundle import manifest, traffic
from tritonbundle import plan as planner
from tritonbundle.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]

lengths_strategy = st.lists(st.integers(min_value=1, max_value=64), min_size=1, max_size=200)


@settings(max_examples=150, deadline=None)
@given(lengths=lengths_strategy, buckets=st.integers(1, 6), max_len=st.integers(64, 80))
def test_every_length_falls_in_exactly_one_bucket(lengths: list[int], buckets: int, max_len: int) -> None:
    result = planner.sequence_buckets(np.array(lengths), buckets, max_len)
    assert 1 <= len(result) <= buckets
    for length in range(1, max_len + 1):
        holders = [b for b in result if b.min <= length <= b.max]
        assert len(holders) == 1, (length, result)
    assert result[0].min == 1 and result[-1].max == max_len


@settings(max_examples=150, deadline=None)
@given(lengths=lengths_strategy, buckets=st.integers(1, 6), percentile=st.floats(1, 100))
def test_min_le_opt_le_max(lengths: list[int], buckets: int, percentile: float) -> None:
    for b in planner.sequence_buckets(np.array(lengths), buckets, 64, percentile):
        assert b.min <= b.opt <= b.max


@settings(max_examples=150, deadline=None)
@given(lengths=lengths_strategy, buckets=st.integers(1, 6))
def test_expected_waste_never_exceeds_padding_to_max(lengths: list[int], buckets: int) -> None:
    edges = planner.choose_edges(np.array(lengths), buckets, 64)
    w = planner.waste(np.array(lengths), edges, 64, [1, 8])
    assert 1.0 <= w.bucketed <= w.pad_to_max + 1e-12


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 12), min_size=1, max_size=40), buckets=st.integers(1, 4))
def test_dynamic_program_matches_brute_force(lengths: list[int], buckets: int) -> None:
    arr = np.array(lengths)
    edges = planner.choose_edges(arr, buckets, 12)
    counts = planner.histogram(arr, 12)
    assert planner.padded_tokens(counts, edges) == planner.brute_force_edges(arr, buckets, 12)


@settings(max_examples=100, deadline=None)
@given(lengths=lengths_strategy)
def test_more_buckets_never_cost_more(lengths: list[int]) -> None:
    arr = np.array(lengths)
    counts = planner.histogram(arr, 64)
    costs = [planner.padded_tokens(counts, planner.choose_edges(arr, k, 64)) for k in range(1, 6)]
    assert costs == sorted(costs, reverse=True)


def test_opt_is_the_configured_percentile_of_the_bucket() -> None:
    lengths = np.array([10] * 50 + [20] * 50)
    (bucket,) = planner.sequence_buckets(lengths, 1, 20, percentile=40)
    assert bucket.opt == 10
    (bucket,) = planner.sequence_buckets(lengths, 1, 20, percentile=95)
    assert bucket.opt == 20


def test_expected_batch_max_matches_monte_carlo() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 100, size=500)
    exact = planner.expected_batch_max(lengths, 8)
    simulated = np.mean([rng.choice(lengths, 8).max() for _ in range(20000)])
    assert abs(exact - simulated) < 1.0


def test_empty_sample_is_refused() -> None:
    with pytest.raises(ConfigError, match="empty traffic sample"):
        planner.choose_edges(np.array([], dtype=int), 4, 512)


def test_shipped_plan_beats_pad_to_max_and_one_profile() -> None:
    m = manifest.load(ROOT / "build" / "models.yaml")
    spec = m.model("minilm")
    plan = planner.plan_model(spec, traffic.load(spec.traffic), policy="ragged")  # type: ignore[arg-type]
    assert plan.policy == "ragged"
    assert len(plan.profiles) == len(spec.batch_buckets) * spec.sequence_buckets
    assert plan.preferred_batch_sizes == (8, 32)
    assert planner.plan_model(manifest.override(m, preferred_batch_sizes="max").model("minilm"), traffic.load(spec.traffic),  # type: ignore[arg-type]
                              policy="ragged").preferred_batch_sizes == (32,)
    assert planner.plan_model(manifest.override(m, preferred_batch_sizes="none").model("minilm"), traffic.load(spec.traffic),  # type: ignore[arg-type]
                              policy="ragged").preferred_batch_sizes == ()
    assert plan.waste is not None
    assert plan.waste.bucketed < plan.waste.single_profile[32] < plan.waste.pad_to_max


def test_the_targets_policy_pads_to_bucket_edges() -> None:
    m = manifest.override(manifest.load(ROOT / "build" / "models.yaml"), target="gpu", runtime="tensorrt")
    spec = m.model("minilm")
    plan = planner.plan_model(spec, traffic.load(spec.traffic), policy="targets")  # type: ignore[arg-type]
    assert plan.policy == "targets"
    assert plan.padding_targets == tuple(b.max for b in plan.sequence_buckets)
    assert plan.padding_targets[-1] == 512
    first = plan.profiles[0].shapes["input_ids"]
    assert first[0] == (1, 1) and first[2] == (1, plan.padding_targets[0])


def test_model_without_sequence_needs_no_traffic(tmp_path: Path) -> None:
    spec = manifest.from_dict(
        {"version": 1, "models": [{"name": "img", "source": {"onnx": "x.onnx"},
                                   "inputs": [{"name": "pixels", "dtype": "FP32", "shape": ["batch", 3, 8, 8]}],
                                   "outputs": [{"name": "logits", "dtype": "FP32", "shape": ["batch", 10]}]}]},
        path=tmp_path / "m.yaml",
    ).models[0]
    plan = planner.plan_model(spec, None)
    assert [p.shapes["pixels"] for p in plan.profiles] == [
        ((1, 3, 8, 8), (1, 3, 8, 8), (1, 3, 8, 8)),
        ((2, 3, 8, 8), (8, 3, 8, 8), (8, 3, 8, 8)),
        ((9, 3, 8, 8), (32, 3, 8, 8), (32, 3, 8, 8)),
    ]
    assert plan.waste is None


def test_an_unknown_policy_is_refused() -> None:
    spec = manifest.load(ROOT / "build" / "models.yaml").model("minilm")
    with pytest.raises(ConfigError, match="padding policy 'padded' is not one of targets, ragged"):
        planner.plan_model(spec, traffic.synthetic("chat", n=100), policy="padded")
