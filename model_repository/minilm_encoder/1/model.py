"""Triton Python-backend model running an ONNX model with ONNX Runtime (the CPU server's runtime).

Works for any ONNX model whose config inputs/outputs match the graph's. Requests gathered by the
dynamic batcher are run as one batch per shape. Inputs with a dynamic (-1) non-batch dimension are
ragged (``allow_ragged_batch``): along ``sequence`` each request is padded to the longest request in
the batch (the ragged policy the build stage's plan picks for Python-backend runtimes), and outputs
that carry that dimension are cut back to each request's own length; requests that differ on any
other named axis (an image's height) run in separate session runs, never padded. (Ragged rather than
Triton's equal-shape batching: 2.51's dynamic batcher, enforcing equal shapes, sometimes leaves a
request in its queue for its 500 ms idle wait; measured in tests/test_user_models.py.)

Settings: :class:`tritonbundle.contract.OnnxRuntimeParameters` in the config's ``parameters``:
  onnx_file            model file in the version directory
  intra_op_threads     ONNX Runtime threads per instance (0: ONNX Runtime's default)
  max_sequence_length  longest dynamic dimension accepted (0: no limit); longer requests get INVALID_ARG
  pad_values           input name -> padding value (default 0)

Client errors (INVALID_ARG: HTTP 400, gRPC INVALID_ARGUMENT) rather than ONNX Runtime failures: an input
with an empty dynamic dimension, an index input outside the table it gathers from (found in the graph:
a ``Gather`` of an initializer by a graph input, such as token ids into the word embeddings), and any
error ONNX Runtime itself reports as an invalid argument.
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
if (_HERE / "tritonbundle").is_dir() and sys.path[:1] != [str(_HERE)]:
    sys.path.insert(0, str(_HERE))  # the package modules the build copied next to this file

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402

from tritonbundle.contract import OnnxRuntimeParameters, shape_problem, token_ids_problem  # noqa: E402
from tritonbundle.runtimes.stacks import dump_stacks_on_signal  # noqa: E402

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported outside Triton (tests, type checks)
    pb_utils = None

_NP = {
    "TYPE_BOOL": np.bool_, "TYPE_INT8": np.int8, "TYPE_INT16": np.int16, "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64, "TYPE_UINT8": np.uint8, "TYPE_UINT16": np.uint16, "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64, "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_FP64": np.float64,
}


def _error(message: str, code_name: str = "INVALID_ARG") -> Any:
    code = getattr(pb_utils.TritonError, code_name, None)
    return pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)


class RequestError(ValueError):
    pass


def exact_dims(axes: str, dims: list[int]) -> tuple[int, ...]:
    """Dynamic dims (indices into ``dims``, batch excluded) that requests in one run must share: every
    named axis but ``sequence``, which is padded. ``axes`` is the config's "batch,sequence" naming;
    without it every dynamic dim is a sequence (configs written before axes were named)."""
    names = axes.split(",")[1:] if axes else []
    if len(names) != len(dims):
        return ()
    return tuple(i for i, (d, name) in enumerate(zip(dims, names)) if d == -1 and name != "sequence")


def _sequence_first(name: str, inputs: list[tuple[str, Any, list[int]]], exact: dict[str, tuple[int, ...]]) -> bool:
    """Whether dim 1 of ``name`` is a padded (sequence) axis."""
    dims = next(d for n, _, d in inputs if n == name)
    return bool(dims) and dims[0] == -1 and 0 not in exact[name]


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        dump_stacks_on_signal()  # a stalled model can be read: runtimes/stacks.py
        config = json.loads(args["model_config"])
        params = OnnxRuntimeParameters.from_config(config)
        version_dir = Path(args["model_repository"]) / args["model_version"]
        options = ort.SessionOptions()
        if params.intra_op_threads > 0:
            options.intra_op_num_threads = params.intra_op_threads
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(
            str(version_dir / params.onnx_file), options, providers=["CPUExecutionProvider"]
        )
        self.max_batch = int(config.get("max_batch_size", 0))
        self.batched = self.max_batch > 0
        self.max_seq = params.max_sequence_length
        self.pad_values = params.pad_values
        self.inputs = [(i["name"], _NP[i["data_type"]], [int(d) for d in i["dims"]]) for i in config["input"]]
        self.exact_dims = {name: exact_dims(params.axes.get(name, ""), dims) for name, _, dims in self.inputs}
        self.outputs = [o["name"] for o in config["output"]]
        self.tables = params.vocab_sizes  # the build read them from the graph
        graph_inputs = {i.name for i in self.session.get_inputs()}
        missing = [name for name, _, _ in self.inputs if name not in graph_inputs]
        if missing:
            raise pb_utils.TritonModelException(
                f"config inputs {missing} are not inputs of the ONNX graph (graph inputs: {sorted(graph_inputs)})"
            )
        gc.freeze()  # what initialize() loaded lives as long as the process: keep full collections off it

    def _read(self, request: Any) -> dict[str, np.ndarray[Any, Any]]:
        arrays = {}
        for name, dtype, dims in self.inputs:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is None:
                raise RequestError(f"input {name} is missing")
            problem = shape_problem(name, tensor.shape(), dims, max_batch=self.max_batch, max_dynamic=self.max_seq)
            if problem:  # from the tensor's header: its data is never read
                raise RequestError(problem)
            array = tensor.as_numpy()
            expected_rank = len(dims) + (1 if self.batched else 0)
            if array.ndim != expected_rank:
                raise RequestError(f"input {name} must have rank {expected_rank}, got shape {list(array.shape)}")
            if array.dtype != dtype:
                raise RequestError(f"input {name} must be {np.dtype(dtype).name}, got {array.dtype.name}")
            if self.max_seq and any(
                d == -1 and size > self.max_seq for d, size in zip(dims, array.shape[1:])
            ):
                raise RequestError(
                    f"input {name} has shape {list(array.shape)}: longer than the largest supported "
                    f"sequence length {self.max_seq}"
                )
            if any(d == -1 and size == 0 for d, size in zip(dims, array.shape[1:])):
                raise RequestError(f"input {name} has shape {list(array.shape)}: a dynamic dimension is empty")
            problem = token_ids_problem(name, array, self.tables.get(name, 0))
            if problem:
                raise RequestError(problem)
            arrays[name] = array
        if self.batched:
            batches = {a.shape[0] for a in arrays.values()}
            lengths = {a.shape[1] for name, a in arrays.items() if _sequence_first(name, self.inputs, self.exact_dims)}
            if len(batches) > 1 or len(lengths) > 1:
                raise RequestError(f"inputs disagree on [batch, length]: "
                                   f"{sorted((n, list(a.shape[:2])) for n, a in arrays.items())}")
        return arrays

    def _pad(self, name: str, arrays: list[np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
        """Concatenate one input over requests, padding dynamic dims to the batch's longest."""
        target = list(np.max([a.shape for a in arrays], axis=0))
        pad_value = self.pad_values.get(name, 0)
        padded = []
        for a in arrays:
            if list(a.shape[1:]) != target[1:]:
                widths = [(0, 0)] + [(0, t - s) for s, t in zip(a.shape[1:], target[1:])]
                a = np.pad(a, widths, constant_values=pad_value)
            padded.append(a)
        return np.concatenate(padded, axis=0)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = [None] * len(requests)
        good = []
        for index, request in enumerate(requests):
            try:
                good.append((index, self._read(request)))
            except RequestError as e:
                responses[index] = pb_utils.InferenceResponse(output_tensors=[], error=_error(str(e)))
        # One session run per shape the batch holds (requests agree on every dynamic axis but sequence,
        # which is padded); models without a batch dimension run request by request.
        groups: dict[Any, list[tuple[int, dict[str, np.ndarray[Any, Any]]]]] = {}
        for item in good:
            key = tuple(tuple(item[1][n].shape[d + 1] for d in dims) for n, dims in self.exact_dims.items()) \
                if self.batched else item[0]
            groups.setdefault(key, []).append(item)
        for group in groups.values():
            self._run(group, responses)
        return responses

    def _run(self, group: list[tuple[int, dict[str, np.ndarray[Any, Any]]]], responses: list[Any]) -> None:
        if self.batched:
            feed = {name: self._pad(name, [arrays[name] for _, arrays in group]) for name, _, _ in self.inputs}
        else:
            feed = group[0][1]
        try:
            results = self.session.run(self.outputs, feed)
        except Exception as e:  # noqa: BLE001 - any ONNX Runtime failure becomes an error response
            # ONNX Runtime's InvalidArgument: the request's content, not the server, is at fault.
            code = "INVALID_ARG" if type(e).__name__ == "InvalidArgument" else "INTERNAL"
            for index, _ in group:
                responses[index] = pb_utils.InferenceResponse(
                    output_tensors=[], error=_error(f"ONNX Runtime failed: {e}", code)
                )
            return
        start = 0
        for index, arrays in group:
            first = next(iter(arrays.values()))
            rows = first.shape[0] if self.batched else 0
            tensors = []
            for name, value in zip(self.outputs, results):
                part = value[start : start + rows] if self.batched else value
                # Cut a padded sequence dimension back to this request's own length.
                if self.batched and part.ndim >= 3 and first.ndim >= 2 and part.shape[1] != first.shape[1]:
                    part = part[:, : first.shape[1]]
                tensors.append(pb_utils.Tensor(name, np.ascontiguousarray(part)))
            responses[index] = pb_utils.InferenceResponse(output_tensors=tensors)
            start += rows
