"""The pytorch runtime's engine (runtimes/pytorch/engine.py) on the CPU: eager, and through the
static-buffer "graph" path with graphs that run eagerly, since this machine has no GPU. Every
answer is checked against the recipe's encoder run one row at a time at the row's own length."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tritonbundle.runtimes.pytorch.engine import Engine, stack_rows
from tritonbundle.runtimes.pytorch.launch import LaunchPlanner, launch_tokens
from tritonbundle.runtimes.stats import new_stats


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """MiniLM in FP16 as the pytorch runtime writes it."""
    from tritonbundle import manifest
    from tritonbundle import plan as planner
    from tritonbundle.runtimes.base import BuildContext
    from tritonbundle.runtimes.pytorch.plugin import write_weights
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
    """The recipe's encoder in FP32, one row at a time, each at its own length (no padding at all)."""
    import torch

    from tritonbundle import recipes

    module = recipes.encoder(*recipes.load_folder(weights), dtype=torch.float32)
    out = []
    with torch.no_grad():
        for ids, mask in zip(rows, masks):
            n = int(mask.sum())
            out.append(module(torch.from_numpy(ids[None, :n]), torch.ones((1, n), dtype=torch.long)).numpy()[0])
    return np.stack(out)


@pytest.mark.slow
def test_the_engine_matches_the_encoder_run_row_by_row_unpadded(weights: Path) -> None:
    engine = Engine(weights, device="cpu", precision="fp16", targets=(16, 64, 512)).prepare()
    assert engine.precision == "fp32" and not engine.use_graphs  # the CPU always runs eager FP32
    rows, masks, lengths = _rows([5, 16, 17, 40, 63, 200, 3])
    stats = new_stats()
    got = engine.embed(*stack_rows(rows, masks), lengths, stats)
    expected = _reference(weights, rows, masks)
    cosine = (got * expected).sum(axis=1)
    assert cosine.min() > 0.9999
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert stats["useful_tokens"] == lengths.sum()
    assert stats["computed_tokens"] >= stats["seq_tokens"] >= stats["useful_tokens"]
    assert stats["gpu_alone_s"] == 0.0  # no shape is timed on the CPU


class _EagerGraph:
    """Stands in for a captured CUDA graph: static buffers, replay() runs the engine's forward on them."""

    def __init__(self, engine: Engine, batch: int, target: int) -> None:
        self.forward = engine._forward
        self.inputs = tuple(t.clone().zero_() for t in engine._dummy(batch, target))
        self.out = self.forward(*self.inputs).clone().fill_(float("nan"))

    def replay(self) -> None:
        import torch

        self.replays = getattr(self, "replays", 0) + 1
        with torch.no_grad():
            self.out.copy_(self.forward(*self.inputs))


@pytest.mark.slow
@pytest.mark.parametrize("packing, buckets", [(False, (1, 2, 4, 8)), (True, (1, 3, 6, 10))])
def test_the_graph_path_pads_batches_to_buckets_and_returns_rows_in_order(weights: Path, packing: bool,
                                                                          buckets: tuple[int, ...]) -> None:
    targets = (16, 64, 512)
    engine = Engine(weights, device="cpu", targets=targets, packing=packing).prepare()
    engine.use_graphs, engine.buckets = True, buckets
    engine.lane_graphs[0] = {(b, s): _EagerGraph(engine, b, s) for b in buckets for s in targets}  # type: ignore[misc]
    cost = {(b, s): 1e-3 + 1e-6 * b * s for b in buckets for s in targets}
    engine.planner = LaunchPlanner(targets, buckets, cost)
    engine.timings = {shape: 10 * t for shape, t in cost.items()}  # as prepare() times them on a GPU, in
    engine.timing_turn.held = True  # the GPU's turn
    lengths = [5, 16, 17, 40, 63, 200, 3, 9, 9, 9, 12, 33]
    rows, masks, arr = _rows(lengths, seed=3)
    stats = new_stats()
    got = engine.embed(*stack_rows(rows, masks), arr, stats)
    expected = _reference(weights, rows, masks)
    assert not np.isnan(got).any()
    assert ((got * expected).sum(axis=1)).min() > 0.9999
    launches = engine.planner.plan_packed(arr)[1] if packing else engine.planner.plan(arr)
    assert stats["computed_tokens"] == launch_tokens(launches)
    assert stats["launches"] == len(launches)
    assert stats["gpu_alone_s"] == pytest.approx(sum(engine.timings[(b, t)] for b, t, _ in launches))
    engine.timing_turn.held, unheld = False, new_stats()  # the turn timed out: timed beside the others
    engine.embed(*stack_rows(rows, masks), arr, unheld)
    assert unheld["launches"] == len(launches) and unheld["gpu_alone_s"] == 0.0
    engine.timings_shared, shared = True, new_stats()  # read from the instance that timed them in its turn
    engine.embed(*stack_rows(rows, masks), arr, shared)
    assert shared["gpu_alone_s"] == pytest.approx(stats["gpu_alone_s"])
    engine.shape_timing, concurrent = "concurrent", new_stats()  # timed concurrently on purpose
    engine.embed(*stack_rows(rows, masks), arr, concurrent)
    assert concurrent["launches"] == len(launches) and concurrent["gpu_alone_s"] == 0.0
    if packing:  # the short rows share rows of a launch: fewer tokens computed than one text per row
        assert launch_tokens(launches) < launch_tokens(engine.planner.plan(arr))


