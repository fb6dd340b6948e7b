"""Small ONNX models built with onnx.helper (no torch), to prove the build stage is generic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def image_classifier(path: Path, *, static_batch: bool = False) -> Path:
    """pixels FP32 [batch, 3, 8, 8] -> logits FP32 [batch, 10] (mean over pixels, then a matmul)."""
    batch: int | str = 4 if static_batch else "batch"
    weights = numpy_helper.from_array(np.arange(30, dtype=np.float32).reshape(3, 10) / 30.0, "W")
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["pixels"], ["pooled"], axes=[2, 3], keepdims=0),
            helper.make_node("MatMul", ["pooled", "W"], ["logits"]),
        ],
        "image_classifier",
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, [batch, 3, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 10])],
        [weights],
    )
    return _save(graph, path)


def token_classifier(path: Path) -> Path:
    """Three INT64 [batch, sequence] inputs -> logits FP32 [batch, 2] and token_scores FP32 [batch, sequence].

    token_scores = ids * mask + type_ids (as floats); logits = [sum(token_scores), count(mask)].
    """
    seq_inputs = [
        helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"])
        for name in ("input_ids", "attention_mask", "token_type_ids")
    ]
    one_axis = numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1")
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["input_ids", "attention_mask"], ["masked"]),
            helper.make_node("Add", ["masked", "token_type_ids"], ["scores_i"]),
            helper.make_node("Cast", ["scores_i"], ["token_scores"], to=TensorProto.FLOAT),
            helper.make_node("ReduceSum", ["token_scores", "axis1"], ["total"], keepdims=1),
            helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
            helper.make_node("ReduceSum", ["mask_f", "axis1"], ["count"], keepdims=1),
            helper.make_node("Concat", ["total", "count"], ["logits"], axis=1),
        ],
        "token_classifier",
        seq_inputs,
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2]),
            helper.make_tensor_value_info("token_scores", TensorProto.FLOAT, ["batch", "sequence"]),
        ],
        [one_axis],
    )
    return _save(graph, path)


def short_position_table(path: Path, *, positions: int = 16) -> Path:
    """input_ids INT64 [batch, sequence] -> out FP32 [batch, sequence, 4], with a position table of
    ``positions`` rows: longer sequences fail, like BERT past 512 tokens."""
    table = numpy_helper.from_array(np.ones((positions, 4), dtype=np.float32), "table")
    consts = [
        numpy_helper.from_array(np.array(1, dtype=np.int64), "one"),
        numpy_helper.from_array(np.array(0, dtype=np.int64), "zero"),
    ]
    graph = helper.make_graph(
        [
            helper.make_node("Shape", ["input_ids"], ["shape"]),
            helper.make_node("Gather", ["shape", "one"], ["length"], axis=0),
            helper.make_node("Range", ["zero", "length", "one"], ["positions"]),
            helper.make_node("Gather", ["table", "positions"], ["pos_emb"], axis=0),
            helper.make_node("Cast", ["input_ids"], ["ids_f"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["ids_f", "axes2"], ["ids_3d"]),
            helper.make_node("Add", ["ids_3d", "pos_emb"], ["out"]),
        ],
        "short_positions",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "sequence", 4])],
        [table, *consts, numpy_helper.from_array(np.array([2], dtype=np.int64), "axes2")],
    )
    return _save(graph, path)
