from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from tritonbundle import manifest
from tritonbundle import manifest as manifest_module
from tritonbundle.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def _minimal(**model: Any) -> dict[str, Any]:
    m: dict[str, Any] = {
        "name": "enc",
        "source": {"onnx": "enc.onnx"},
        "inputs": [{"name": "input_ids", "dtype": "INT64", "shape": ["batch", "sequence"]}],
        "outputs": [{"name": "out", "dtype": "FP32", "shape": ["batch", 4]}],
    }
    m.update(model)
    return {"version": 1, "models": [m]}


def _load(data: dict[str, Any], tmp_path: Path) -> manifest.Manifest:
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(data))
    return manifest.load(path)


def test_shipped_manifest_is_valid() -> None:
    m = manifest.load(ROOT / "build" / "models.yaml")
    spec = m.model("minilm")
    assert spec.task == "text-embedding"
    assert spec.max_batch_size == 32
    assert spec.batch_buckets == (1, 8, 32)
    assert [t.dims for t in spec.inputs] == [(-1,), (-1,)]
    assert spec.traffic is not None and spec.traffic.exists()


def test_unknown_key_is_named_with_the_allowed_keys(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        _load(_minimal(precison="fp16"), tmp_path)
    assert "models[0]: unknown key 'precison' (did you mean 'precision'?)" in str(e.value)
    assert "precision" in str(e.value)


def test_bad_enum_value_lists_allowed_values(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"models\[0\]\.precision: 'fp8' is not allowed; allowed values: fp32, fp16, bf16, int8"):
        _load(_minimal(precision="fp8"), tmp_path)


def test_bad_dimension_name_is_explained(tmp_path: Path) -> None:
    data = _minimal()
    data["models"][0]["inputs"][0]["shape"] = ["batch", "se q"]
    with pytest.raises(ConfigError, match=r"inputs\[0\]\.shape\[1\]: 'se q' is not a dimension; .*'sequence' "
                                          r"\(the token axis of text\) or a name for another dynamic axis"):
        _load(data, tmp_path)


def test_any_name_is_a_dynamic_axis_with_its_limits(tmp_path: Path) -> None:
    data = _minimal()
    data["models"][0]["inputs"] = [{"name": "pixels", "dtype": "FP32", "shape": ["batch", 3, "height", "width"]}]
    data["models"][0]["axes"] = {"height": {"max": 1024, "buckets": 3}}
    spec = _load(data, tmp_path).models[0]
    assert [(a.name, a.max, a.buckets) for a in spec.axes] == [("height", 1024, 3), ("width", 0, 2)]
    assert spec.inputs[0].dims == (3, -1, -1) and not spec.has_sequence
    data["models"][0]["axes"] = {"depth": {"max": 4}}
    with pytest.raises(ConfigError, match=r"axes: depth is not a dimension of any input \(named axes: height, width\)"):
        _load(data, tmp_path)


def test_batch_only_first(tmp_path: Path) -> None:
    data = _minimal()
    data["models"][0]["inputs"][0]["shape"] = ["sequence", "batch"]
    with pytest.raises(ConfigError, match="'batch' may only be the first dimension"):
        _load(data, tmp_path)


def test_source_needs_exactly_one_of_recipe_or_onnx(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="exactly one of 'recipe'"):
        _load(_minimal(source={"recipe": "minilm", "onnx": "x.onnx"}), tmp_path)


def test_malformed_yaml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text("version: 1\nmodels: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        manifest.load(path)


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(_minimal(precision="fp8", runtime="tvm")))
    with pytest.raises(ConfigError) as e:
        manifest.load(path, runtimes=("onnxruntime", "tensorrt"))
    assert "precision" in str(e.value) and "runtime: 'tvm' is not allowed; allowed values: onnxruntime, tensorrt" in str(e.value)


def test_the_runtime_and_recipe_names_come_from_the_caller(tmp_path: Path) -> None:
    """The manifest knows neither runtimes nor recipes: the build stage passes the names that exist."""
    assert _load(_minimal(runtime="anything"), tmp_path).models[0].runtime == "anything"
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(_minimal(source={"recipe": "gpt"})))
    with pytest.raises(ConfigError, match="'gpt' is not allowed; allowed values: minilm"):
        manifest.load(path, recipes=("minilm",))