@pytest.mark.slow
def test_lanes_run_their_own_graphs_from_threads_at_once(weights: Path) -> None:
    """batches_in_flight: each lane replays its own graphs (static inputs and outputs of its own), so two
    threads embedding at once get their own rows back."""
    import threading

    targets, buckets = (16, 64), (1, 4, 8)
    engine = Engine(weights, device="cpu", targets=targets, lanes=2).prepare()
    engine.use_graphs, engine.buckets = True, buckets
    for lane in range(2):
        engine.lane_graphs[lane] = {(b, s): _EagerGraph(engine, b, s) for b in buckets for s in targets}  # type: ignore[misc]
    engine.planner = LaunchPlanner(targets, buckets, {(b, s): 1e-3 + 1e-6 * b * s for b in buckets for s in targets})
    batches = [_rows([5, 16, 17, 40, 3, 9], seed=11), _rows([60, 2, 33, 8], seed=12)]
    expected = [_reference(weights, rows, masks) for rows, masks, _ in batches]
    got: list[list[np.ndarray]] = [[], []]

    def work(lane: int) -> None:
        rows, masks, arr = batches[lane]
        for _ in range(5):
            got[lane].append(engine.embed(*stack_rows(rows, masks), arr, lane=lane))

    threads = [threading.Thread(target=work, args=(lane,)) for lane in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for lane in range(2):
        assert len(got[lane]) == 5
        for result in got[lane]:
            assert ((result * expected[lane]).sum(axis=1)).min() > 0.9999
        assert sum(getattr(g, "replays", 0) for g in engine.lane_graphs[lane].values()) >= 5
    with pytest.raises(ValueError, match="lanes"):
        Engine(weights, device="cpu", lanes=0)


@pytest.mark.slow
def test_packed_launches_match_the_encoder_row_by_row_also_for_masks_with_holes(weights: Path) -> None:
    engine = Engine(weights, device="cpu", precision="fp32", targets=(16, 64, 128), packing=True).prepare()
    rows, masks, lengths = _rows([5, 16, 17, 40, 3, 9, 9, 9, 12, 33, 120, 2], seed=5)
    masks[3][7] = 0  # a masked token inside a row: it must be left out exactly as in the unpacked forward
    ids, mask = stack_rows(rows, masks)
    from tritonbundle.runtimes.pytorch.launch import used_lengths

    stats = new_stats()
    got = engine.embed(ids, mask, used_lengths(mask), stats)
    plain = Engine(weights, device="cpu", precision="fp32", targets=(16, 64, 128)).prepare()
    expected = plain.embed(ids, mask, used_lengths(mask))
    np.testing.assert_allclose(got, expected, atol=2e-5)
    assert stats["launches"] < len(plain.planner.plan(used_lengths(mask)))


@pytest.mark.slow
def test_describe_reports_the_engine_setup(weights: Path) -> None:
    engine = Engine(weights, device="cpu", targets=(32, 512), batch_buckets=(1, 8), cuda_graphs=True)
    info = engine.describe()
    assert info["cuda_graphs"] is False  # no CUDA here: eager, and it says so
    assert info["padding_targets"] == [32, 512] and info["gpu_wait"] == "block"
    with pytest.raises(ValueError, match="precision"):
        Engine(weights, device="cpu", precision="int8")
    with pytest.raises(ValueError, match="gpu_wait"):
        Engine(weights, device="cpu", gpu_wait="poll")
