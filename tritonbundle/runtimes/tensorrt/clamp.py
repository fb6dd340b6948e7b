"""Token ids clamped to their table before a TensorRT plan gathers with them.

TensorRT's Gather requires every index to lie in ``[0, rows)`` ("Every element I_j in indices must obey
0 <= I_j < input_dimensions[axis]", the operator reference, docs.nvidia.com/deeplearning/tensorrt,
operators/Gather) and does not check it: an id past the vocabulary sent straight to ``<name>_encoder``
(a KServe caller over gRPC, which the edge cannot route by model) reads outside the embedding table on
the GPU. ONNX Runtime refuses such ids itself, so only the graph TensorRT builds from is changed: each
graph input that indexes a table (:func:`tritonbundle.runtimes.base.index_tables`) goes through
``Max(ids, 0)`` and ``Min(., rows - 1)`` first, elementwise ops TensorRT runs on int32 and int64 (the
operator reference, operators/ElementWise). An id in ``[0, rows)`` is unchanged, so the plan's answers to
valid requests are the graph's; any other id gets the first or last row's embedding, a wrong answer
instead of a read outside the table (a negative id, which ONNX's Gather counts from the end, takes row
0: onnx-tensorrt's Gather importer does not wrap negative indices either). The clients and the gateway
still refuse such ids with a message (``contract.token_ids_problem``); this is what is left for a caller
that skips them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tritonbundle.errors import BuildError
from tritonbundle.files import onnx_weight_files
from tritonbundle.runtimes.base import link_or_copy

#: ONNX Max and Min take integer tensors from opset 12 on (onnx/docs/Changelog.md, Max-12, Min-12).
MIN_OPSET = 12


def clamp_indices(source: Path, target: Path, bounds: Mapping[str, int]) -> Path:
    """Write ``source`` to ``target`` with each graph input named in ``bounds`` (input -> rows of the
    table it indexes) clamped to ``[0, rows - 1]`` before any node reads it; returns ``target``. Only the
    graph is read and rewritten: external weights are hard-linked beside ``target`` under their names
    (copied across file systems), never loaded."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(source), load_external_data=False)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < MIN_OPSET:
        raise BuildError(f"{source.name}: opset {opset} has no integer Max/Min to clamp token ids with "
                         f"(needs {MIN_OPSET} or later): export the model with a newer opset")
    graph = model.graph
    inputs = {i.name: i for i in graph.input}
    clamps: list[Any] = []
    for name, rows in sorted(bounds.items()):
        if name not in inputs:
            raise BuildError(f"{source.name}: no graph input {name!r} to clamp (inputs: {', '.join(inputs)})")
        if rows < 1:
            raise BuildError(f"{source.name}: input {name!r} indexes a table of {rows} rows")
        dtype = helper.tensor_dtype_to_np_dtype(inputs[name].type.tensor_type.elem_type)
        if not np.issubdtype(dtype, np.integer):
            raise BuildError(f"{source.name}: input {name!r} is {dtype}, not integer ids")
        low, high, floor, clamped = (f"{name}__{part}" for part in ("low", "high", "floor", "clamped"))
        graph.initializer.extend([numpy_helper.from_array(np.array(0, dtype), low),
                                  numpy_helper.from_array(np.array(rows - 1, dtype), high)])
        _rename_uses(graph.node, name, clamped)
        clamps += [helper.make_node("Max", [name, low], [floor], name=f"{name}__clamp_low"),
                   helper.make_node("Min", [floor, high], [clamped], name=f"{name}__clamp_high")]
    nodes = clamps + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    target.parent.mkdir(parents=True, exist_ok=True)
    for location in onnx_weight_files(source):  # the tensors keep pointing at them, now beside target
        link_or_copy(source.parent / location, target.parent / location)
    onnx.save_model(model, str(target))
    return target


def _rename_uses(nodes: Iterable[Any], old: str, new: str) -> None:
    """Every node input named ``old`` becomes ``new``, in subgraphs too (an If or Loop body may read an
    outer graph's tensor by its name)."""
    from onnx import AttributeProto

    for node in nodes:
        for k, name in enumerate(node.input):
            if name == old:
                node.input[k] = new
        for attribute in node.attribute:
            if attribute.type == AttributeProto.GRAPH:
                _rename_uses(attribute.g.node, old, new)
            elif attribute.type == AttributeProto.GRAPHS:
                for graph in attribute.graphs:
                    _rename_uses(graph.node, old, new)
