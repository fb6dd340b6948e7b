"""What a served model is and what each client method needs of it: the model's description
(metadata + config, its task), the checks a client runs before sending, and the reading of the
text tasks' answers. Nothing here does I/O."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from tritonbundle import contract
from tritonbundle.errors import ClientError, MetadataMismatchError

#: The client method that calls each task's user-facing model (tritonbundle.tasks says the same).
METHODS = contract.TASK_METHODS


@dataclass(frozen=True)
class TensorInfo:
    name: str
    datatype: str  # protocol name: BYTES, INT64, FP32...
    shape: tuple[int, ...]  # as the metadata reports it (batch included as -1 when batched)


@dataclass(frozen=True)
class ModelInfo:
    name: str
    version: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    max_batch_size: int
    parameters: dict[str, str] = field(default_factory=dict)

    def input(self, name: str) -> TensorInfo:
        for t in self.inputs:
            if t.name == name:
                return t
        raise KeyError(name)

    @property
    def task(self) -> str | None:
        """What the model's config says it is (:class:`tritonbundle.contract.TaskParameters`: ``tensor``,
        ``text-embedding``, ``text-classification``, ``text-pair``); None for a model the build did not
        write (see :meth:`kind`)."""
        return self.parameters.get("task") or None

    def kind(self) -> str:
        """The task, else a guess from the inputs: ``text-pair`` with BYTES ``QUERY`` and ``TEXT``,
        ``text-embedding`` with a BYTES ``TEXT``, else ``tensor``."""
        return contract.task_of(self.parameters, {t.name: t.datatype for t in self.inputs})

    @cached_property
    def encoder(self) -> contract.EncoderParameters | None:
        """What the encoder's config says about token input (None for a model the build did not write);
        decoded once, not for every request."""
        try:
            return contract.EncoderParameters.from_parameters(self.parameters, model=self.name)
        except contract.ContractError:
            return None

    @property
    def padding_targets(self) -> tuple[int, ...]:
        """Lengths the build stage's plan pads to."""
        return tuple(sorted(self.encoder.padding_targets)) if self.encoder else ()

    @property
    def max_sequence_length(self) -> int:
        return self.encoder.max_sequence_length if self.encoder else 0

    @property
    def vocab_sizes(self) -> dict[str, int]:
        """Input name -> the ids its values may take (``EncoderParameters.vocab_sizes``; empty: unknown)."""
        return self.encoder.vocab_sizes if self.encoder else {}


def model_info(metadata: dict[str, Any], config: dict[str, Any]) -> ModelInfo:
    """Build :class:`ModelInfo` from the JSON-shaped metadata and config (HTTP form, or gRPC via
    ``as_json=True``)."""
    cfg = config.get("config", config)

    def tensors(items: Sequence[dict[str, Any]]) -> tuple[TensorInfo, ...]:
        return tuple(TensorInfo(t["name"], t["datatype"], tuple(int(d) for d in t.get("shape", ()))) for t in items)

    params = {}
    for key, value in (cfg.get("parameters") or {}).items():
        params[key] = value.get("string_value", "") if isinstance(value, dict) else str(value)
    versions = metadata.get("versions") or [""]
    return ModelInfo(
        name=metadata["name"],
        version=str(versions[-1]),
        inputs=tensors(metadata.get("inputs", ())),
        outputs=tensors(metadata.get("outputs", ())),
        max_batch_size=int(cfg.get("max_batch_size", 0) or 0),
        parameters=params,
    )


def check_inputs(info: ModelInfo, expected: dict[str, str], *, protocol: str, url: str) -> None:
    """Raise :class:`MetadataMismatchError` naming both sides if the served inputs differ."""
    served = {t.name: t.datatype for t in info.inputs}
    missing = [n for n in expected if n not in served]
    if missing:
        raise MetadataMismatchError(
            f"model {info.name!r} at {url} over {protocol} has inputs {_fmt(served)}, "
            f"but the client expects {_fmt(expected)}",
            model=info.name, protocol=protocol,
        )
    wrong = {n: (served[n], d) for n, d in expected.items() if served[n] != d}
    if wrong:
        details = ", ".join(f"{n}: server {s}, client {c}" for n, (s, c) in wrong.items())
        raise MetadataMismatchError(
            f"model {info.name!r} at {url} over {protocol}: input data types differ ({details})",
            model=info.name, protocol=protocol,
        )


def check_output(info: ModelInfo, output: str | None, *, protocol: str, url: str) -> str:
    names = [t.name for t in info.outputs]
    if output is None:
        if not names:
            raise MetadataMismatchError(f"model {info.name!r} has no outputs", model=info.name, protocol=protocol)
        return names[0]
    if output not in names:
        raise MetadataMismatchError(
            f"model {info.name!r} at {url} over {protocol} has outputs {names}, but the client expects {output!r}",
            model=info.name, protocol=protocol,
        )
    return output


