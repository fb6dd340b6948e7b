"""Triton Python-backend model: a classifier's or cross-encoder's logits in; the logits (passed through),
``label`` and ``score`` out.

Settings: :class:`tritonbundle.contract.PostprocessParameters` in the config's ``parameters``:
  task     text-classification: ``label`` (BYTES, the top class's label) and ``score`` (its softmax
           probability); text-pair: ``score`` per pair (the sigmoid of a single logit, or the softmax
           probability of class 1 of two: "relevant")
  logits   the name of the logits it returns (its one input holds the encoder's logits)
  labels   class index -> label (JSON); an index without a label is its own label

Every request of the dynamic batch is computed in one numpy call.
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

from tritonbundle.contract import LABEL_OUTPUT, SCORE_OUTPUT, PostprocessParameters, shape_problem  # noqa: E402
from tritonbundle.runtimes.stacks import dump_stacks_on_signal  # noqa: E402

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported outside Triton (tests, type checks)
    pb_utils = None


def softmax(logits: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    shifted = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    return np.asarray(e / e.sum(axis=1, keepdims=True))


def classify(logits: np.ndarray[Any, Any], labels: dict[str, str]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(label [n, 1] object of bytes, score [n, 1] float32) of each row of ``logits`` [n, classes]."""
    probs = softmax(logits.astype(np.float64))
    top = probs.argmax(axis=1)
    names = np.array([[labels.get(str(i), str(i)).encode()] for i in top], dtype=object).reshape(-1, 1)
    return names, probs[np.arange(len(top)), top].astype(np.float32).reshape(-1, 1)


def relevance(logits: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """score [n, 1] float32 of each pair: sigmoid of one logit, else the probability of class 1."""
    values = logits.astype(np.float64)
    if values.shape[1] == 1:
        score = 1.0 / (1.0 + np.exp(-values[:, 0]))
    else:
        score = softmax(values)[:, 1]
    return score.astype(np.float32).reshape(-1, 1)


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        dump_stacks_on_signal()  # a stalled model can be read: runtimes/stacks.py
        config = json.loads(args["model_config"])
        params = PostprocessParameters.from_config(config)
        self.input = config["input"][0]["name"]
        self.dims = [int(d) for d in config["input"][0]["dims"]]
        self.max_batch = int(config.get("max_batch_size", 0)) or (1 << 30)
        self.task = params.task
        self.logits = params.logits
        self.labels = params.labels
        gc.freeze()

    def execute(self, requests: list[Any]) -> list[Any]:
        responses: list[Any] = [None] * len(requests)
        good, arrays = [], []
        for index, request in enumerate(requests):
            tensor = pb_utils.get_input_tensor_by_name(request, self.input)
            problem = "input missing" if tensor is None else shape_problem(self.input, tensor.shape(), self.dims,
                                                                            max_batch=self.max_batch)
            if problem:  # from the tensor's header: its data is never read
                responses[index] = pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(problem))
                continue
            good.append(index)
            arrays.append(tensor.as_numpy())
        if not arrays:
            return responses
        rows = [a.shape[0] for a in arrays]
        logits = np.concatenate(arrays, axis=0)
        if self.task == "text-classification":
            names, scores = classify(logits, self.labels)
        else:
            names, scores = None, relevance(logits)
        start = 0
        for index, array, n in zip(good, arrays, rows):
            tensors = [pb_utils.Tensor(self.logits, array), pb_utils.Tensor(SCORE_OUTPUT, scores[start : start + n])]
            if names is not None:
                tensors.append(pb_utils.Tensor(LABEL_OUTPUT, names[start : start + n]))
            responses[index] = pb_utils.InferenceResponse(output_tensors=tensors)
            start += n
        return responses
