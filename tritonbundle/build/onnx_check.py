"""Check an ONNX graph against the manifest before any engine work.

Catches: inputs/outputs the graph does not have, wrong data types or ranks, a static dimension
where the manifest declares a dynamic one, and a profile range the graph cannot take (probed with
ONNX Runtime at the largest sequence length, which is where position-embedding tables run out).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tritonbundle.errors import ConfigError
from tritonbundle.manifest import ModelSpec, TensorDecl
from tritonbundle.modelconfig import numpy_dtype

# onnx.TensorProto data types -> config names
ONNX_DTYPES = {1: "FP32", 2: "UINT8", 3: "INT8", 4: "UINT16", 5: "INT16", 6: "INT32", 7: "INT64", 8: "STRING",
                9: "BOOL", 10: "FP16", 11: "FP64", 12: "UINT32", 13: "UINT64", 16: "BF16"}


def _check_tensor(model: str, kind: str, decl: TensorDecl, value_info: object, path: Path) -> None:
    ttype = value_info.type.tensor_type  # type: ignore[attr-defined]
    dtype = ONNX_DTYPES.get(ttype.elem_type, f"onnx type {ttype.elem_type}")
    where = f"model {model}: {kind} {decl.name!r}"
    if dtype != decl.dtype:
        raise ConfigError(f"{where}: the manifest says {decl.dtype}, the ONNX graph {path} has {dtype}; fix the manifest's dtype")
    dims = list(ttype.shape.dim)
    if len(dims) != len(decl.shape):
        raise ConfigError(
            f"{where}: the manifest declares rank {len(decl.shape)} {list(decl.shape)}, the graph has rank {len(dims)}"
        )
    for axis, (declared, actual) in enumerate(zip(decl.shape, dims)):
        static = actual.dim_value if actual.HasField("dim_value") else None
        if isinstance(declared, str) and static is not None and static > 0:
            raise ConfigError(
                f"{where}: dimension {axis} is declared dynamic ({declared!r}) but the graph fixes it to {static}; "
                "re-export with a dynamic axis there (torch.onnx.export dynamic_axes) or declare the static size"
            )
        if isinstance(declared, int) and static is not None and static > 0 and static != declared:
            raise ConfigError(f"{where}: dimension {axis} is {declared} in the manifest but {static} in the graph")


def check_graph(spec: ModelSpec, onnx_path: Path, *, probe: bool = True) -> None:
    import onnx

    if not onnx_path.exists():
        raise ConfigError(f"model {spec.name}: ONNX file {onnx_path} does not exist (run `tritonbundle export`)")
    try:
        graph = onnx.load(str(onnx_path), load_external_data=False).graph
    except Exception as e:  # noqa: BLE001 - onnx raises DecodeError and friends
        raise ConfigError(f"model {spec.name}: {onnx_path} is not a readable ONNX model: {e}") from e
    initializers = {i.name for i in graph.initializer}
    graph_inputs = {i.name: i for i in graph.input if i.name not in initializers}
    graph_outputs = {o.name: o for o in graph.output}
    for kind, decls, available in (("input", spec.inputs, graph_inputs), ("output", spec.outputs, graph_outputs)):
        for decl in decls:
            if decl.name not in available:
                raise ConfigError(
                    f"model {spec.name}: the ONNX graph {onnx_path} has no {kind} named {decl.name!r}; "
                    f"its {kind}s are: {', '.join(sorted(available)) or '(none)'}"
                )
            _check_tensor(spec.name, kind, decl, available[decl.name], onnx_path)
    missing = sorted(set(graph_inputs) - {d.name for d in spec.inputs})
    if missing:
        raise ConfigError(f"model {spec.name}: the graph also needs inputs {missing}; declare them in the manifest")
    if probe and spec.has_sequence and all(a.max for a in spec.axes):
        probe_range(spec, onnx_path)


def probe_range(spec: ModelSpec, onnx_path: Path) -> None:
    """Run the graph once at batch 1 x max_sequence_length (every other named axis at its max): fails fast
    if the range is too long."""
    import onnxruntime as ort

    sizes = {a.name: a.max for a in spec.axes}
    feed = {}
    for t in spec.inputs:
        shape = tuple(1 if (i == 0 and d == "batch") else sizes[d] if isinstance(d, str) else int(d)
                      for i, d in enumerate(t.shape))
        feed[t.name] = np.ones(shape, dtype=numpy_dtype(t.dtype))
    try:
        session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
        session.run(None, feed)
    except Exception as e:  # noqa: BLE001
        first = str(e).strip().splitlines()[0][:300]
        raise ConfigError(
            f"model {spec.name}: the graph cannot take sequence length {spec.max_sequence_length} "
            f"(max_sequence_length in the manifest): ONNX Runtime says: {first}. Lower max_sequence_length "
            "to what the model supports (BERT-style models: 512)."
        ) from e
