"""The pytorch runtime plug-in: its config from the plan, its files, and what it refuses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tritonbundle import manifest, runtimes
from tritonbundle import plan as planner
from tritonbundle.errors import BuildError, ConfigError
from tritonbundle.runtimes.base import BuildContext, Written
from tritonbundle.traffic import synthetic


def _spec(tmp_path: Path, **overrides: Any) -> manifest.ModelSpec:
    model = {
        "name": "minilm", "task": "text-embedding", "source": {"recipe": "minilm"},
        "inputs": [{"name": "input_ids", "dtype": "INT64", "shape": ["batch", "sequence"]},
                   {"name": "attention_mask", "dtype": "INT64", "shape": ["batch", "sequence"]}],
        "outputs": [{"name": "embedding", "dtype": "FP32", "shape": ["batch", 384]}],
    }
    model.update(overrides.pop("model", {}))
    defaults = {"runtime": "pytorch", "target": "gpu", "precision": "fp16", "batch_buckets": [1, 4, 16],
                "sequence_buckets": 6, **overrides}
    return manifest.from_dict({"version": 1, "defaults": defaults, "models": [model]}, path=tmp_path / "m.yaml").models[0]


def _ctx(tmp_path: Path, spec: manifest.ModelSpec, previous: Path | None = None) -> BuildContext:
    plan = planner.plan_model(spec, synthetic("chat", n=2000, seed=0))
    return BuildContext(spec=spec, plan=plan, onnx_path=None, work_dir=tmp_path / "work", previous_dir=previous)


def test_gpu_config_is_a_python_backend_gpu_model_with_the_plans_shapes(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, _spec(tmp_path))
    cfg = runtimes.get("pytorch").config(ctx, Written())
    assert cfg.backend == "python" and not cfg.platform
    assert cfg.max_batch_size == 16
    assert [g.kind for g in cfg.instance_groups] == ["KIND_GPU"]
    assert all(t.allow_ragged_batch and t.dims == (-1,) for t in cfg.inputs)
    assert cfg.outputs[0].dims == (384,)
    assert cfg.dynamic_batching is not None and cfg.dynamic_batching.preferred_batch_sizes == (4, 16)
    p = cfg.parameters
    assert p["precision"] == "fp16" and p["cuda_graphs"] == "true" and p["padding_policy"] == "targets"
    assert p["padding_targets"] == ",".join(map(str, ctx.plan.padding_targets))
    assert len(ctx.plan.padding_targets) == 6 and ctx.plan.padding_targets[-1] == 512
    assert p["batch_buckets"] == "1,4,16"
    assert p["random_weights"] == "false" and p["recipe"] == "minilm"
    assert len(cfg.warmups) == 1
    pbtxt = cfg.to_pbtxt()
    assert 'backend: "python"' in pbtxt and "KIND_GPU" in pbtxt and "allow_ragged_batch: true" in pbtxt


def test_cpu_config_runs_on_cpu_instances_without_graphs(tmp_path: Path) -> None:
    cfg = runtimes.get("pytorch").config(_ctx(tmp_path, _spec(tmp_path, target="cpu", precision="fp32")), Written())
    assert [g.kind for g in cfg.instance_groups] == ["KIND_CPU"]
    assert cfg.parameters["cuda_graphs"] == "false"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"precision": "int8"}, "supports fp32, fp16 or bf16"),
        ({"model": {"outputs": [{"name": "embedding", "dtype": "FP16", "shape": ["batch", 384]}]}}, "one FP32"),
    ],
)
def test_refuses_what_it_cannot_run(tmp_path: Path, overrides: dict[str, Any], message: str) -> None:
    spec = _spec(tmp_path, **overrides) if "model" not in overrides else _spec(tmp_path, model=overrides["model"])
    with pytest.raises(ConfigError, match=message):
        runtimes.get("pytorch").check(spec)


def test_the_runtime_refuses_an_onnx_file(tmp_path: Path) -> None:
    spec = _spec(tmp_path, model={"source": {"onnx": "x.onnx"}, "tokenizer": {"file": "t.json"}})
    with pytest.raises(ConfigError, match="needs a source recipe"):
        runtimes.get("pytorch").check(spec)


@pytest.mark.slow
def test_writes_the_model_the_weights_in_the_precision_and_reuses_them(tmp_path: Path) -> None:
    from safetensors import safe_open

    spec = _spec(tmp_path)
    first = tmp_path / "repo" / "1"
    runtimes.get("pytorch").write_files(_ctx(tmp_path, spec), first)
    assert {p.name for p in first.iterdir()} >= {"model.py", "model.safetensors", "config.json", "weights.json"}
    with safe_open(str(first / "model.safetensors"), "pt") as f:
        names = list(f.keys())
        assert f.get_tensor("embeddings.word_embeddings.weight").dtype.__str__() == "torch.float16"
    assert not any(n.startswith("pooler.") for n in names)
    assert json.loads((first / "config.json").read_text())["hidden_size"] == 384
    record = json.loads((first / "weights.json").read_text())
    assert record["random_weights"] is False and record["fingerprint"]["dtype"] == "float16"
    second = tmp_path / "repo2" / "1"
    runtimes.get("pytorch").write_files(_ctx(tmp_path, spec, previous=first), second)
    assert (second / "model.safetensors").stat().st_ino == (first / "model.safetensors").stat().st_ino  # linked


def test_the_declared_output_must_match_the_recipes_hidden_size(tmp_path: Path) -> None:
    spec = _spec(tmp_path, model={"outputs": [{"name": "embedding", "dtype": "FP32", "shape": ["batch", 768]}]})
    with pytest.raises(BuildError, match="hidden size 384"):
        runtimes.get("pytorch").write_files(_ctx(tmp_path, spec), tmp_path / "v")


def test_minilm_weights_can_come_from_a_folder_named_by_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tritonbundle import recipes

    monkeypatch.setenv(recipes.MINILM_DIR_ENV, str(tmp_path / "missing"))
    with pytest.raises(BuildError, match="has no model.safetensors"):
        runtimes.get("pytorch").write_files(_ctx(tmp_path, _spec(tmp_path)), tmp_path / "v")


def test_only_the_pytorch_runtime_tokenizes_in_its_encoder(tmp_path: Path) -> None:
    runtimes.get("pytorch").check(_spec(tmp_path, tokenize_in_encoder=True))
    for name, target in (("onnxruntime", "cpu"), ("tensorrt", "gpu")):
        spec = _spec(tmp_path, runtime=name, target=target, precision="fp32", tokenize_in_encoder=True)
        with pytest.raises(ConfigError, match=rf"model minilm.tokenize_in_encoder: the {name} runtime's encoder cannot tokenize"):
            runtimes.get(name).check(spec)


def test_the_text_model_config_carries_the_encoders_and_the_tokenizers_settings(tmp_path: Path) -> None:
    from tritonbundle.contract import TextPyTorchParameters
    from tritonbundle.runtimes.tokenizer import plugin as tokenizer

    spec = _spec(tmp_path, tokenize_in_encoder=True, instances=3)
    ctx = _ctx(tmp_path, spec)
    encoder_dir, text_dir = tmp_path / "minilm_encoder" / "1", tmp_path / "minilm" / "1"
    encoder_dir.mkdir(parents=True)
    for name in ("model.safetensors", "config.json", "weights.json"):
        (encoder_dir / name).write_text(name)
    runtime = runtimes.get("pytorch")
    config, record = runtime.text_model(ctx, encoder_dir, text_dir, tokenizer.parameters(spec, ctx.plan))
    assert record is TextPyTorchParameters and config.name == "minilm" and config.backend == "python"
    assert [(t.name, t.dtype, t.dims) for t in config.inputs] == [("TEXT", "STRING", (1,))]
    assert [(g.count, g.kind) for g in config.instance_groups] == [(3, "KIND_GPU")]
    assert not config.warmups  # Triton's zero data would be empty texts, which the model refuses
    params = TextPyTorchParameters.from_parameters(dict(config.parameters), strict=True)
    assert params.tokenizer_file == "tokenizer.json" and params.packing and params.precision == "fp16"
    assert (text_dir / "model.py").exists() and (text_dir / "model.safetensors").read_text() == "model.safetensors"


def test_the_token_rows_encoder_keeps_one_instance_when_the_text_model_tokenizes(tmp_path: Path) -> None:
    """With ``tokenize_in_encoder`` the text model carries the traffic with ``instances``; <name>_encoder
    (token rows, for clients that tokenize) starts one instance, its queue sized for one."""
    runtime = runtimes.get("pytorch")
    folded = runtime.config(_ctx(tmp_path, _spec(tmp_path, tokenize_in_encoder=True, instances=6)), Written())
    plain = runtime.config(_ctx(tmp_path, _spec(tmp_path, instances=6)), Written())
    assert [(g.count, g.kind) for g in folded.instance_groups] == [(1, "KIND_GPU")]
    assert [(g.count, g.kind) for g in plain.instance_groups] == [(6, "KIND_GPU")]
    assert folded.dynamic_batching is not None and plain.dynamic_batching is not None
    queued = folded.dynamic_batching.queue_policy, plain.dynamic_batching.queue_policy
    assert queued[0] is not None and queued[1] is not None
    assert queued[1].max_queue_size == 6 * queued[0].max_queue_size == 6 * 2 * 16
