"""The TensorRT accuracy gate, driven through a double of Polygraphy's TrtRunner that reuses its output
buffers as the real one does and whose "engine" is the FP32 ONNX itself (tests/runtimes/tensorrt/doubles.py).
An engine equal to the reference must pass: a failure here is the gate's handling of buffers, profiles or
contexts, which is what broke every real build before (min cosine 0.11 on an FP32 engine)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import yaml
from onnx import numpy_helper

from tests.build.onnx_models import image_classifier
from tests.runtimes.tensorrt.doubles import OnnxEngine, ReusingTrtRunner
from tritonbundle import manifest, traffic
from tritonbundle import plan as planner
from tritonbundle.errors import BuildError
from tritonbundle.runtimes import accuracy
from tritonbundle.runtimes.base import BuildContext
from tritonbundle.runtimes.tensorrt import engine as te
from tritonbundle.runtimes.tensorrt import plugin
from tritonbundle.runtimes.tensorrt.check import engine_options

ROOT = Path(__file__).resolve().parents[3]


def _engine_of(ctx: BuildContext, onnx_path: Path) -> OnnxEngine:
    return OnnxEngine(onnx_path, [dict(p.shapes) for p in ctx.plan.profiles])


def _through_the_double(monkeypatch: pytest.MonkeyPatch, engine: OnnxEngine) -> None:
    import polygraphy.backend.trt

    monkeypatch.setattr(te, "deserialize", lambda plan, *, version_compatible: engine)
    monkeypatch.setattr(polygraphy.backend.trt, "TrtRunner", ReusingTrtRunner)


def _image_ctx(tmp_path: Path) -> BuildContext:
    onnx_path = image_classifier(tmp_path / "img.onnx")
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "models": [{
        "name": "img", "source": {"onnx": "img.onnx"}, "target": "gpu", "runtime": "tensorrt",
        "inputs": [{"name": "pixels", "dtype": "FP32", "shape": ["batch", 3, 8, 8]}],
        "outputs": [{"name": "logits", "dtype": "FP32", "shape": ["batch", 10]}]}]}))
    spec = manifest.load(path).model("img")
    return BuildContext(spec=spec, plan=planner.plan_model(spec, None), onnx_path=onnx_path, work_dir=tmp_path)


def test_the_double_reuses_its_output_buffers_as_polygraphy_does(tmp_path: Path) -> None:
    """What the double is for: a second call overwrites what the first returned."""
    ctx = _image_ctx(tmp_path)
    runner = ReusingTrtRunner(_engine_of(ctx, ctx.onnx_path), optimization_profile=1)  # type: ignore[arg-type]
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((8, 3, 8, 8)).astype(np.float32) for _ in range(2))
    with runner:
        first = runner.infer({"pixels": a})["logits"]
        kept = first.copy()
        runner.infer({"pixels": b})
        assert not np.array_equal(first, kept), "the first output must have been overwritten in place"
        with pytest.raises(Exception, match="failed to set shape"):  # profile 1 holds batch 2..8 only
            runner.infer({"pixels": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)})


def test_the_gate_copies_the_outputs_of_a_runner_that_reuses_them(tmp_path: Path) -> None:
    ctx = _image_ctx(tmp_path)
    engine = OnnxEngine(ctx.onnx_path, [{"pixels": ((1, 3, 8, 8), (8, 3, 8, 8), (32, 3, 8, 8))}])  # type: ignore[arg-type]
    rng = np.random.default_rng(1)
    feeds = [{"pixels": rng.standard_normal((n, 3, 8, 8)).astype(np.float32)} for n in (1, 8, 8, 32, 4)]
    with ReusingTrtRunner(engine) as runner:
        result = accuracy.gate("double", ctx.spec, "fp32", accuracy.onnx_runner(ctx.onnx_path), runner.infer, feeds)
    assert result.passed and result.min_cosine > 0.99999 and result.rows == 53, result.describe()


@pytest.mark.slow
@pytest.mark.beside
def test_the_tensorrt_gate_passes_an_engine_equal_to_fp32_and_feeds_every_profile(
    tmp_path: Path, exported_minilm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = manifest.override(manifest.load(ROOT / "build" / "models.yaml"), target="gpu", runtime="tensorrt")
    spec = m.model("minilm")
    plan = planner.plan_model(spec, traffic.load(spec.traffic))  # type: ignore[arg-type]
    ctx = BuildContext(spec=spec, plan=plan, onnx_path=exported_minilm / "model.onnx", work_dir=tmp_path,
                       tokenizer_json=exported_minilm / "tokenizer.json")
    engine = _engine_of(ctx, exported_minilm / "model.onnx")
    _through_the_double(monkeypatch, engine)

    plugin.accuracy_gate(ctx, b"plan", engine_options(ctx))  # raises BuildError when it fails

    inferred = [(a[1], a[2]["input_ids"]) for a in engine.activity if a[0] == "infer"]
    assert sorted(p for p, _ in inferred) == list(range(len(plan.profiles))) == list(range(12))
    for profile, shape in inferred:  # each feed at its profile's own batch bucket and padding target
        p = plan.profiles[profile]
        assert p.sequence is not None and shape == (p.batch.max, p.sequence.max)
    assert {shape for _, shape in inferred if shape[0] == 1} == {(1, t) for t in plan.padding_targets}
    # One context at a time, each sized for its own profile, all released at the end.
    assert engine.peak_contexts == 1 and engine.live_contexts == 0
    assert {a[2] for a in engine.activity if a[0] == "activate"} == {"profile"}
    assert engine.peak_bytes == max(engine.memory_for(i) for i in range(12)) < engine.memory_for(None) * 12


def test_the_tensorrt_gate_refuses_an_engine_whose_answers_differ(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = _image_ctx(tmp_path)
    model = onnx.load(str(ctx.onnx_path))
    weights = model.graph.initializer[0]
    weights.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weights)[:, ::-1].copy(), weights.name))
    other = tmp_path / "other.onnx"
    onnx.save(model, str(other))
    engine = _engine_of(ctx, other)
    _through_the_double(monkeypatch, engine)
    with pytest.raises(BuildError, match=r"model img: accuracy gate failed: TensorRT engine vs FP32: min cosine"):
        plugin.accuracy_gate(ctx, b"plan", engine_options(ctx))
    assert engine.live_contexts == 0, "a failed gate must still release its context"


def test_profile_choice_follows_triton_nearest_opt(tmp_path: Path) -> None:
    ctx = _image_ctx(tmp_path)
    batch: Any = {n: np.zeros((n, 3, 8, 8), dtype=np.float32) for n in (1, 2, 8, 9, 32)}
    assert [plugin.profile_for(ctx, {"pixels": batch[n]}) for n in (1, 2, 8, 9, 32)] == [0, 1, 1, 2, 2]
    with pytest.raises(BuildError, match="no profile holds the gate input shapes"):
        plugin.profile_for(ctx, {"pixels": np.zeros((33, 3, 8, 8), dtype=np.float32)})