def _fmt(tensors: dict[str, str]) -> str:
    return "[" + ", ".join(f"{n} ({d})" for n, d in tensors.items()) + "]"


#: The task each text method calls (``infer`` calls any model).
TASK_OF_METHOD = {"embed": "text-embedding", "classify": "text-classification", "rerank": "text-pair"}


def check_method(info: ModelInfo, method: str, *, text_input: str, protocol: str, url: str) -> None:
    """Raise :class:`MetadataMismatchError` when ``method`` (``embed``, ``classify``, ``rerank``) cannot
    call the model: its config names another task, or (a model the build did not write) it lacks the
    inputs or outputs the method sends and reads. The message names the model, its inputs and the
    method that calls it."""
    expected_task = TASK_OF_METHOD[method]
    served = {t.name: t.datatype for t in info.inputs}
    where = f"model {info.name!r} at {url} over {protocol}"

    def mismatch(problem: str) -> MetadataMismatchError:
        use = METHODS.get(info.kind(), "infer")
        if use == method:  # the task fits, the tensors do not: a model outside the contract, or text_input=...
            hint = "infer() sends whatever tensors it takes"
        elif use == "infer":
            hint = "call infer({input name: numpy array, ...}) with its tensors instead"
        else:
            hint = f"call {use}() instead"
        return MetadataMismatchError(f"{where} {problem}: {hint}", model=info.name, protocol=protocol)

    sends = {**({contract.QUERY_INPUT: "BYTES"} if method == "rerank" else {}), text_input: "BYTES"}
    if info.task is not None and info.task != expected_task:
        raise mismatch(f"is a {info.task} model with inputs {_fmt(served)}; {method}() sends {_fmt(sends)} to "
                       f"{expected_task} models")
    if any(served.get(n) != d for n, d in sends.items()):
        raise mismatch(f"has inputs {_fmt(served)}, but {method}() sends {_fmt(sends)}")
    reads = {"classify": (contract.LABEL_OUTPUT, contract.SCORE_OUTPUT), "rerank": (contract.SCORE_OUTPUT,)}
    names = [t.name for t in info.outputs]
    missing = [n for n in reads.get(method, ()) if n not in names]
    if missing:
        raise mismatch(f"has outputs {names}, but {method}() reads {list(reads[method])}")



# -- the text tasks' answers ----------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Classification:
    """One text's answer from a text-classification model."""

    #: The top class's label (the model's labels; the class index as text when it has none).
    label: str
    #: Its softmax probability.
    score: float
    #: The encoder's logits for this text, float32 [classes] (empty when the model returns none).
    logits: np.ndarray[Any, Any]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Classification):
            return NotImplemented
        return (self.label, self.score) == (other.label, other.score) and np.array_equal(self.logits, other.logits)

    __hash__ = None  # type: ignore[assignment]  # holds an array, like the array itself


def logits_output(info: ModelInfo) -> str | None:
    """The encoder's logits among a text-classification model's outputs: the first that is not label or score."""
    return next((t.name for t in info.outputs if t.name not in (contract.LABEL_OUTPUT, contract.SCORE_OUTPUT)), None)


def task_outputs(logits: str | None, *added: str) -> list[str]:
    """The outputs a classify or rerank request names: what the task added, and the logits with them
    (``Classification.logits``). Repositories built before the post-processing step passed the logits
    through fail a request that names ``score`` without ``logits`` on Triton 2.51 ("unexpected
    deadlock, at least one output is not set"); naming both works with every build."""
    return [*([logits] if logits else []), *added]


def classifications(outputs: dict[str, np.ndarray[Any, Any]], logits: str | None) -> list[Classification]:
    """Rows of ``label`` (BYTES [N, 1]), ``score`` (FP32 [N, 1]) and the logits (FP32 [N, classes])."""
    labels = outputs[contract.LABEL_OUTPUT].reshape(-1)
    scores = outputs[contract.SCORE_OUTPUT].reshape(-1)
    if labels.shape[0] != scores.shape[0]:
        raise ClientError(f"the response has {labels.shape[0]} labels for {scores.shape[0]} scores")
    n = labels.shape[0]
    rows = (outputs[logits].reshape(n, -1).astype(np.float32, copy=False) if logits is not None
            else np.empty((n, 0), dtype=np.float32))
    return [
        Classification(label=v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v), score=float(s), logits=row)
        for v, s, row in zip(labels, scores, rows)
    ]


def response_output_names(result: Any) -> list[str]:
    """The outputs a tritonclient ``InferResult`` holds, in the response's order: HTTP's
    ``get_response()`` is the JSON header (``{"outputs": [{"name": ...}, ...]}``), gRPC's a
    ``ModelInferResponse`` whose ``outputs`` have ``.name``."""
    response = result.get_response()
    items = (response.get("outputs") or []) if isinstance(response, dict) else response.outputs
    return [str(o["name"] if isinstance(o, dict) else o.name) for o in items]
