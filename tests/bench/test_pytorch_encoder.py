"""The pytorch runtime's model (tritonbundle/triton_models/pytorch_encoder.py) outside Triton:
row lengths, the launch planner, and the engine on the CPU (eager, and through the static-buffer
"graph" path with graphs that run eagerly, since this machine has no GPU)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from tritonbundle.triton_models import pytorch_encoder as pe


def test_used_lengths_is_the_position_after_the_last_one() -> None:
    mask = np.array([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0], [1, 1, 0, 1, 0], [1, 1, 1, 1, 1]])
    assert pe.used_lengths(mask).tolist() == [3, 1, 0, 4, 5]
    with pytest.raises(ValueError):
        pe.used_lengths(np.ones(3))


def test_target_index_picks_the_smallest_target_that_holds_the_row() -> None:
    assert pe.target_index([1, 10, 11, 64, 65], [10, 64, 128]).tolist() == [0, 0, 1, 1, 2]
    with pytest.raises(ValueError, match="longer than the longest padding target"):
        pe.target_index([129], [10, 64, 128])


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
    index = pe.target_index(lengths, targets)
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


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """MiniLM in FP16 as the pytorch runtime writes it."""
    from tritonbundle import manifest
    from tritonbundle.build import planner
    from tritonbundle.runtimes.base import BuildContext
    from tritonbundle.runtimes.pytorch import write_weights
    from tritonbundle.traffic import synthetic

    root = tmp_path_factory.mktemp("weights")
    m = manifest.from_dict({
        "version": 1, "defaults": {"runtime": "pytorch", "precision": "fp16", "target": "gpu"},
        "models": [{"name": "minilm", "task": "text-embedding", "source": {"recipe": "minilm"},
                    "inputs": [{"name": "input_ids", "dtype": "INT64", "shape": ["batch", "sequence"]},
                               {"name": "attention_mask", "dtype": "INT64", "shape": ["batch", "sequence"]}],
                    "outputs": [{"name": "embedding", "dtype": "FP32", "shape": ["batch", 384]}]}],
    }, path=root / "models.yaml")
    spec = m.models[0]
    plan = planner.plan_model(spec, synthetic("chat", n=500))
    folder = root / "1"
    folder.mkdir()
    write_weights(BuildContext(spec=spec, plan=plan, onnx_path=None, work_dir=root), folder)
    return folder


def _rows(lengths: list[int], seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    rng = np.random.default_rng(seed)
    rows, masks = [], []
    for n in lengths:
        width = n + int(rng.integers(0, 5))  # some rows arrive padded already (as from the tokenizer)
        ids = np.zeros(width, dtype=np.int64)
        ids[:n] = rng.integers(1000, 20000, size=n)
        ids[0] = 101
        mask = np.zeros(width, dtype=np.int64)
        mask[:n] = 1
        rows.append(ids)
        masks.append(mask)
    return rows, masks, np.array(lengths)


def _reference(weights: Path, rows: list[np.ndarray], masks: list[np.ndarray]) -> np.ndarray:
    """The export recipe's module (HF BertModel with its own 2-D mask handling), one row at a time."""
    import torch

    from tritonbundle.export import recipes
    from tritonbundle.triton_models.pytorch_encoder import build_encoder

    module, _ = recipes._pooled(build_encoder(weights, torch.float32, "cpu").bert), None
    out = []
    with torch.no_grad():
        for ids, mask in zip(rows, masks):
            out.append(module(torch.from_numpy(ids[None]), torch.from_numpy(mask[None])).numpy()[0])
    return np.stack(out)


@pytest.mark.slow
def test_the_engine_matches_the_recipes_module_on_the_cpu(weights: Path) -> None:
    engine = pe.Engine(weights, device="cpu", precision="fp16", targets=(16, 64, 512)).prepare()
    assert engine.precision == "fp32" and not engine.use_graphs  # the CPU always runs eager FP32
    rows, masks, lengths = _rows([5, 16, 17, 40, 63, 200, 3])
    stats = dict.fromkeys(pe.STAT_KEYS, 0.0)
    got = engine.embed(rows, masks, lengths, stats)
    expected = _reference(weights, rows, masks)
    cosine = (got * expected).sum(axis=1)
    assert cosine.min() > 0.9999
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert stats["useful_tokens"] == lengths.sum()
    assert stats["computed_tokens"] >= stats["seq_tokens"] >= stats["useful_tokens"]


class _EagerGraph:
    """Stands in for a captured CUDA graph: static buffers, replay() runs the module on them."""

    def __init__(self, module: Any, batch: int, target: int, hidden: int) -> None:
        import torch

        self.module = module
        self.ids = torch.zeros((batch, target), dtype=torch.long)
        self.mask = torch.zeros((batch, target), dtype=torch.long)
        self.out = torch.full((batch, hidden), float("nan"))

    def replay(self) -> None:
        import torch

        with torch.no_grad():
            self.out.copy_(self.module(self.ids, self.mask))


@pytest.mark.slow
def test_the_graph_path_pads_batches_to_buckets_and_returns_rows_in_order(weights: Path) -> None:
    targets, buckets = (16, 64, 512), (1, 2, 4, 8)
    engine = pe.Engine(weights, device="cpu", targets=targets).prepare()
    engine.use_graphs, engine.buckets = True, buckets
    engine.graphs = {(b, s): _EagerGraph(engine.module, b, s, engine.hidden) for b in buckets for s in targets}
    cost = {(b, s): 1e-3 + 1e-6 * b * s for b in buckets for s in targets}
    engine.planner = pe.LaunchPlanner(targets, buckets, cost)
    lengths = [5, 16, 17, 40, 63, 200, 3, 9, 9, 9, 12, 33]
    rows, masks, arr = _rows(lengths, seed=3)
    stats = dict.fromkeys(pe.STAT_KEYS, 0.0)
    got = engine.embed(rows, masks, arr, stats)
    expected = _reference(weights, rows, masks)
    assert not np.isnan(got).any()
    assert ((got * expected).sum(axis=1)).min() > 0.9999
    assert stats["computed_tokens"] == pe.launch_tokens(engine.planner.plan(arr))
    assert stats["launches"] == len(engine.planner.plan(arr))


@pytest.mark.slow
def test_describe_reports_the_engine_setup(weights: Path) -> None:
    engine = pe.Engine(weights, device="cpu", targets=(32, 512), batch_buckets=(1, 8), cuda_graphs=True)
    info = engine.describe()
    assert info["cuda_graphs"] is False  # no CUDA here: eager, and it says so
    assert info["padding_targets"] == [32, 512]
    with pytest.raises(ValueError, match="precision"):
        pe.Engine(weights, device="cpu", precision="int8")