def test_every_tunable_is_defined_once_with_its_default_and_schema() -> None:
    tunables = {f.name: f for f in dataclasses.fields(manifest.Tunables)}
    assert set(manifest.SCHEMA["properties"]["defaults"]["properties"]) == set(tunables)
    model_keys = set(manifest.SCHEMA["properties"]["models"]["items"]["properties"])
    assert set(tunables) <= model_keys
    spec_fields = {f.name for f in dataclasses.fields(manifest.ModelSpec)}
    assert set(tunables) <= spec_fields


def test_yaml_numbers_take_the_knobs_type(tmp_path: Path) -> None:
    spec = _load(_minimal(opt_percentile=90, batch_buckets=[32, 1, 8]), tmp_path).models[0]
    assert spec.opt_percentile == 90.0 and isinstance(spec.opt_percentile, float)
    assert spec.batch_buckets == (1, 8, 32)


def test_override_refuses_what_is_not_a_tunable(tmp_path: Path) -> None:
    m = _load(_minimal(), tmp_path)
    with pytest.raises(ConfigError, match="cannot override nmae: not a tunable"):
        manifest.override(m, nmae="x")


def test_image_model_with_batch_only(tmp_path: Path) -> None:
    data = _minimal(
        inputs=[{"name": "pixels", "dtype": "FP32", "shape": ["batch", 3, 224, 224]}],
        outputs=[{"name": "logits", "dtype": "FP32", "shape": ["batch", 1000]}],
    )
    spec = _load(data, tmp_path).models[0]
    assert not spec.has_sequence
    assert spec.inputs[0].dims == (3, 224, 224)
    assert spec.max_sequence_length == 0


def test_max_queue_size_is_auto_or_a_positive_count(tmp_path: Path) -> None:
    assert _load(_minimal(), tmp_path).models[0].max_queue_size == "auto"
    assert _load(_minimal(max_queue_size=500), tmp_path).models[0].max_queue_size == 500
    for bad in (0, -3, "big"):
        with pytest.raises(ConfigError, match="max_queue_size"):
            _load(_minimal(max_queue_size=bad), tmp_path)


def test_the_manifest_reference_in_docs_is_generated_from_the_schema() -> None:
    """docs/manifest.md documents every key; a key without prose or a stale page fails here."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("manifest_reference", ROOT / "scripts" / "manifest_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert set(module.keys()) <= set(module.PROSE)
    assert module.main(["--check"]) == 0, "run: python scripts/manifest_reference.py"


def test_init_appends_to_an_empty_models_list_keeping_comments(tmp_path: Path) -> None:
    from tests.build.onnx_models import mlp
    from tritonbundle.build.describe import append_model, describe

    manifest = tmp_path / "models.yaml"
    manifest.write_text("# our models\nversion: 1\nmodels: []\n")
    append_model(manifest, describe(mlp(tmp_path / "mlp.onnx"), name="mlp", relative_to=tmp_path))
    assert manifest.read_text().startswith("# our models\n")
    assert [m.name for m in manifest_module.load(manifest).models] == ["mlp"]


def _graph(path: Path, inputs: list[tuple[str, list[Any]]], outputs: list[tuple[str, list[Any]]]) -> Path:
    """A graph of the given tensors' shapes (float), its outputs constants: init reads only the shapes."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Constant", [], [name], value=helper.make_tensor(name, TensorProto.FLOAT, [1], [0.0]))
             for name, _ in outputs]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.parametrize(("inputs", "outputs", "shapes"), [
    # detections: the output's first dimension is another quantity; batching would mix requests' rows
    ([("x", ["N", 4])], [("boxes", ["num_boxes", 4])], [["N", 4], ["num_boxes", 4]]),
    # time-major: the batch is the second dimension
    ([("x", ["seq", "batch", 8])], [("y", ["seq", "batch", 8])], [["seq", "batch_1", 8], ["seq", "batch_1", 8]]),
    # an output without the batch dimension
    ([("x", ["batch", 4])], [("y", ["batch", 4]), ("z", [3])], [["batch_0", 4], ["batch_0", 4], [3]]),
    # one name on every input and output: batched
    ([("x", ["bs", 4])], [("y", ["bs", 2])], [["batch", 4], ["batch", 2]]),
])
def test_init_batches_only_where_one_named_dimension_leads_every_tensor(
        tmp_path: Path, inputs: list[tuple[str, list[Any]]], outputs: list[tuple[str, list[Any]]],
        shapes: list[list[Any]]) -> None:
    from tritonbundle.build.describe import describe

    entry = describe(_graph(tmp_path / "m.onnx", inputs, outputs), name="m", relative_to=tmp_path)
    assert [t["shape"] for t in [*entry["inputs"], *entry["outputs"]]] == shapes


