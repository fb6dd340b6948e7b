"""Token ids clamped before a TensorRT plan gathers with them (runtimes/tensorrt/clamp.py). TensorRT is
not here: the clamped graph is checked on ONNX Runtime, which runs the same ONNX the plan is built from
(ids in range: the same answers bit for bit; ids out of range: the first or last row, where the graph
as exported reads past its table and ONNX Runtime refuses it), and the build is checked to hand
TensorRT the clamped graph and to rebuild a plan made without it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tritonbundle.errors import BuildError
from tritonbundle.runtimes.tensorrt import engine as te
from tritonbundle.runtimes.tensorrt import plugin
from tritonbundle.runtimes.tensorrt.check import engine_options
from tritonbundle.runtimes.tensorrt.clamp import clamp_indices

from .test_tensorrt import H100, _ctx

ROWS = 10


def _graph(path: Path, *, external: bool = False, opset: int = 17) -> Path:
    """ids -> Gather(table of ROWS x 4) -> embedded, and ids + 1 as a second output (another reader)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(np.arange(ROWS * 4, dtype=np.float32).reshape(ROWS, 4), "table")
    one = numpy_helper.from_array(np.array(1, np.int64), "one")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "input_ids"], ["embedded"]),
         helper.make_node("Add", ["input_ids", "one"], ["shifted"])], "g",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("embedded", TensorProto.FLOAT, ["batch", "sequence", 4]),
         helper.make_tensor_value_info("shifted", TensorProto.INT64, ["batch", "sequence"])], [table, one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    if external:
        onnx.save_model(model, str(path), save_as_external_data=True, location="weights.bin", size_threshold=0)
    else:
        onnx.save_model(model, str(path))
    return path


def _run(path: Path, ids: np.ndarray[Any, Any], output: str = "embedded") -> np.ndarray[Any, Any]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.asarray(session.run([output], {"input_ids": ids})[0])


def test_ids_in_range_answer_as_before_and_the_rest_take_an_edge_row(tmp_path: Path) -> None:
    source = _graph(tmp_path / "model.onnx")
    clamped = clamp_indices(source, tmp_path / "clamped" / "model.onnx", {"input_ids": ROWS})
    valid = np.array([[0, 3, 9], [1, 2, 5]], np.int64)
    assert np.array_equal(_run(clamped, valid), _run(source, valid))
    bad = np.array([[-1, ROWS, 2**40]], np.int64)
    with pytest.raises(Exception, match="out of bounds|indices element out of data bounds"):
        _run(source, bad)
    table = np.arange(ROWS * 4, dtype=np.float32).reshape(ROWS, 4)
    assert np.array_equal(_run(clamped, bad)[0], table[[0, ROWS - 1, ROWS - 1]])
    # every reader of the input reads the clamped ids, not only the Gather
    assert _run(clamped, bad, "shifted").tolist() == [[1, ROWS, ROWS]]


def test_external_weights_are_linked_not_loaded_or_copied(tmp_path: Path) -> None:
    """A large model's weights stay where they are: the clamped graph points at a hard link of each
    weights file under its own name (a second build replaces the link)."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    source = _graph(tmp_path / "model.onnx", external=True)
    for _ in range(2):
        clamped = clamp_indices(source, tmp_path / "clamped" / "model.onnx", {"input_ids": ROWS})
    assert (clamped.parent / "weights.bin").samefile(tmp_path / "weights.bin")
    tables = [t for t in onnx.load(str(clamped), load_external_data=False).graph.initializer if t.name == "table"]
    assert len(tables) == 1 and uses_external_data(tables[0])  # not inline
    assert _run(clamped, np.array([[ROWS + 3]], np.int64))[0, 0, 0] == (ROWS - 1) * 4


def test_what_cannot_be_clamped_is_refused_naming_it(tmp_path: Path) -> None:
    source = _graph(tmp_path / "model.onnx")
    with pytest.raises(BuildError, match="no graph input 'token_type_ids' to clamp"):
        clamp_indices(source, tmp_path / "out.onnx", {"token_type_ids": 2})
    with pytest.raises(BuildError, match="opset 11 has no integer Max/Min"):
        clamp_indices(_graph(tmp_path / "old.onnx", opset=11), tmp_path / "out.onnx", {"input_ids": ROWS})


@pytest.mark.beside
def test_the_exported_minilm_answers_the_same_once_clamped(exported_minilm: Path, tmp_path: Path) -> None:
    """The shipped model as exported: the clamp leaves its answers to real token ids unchanged (bit for
    bit) and turns ids past its 30,522-row vocabulary into the last row's instead of a refusal."""
    import onnxruntime as ort

    from tritonbundle.runtimes.base import index_tables

    source = exported_minilm / "model.onnx"
    tables = index_tables(source, ["input_ids", "attention_mask"])
    assert tables == {"input_ids": 30522}
    clamped = clamp_indices(source, tmp_path / "model.onnx", tables)
    ids = np.array([[101, 7592, 2088, 102, 0, 0], [101, 2023, 2003, 1037, 3231, 102]], np.int64)
    mask = (ids != 0).astype(np.int64)
    before, after = (ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (source, clamped))
    name = before.get_outputs()[0].name
    assert np.array_equal(after.run([name], {"input_ids": ids, "attention_mask": mask})[0],
                          before.run([name], {"input_ids": ids, "attention_mask": mask})[0])
    past = ids.copy()
    past[1, 3] = 2**40
    clipped = past.copy()
    clipped[1, 3] = 30521
    assert np.array_equal(after.run([name], {"input_ids": past, "attention_mask": mask})[0],
                          before.run([name], {"input_ids": clipped, "attention_mask": mask})[0])


def test_the_build_hands_tensorrt_the_clamped_graph(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The network, and reproduce.sh's trtexec, read the clamped graph; the options that a plan's
    metadata records name the clamps, so a plan built before them is rebuilt."""
    ctx = dataclasses.replace(_ctx(tmp_path), onnx_path=_graph(tmp_path / "model.onnx"))
    options = engine_options(ctx)
    assert options.index_clamps == (("input_ids", ROWS),) and options.to_json()["index_clamps"] == {"input_ids": ROWS}
    parsed: list[Path] = []

    class Parsed(Exception):
        pass

    def network(path: Path) -> Any:
        parsed.append(path)
        raise Parsed

    monkeypatch.setattr(te, "NetworkFromOnnxPath", network)
    with pytest.raises(Parsed):
        plugin.build_engine(ctx, H100, tmp_path / "repo" / "model.plan", options=options, onnx_sha="abc")
    (path,) = parsed
    assert path == tmp_path / "tensorrt" / H100.fingerprint / "clamped" / "model.onnx"
    assert f"--onnx={path}" in (path.parent.parent / "reproduce.sh").read_text()
    assert _run(path, np.array([[ROWS]], np.int64))[0, 0, 0] == (ROWS - 1) * 4
    before = {**options.to_json()}
    before.pop("index_clamps")
    meta = te.EngineMetadata(tensorrt_version=H100.tensorrt_version, gpu_name=H100.gpu_name,
                             compute_capability=H100.compute_capability, onnx_sha256="abc", options=before)
    assert te.mismatches(meta, platform=H100, onnx_sha256="abc", options=options) == ["build options or profiles changed"]
    # a model with no table to clamp records the options it did before: its plans are not rebuilt
    assert "index_clamps" not in engine_options(_ctx(tmp_path / "none")).to_json()


def test_ids_that_reach_the_table_through_a_cast_or_reshape_are_found_and_clamped(tmp_path: Path) -> None:
    """tf2onnx casts int32 ids to int64 before the lookup, other exporters reshape them: the table's rows
    are still found (the config's vocab_sizes, which the clients check against) and the clamp still
    applies, before the cast, where an int64 id past int32 would wrap."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from tritonbundle.runtimes.base import index_tables

    table = numpy_helper.from_array(np.arange(ROWS * 4, dtype=np.float32).reshape(ROWS, 4), "table")
    flat = numpy_helper.from_array(np.array([-1], np.int64), "flat")
    graph = helper.make_graph(
        [helper.make_node("Cast", ["input_ids"], ["ids64"], to=TensorProto.INT64),
         helper.make_node("Reshape", ["ids64", "flat"], ["ids_flat"]),
         helper.make_node("Gather", ["table", "ids_flat"], ["embedded"])], "g",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT32, ["batch", "sequence"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT32, ["batch", "sequence"])],
        [helper.make_tensor_value_info("embedded", TensorProto.FLOAT, ["n", 4])], [table, flat])
    source = tmp_path / "model.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(source))
    tables = index_tables(source, ["input_ids", "attention_mask"])
    assert tables == {"input_ids": ROWS}
    clamped = clamp_indices(source, tmp_path / "clamped" / "model.onnx", tables)
    import onnxruntime as ort

    session = ort.InferenceSession(str(clamped), providers=["CPUExecutionProvider"])
    ids = np.array([[2, ROWS + 7, -3]], np.int32)
    out = session.run(["embedded"], {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0]
    assert np.array_equal(out[:, 0], np.array([2, ROWS - 1, 0]) * 4)


def test_a_cast_that_changes_the_ids_is_not_followed_and_the_order_of_nodes_does_not_matter(tmp_path: Path) -> None:
    """ids -> Cast(bool) -> Cast(int64) -> a 2-row table is not the vocabulary (a review's case: every valid
    id but 0 would have been refused, and the clamp would have sent them all to row 1); the nodes are
    listed consumers first, which ONNX Runtime runs anyway."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from tritonbundle.runtimes.base import index_tables

    words = numpy_helper.from_array(np.zeros((1000, 4), np.float32), "words")
    two = numpy_helper.from_array(np.zeros((2, 4), np.float32), "two")
    flat = numpy_helper.from_array(np.array([-1], np.int64), "flat")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["words", "ids_flat"], ["embedded"]),
         helper.make_node("Gather", ["two", "nonzero"], ["flags"]),
         helper.make_node("Reshape", ["ids32", "flat"], ["ids_flat"]),
         helper.make_node("Cast", ["input_ids"], ["ids32"], to=TensorProto.INT32),
         helper.make_node("Cast", ["is_set"], ["nonzero"], to=TensorProto.INT64),
         helper.make_node("Cast", ["input_ids"], ["is_set"], to=TensorProto.BOOL)], "g",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("embedded", TensorProto.FLOAT, ["n", 4]),
         helper.make_tensor_value_info("flags", TensorProto.FLOAT, ["batch", "sequence", 4])], [words, two, flat])
    source = tmp_path / "model.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(source))
    assert index_tables(source, ["input_ids"]) == {"input_ids": 1000}
