"""Small ONNX models built with onnx.helper (no torch), to prove the build stage is generic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def image_classifier(path: Path, *, static_batch: bool = False, dynamic_size: bool = False) -> Path:
    """pixels FP32 [batch, 3, 8, 8] -> logits FP32 [batch, 10] (mean over pixels, then a matmul); with
    ``dynamic_size`` the pixels are [batch, 3, height, width]."""
    batch: int | str = 4 if static_batch else "batch"
    size: list[int | str] = ["height", "width"] if dynamic_size else [8, 8]
    weights = numpy_helper.from_array(np.arange(30, dtype=np.float32).reshape(3, 10) / 30.0, "W")
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["pixels"], ["pooled"], axes=[2, 3], keepdims=0),
            helper.make_node("MatMul", ["pooled", "W"], ["logits"]),
        ],
        "image_classifier",
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, [batch, 3, *size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 10])],
        [weights],
    )
    return save(graph, path)


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
    return save(graph, path)


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
    return save(graph, path)


def mlp(path: Path, *, features: int = 16, hidden: int = 32, classes: int = 4) -> Path:
    """features FP32 [batch, 16] -> logits FP32 [batch, 4]: two dense layers with a ReLU, random weights."""
    rng = np.random.default_rng(1)
    inits = [
        numpy_helper.from_array(rng.standard_normal((features, hidden)).astype(np.float32) / 4, "W1"),
        numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32) / 4, "b1"),
        numpy_helper.from_array(rng.standard_normal((hidden, classes)).astype(np.float32) / 4, "W2"),
    ]
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["features", "W1"], ["h_mm"]),
            helper.make_node("Add", ["h_mm", "b1"], ["h"]),
            helper.make_node("Relu", ["h"], ["h_relu"]),
            helper.make_node("MatMul", ["h_relu", "W2"], ["logits"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", features])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])],
        inits,
    )
    return save(graph, path)


def three_input_encoder(path: Path, *, vocab: int = 50, width: int = 16, out: int = 8, output: str = "embedding") -> Path:
    """input_ids, attention_mask, token_type_ids INT64 [batch, sequence] -> embedding FP32 [batch, out]:
    token + type embeddings, masked mean, a two-layer GELU MLP (GEMMs and a non-linearity, as in
    real encoders), random weights (seed 0)."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((vocab, width)).astype(np.float32), "tok_emb"),
        numpy_helper.from_array(rng.standard_normal((2, width)).astype(np.float32) * 0.1, "type_emb"),
        numpy_helper.from_array(rng.standard_normal((width, 4 * width)).astype(np.float32) / np.sqrt(width), "W1"),
        numpy_helper.from_array(rng.standard_normal(4 * width).astype(np.float32) * 0.1, "b1"),
        numpy_helper.from_array(rng.standard_normal((4 * width, out)).astype(np.float32) / np.sqrt(4 * width), "W2"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
        numpy_helper.from_array(np.array(1e-6, dtype=np.float32), "eps"),
        numpy_helper.from_array(np.array(np.sqrt(0.5), dtype=np.float32), "rsqrt2"),
        numpy_helper.from_array(np.array(0.5, dtype=np.float32), "half"),
        numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one_f"),
    ]
    nodes = [
        helper.make_node("Gather", ["tok_emb", "input_ids"], ["tok"], axis=0),
        helper.make_node("Gather", ["type_emb", "token_type_ids"], ["typ"], axis=0),
        helper.make_node("Add", ["tok", "typ"], ["emb"]),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask_f", "axes2"], ["mask_3d"]),
        helper.make_node("Mul", ["emb", "mask_3d"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis1"], ["summed"], keepdims=0),
        helper.make_node("ReduceSum", ["mask_f", "axis1"], ["count"], keepdims=1),
        helper.make_node("Add", ["count", "eps"], ["count_eps"]),
        helper.make_node("Div", ["summed", "count_eps"], ["pooled"]),
        helper.make_node("MatMul", ["pooled", "W1"], ["h_mm"]),
        helper.make_node("Add", ["h_mm", "b1"], ["h"]),
        helper.make_node("Mul", ["h", "rsqrt2"], ["h_scaled"]),  # GELU: 0.5 * h * (1 + erf(h / sqrt 2))
        helper.make_node("Erf", ["h_scaled"], ["h_erf"]),
        helper.make_node("Add", ["h_erf", "one_f"], ["h_erf1"]),
        helper.make_node("Mul", ["h", "h_erf1"], ["h_gelu2"]),
        helper.make_node("Mul", ["h_gelu2", "half"], ["h_gelu"]),
        helper.make_node("MatMul", ["h_gelu", "W2"], [output]),
    ]
    inits.append(numpy_helper.from_array(np.array([2], dtype=np.int64), "axes2"))
    graph = helper.make_graph(
        nodes, "three_input_encoder",
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
         for n in ("input_ids", "attention_mask", "token_type_ids")],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, ["batch", out])],
        inits,
    )
    return save(graph, path)


def text_classifier(path: Path, *, classes: int = 3) -> Path:
    """A BERT-style classifier as a Hugging Face export has it: input_ids, attention_mask, token_type_ids
    [batch, sequence] -> logits FP32 [batch, classes], over BERT's 30,522-token vocabulary (so the MiniLM
    package's tokenizer.json serves it), random weights."""
    return three_input_encoder(path, vocab=30522, width=16, out=classes, output="logits")


def token_batches(vocab: int, lengths: list[int], *, rows: int = 8, seed: int = 0) -> dict[str, np.ndarray]:
    """Calibration/gate data for the three-input encoder: ``len(lengths)`` samples padded to the longest."""
    rng = np.random.default_rng(seed)
    width = max(lengths)
    ids = np.zeros((len(lengths), width), dtype=np.int64)
    mask = np.zeros_like(ids)
    types = np.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = rng.integers(1, vocab, size=n)
        mask[i, :n] = 1
        types[i, n // 2 : n] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