def _text_model(dtype: str = "INT64", **model: Any) -> dict[str, Any]:
    tokens = [{"name": n, "dtype": dtype, "shape": ["batch", "sequence"]} for n in ("input_ids", "attention_mask")]
    return _minimal(**{"task": "text-embedding", "inputs": tokens, "tokenizer": {"file": "tokenizer.json"}, **model})


def test_a_text_model_with_int32_token_inputs_is_refused_before_the_build(tmp_path: Path) -> None:
    """The tokenizer model, the clients and the load generators send int64 token rows: every request
    to such a build failed ("data-type is 'INT64', but model ... expects 'INT32'")."""
    assert _load(_text_model(), tmp_path).models[0].task == "text-embedding"
    with pytest.raises(ConfigError, match=r"token inputs are INT64, got input_ids \(INT32\), attention_mask \(INT32\)"):
        _load(_text_model("INT32"), tmp_path)


def test_a_tokenizer_longer_than_the_model_is_refused(tmp_path: Path) -> None:
    """Texts past max_sequence_length reached no profile: refused at serving time, after a good build."""
    spec = _load(_text_model(max_sequence_length=64, tokenizer={"file": "tokenizer.json", "max_length": 64}), tmp_path)
    assert spec.models[0].tokenizer_max_length == 64
    with pytest.raises(ConfigError, match="tokenizer.max_length 128 is more than max_sequence_length 64"):
        _load(_text_model(max_sequence_length=64, tokenizer={"file": "tokenizer.json", "max_length": 128}), tmp_path)


def test_init_says_why_a_model_is_not_batched(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tritonbundle.cli import main

    path = _graph(tmp_path / "det.onnx", [("x", ["N", 4])], [("boxes", ["num_boxes", 4])])
    assert main(["init", str(path), "--manifest", str(tmp_path / "models.yaml")]) != 0
    out, err = capsys.readouterr()
    assert "need their largest size" in err
    assert "not batched (no dynamic batching): their first dimensions are named differently (x: N, boxes: num_boxes)" in out


def test_init_batches_a_text_export_whose_output_names_its_batch_otherwise(tmp_path: Path) -> None:
    """Exporters name an output's batch as they like (``batch_size``, ``Addlogits_dim_0``); a text task's
    encoder answers per text by contract, so its entry stays [batch, sequence] -> [batch, n]."""
    import onnx
    from onnx import TensorProto, helper

    from tritonbundle.build.describe import describe

    tokens = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
              for n in ("input_ids", "attention_mask")]
    node = helper.make_node("Constant", [], ["logits"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.0]))
    graph = helper.make_graph([node], "g", tokens, [helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                                                                  ["Addlogits_dim_0", 2])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "m.onnx"))
    (tmp_path / "tokenizer.json").write_text("{}")
    entry = describe(tmp_path / "m.onnx", name="m", relative_to=tmp_path)
    assert entry["task"] == "text-classification"
    assert [t["shape"] for t in [*entry["inputs"], *entry["outputs"]]] == [["batch", "sequence"]] * 2 + [["batch", 2]]
