"""The contract between the build stage and the models it serves: one home for what both sides read.

* model names (the ensemble keeps the manifest's name; ``<name>_tokenizer``, ``<name>_encoder``),
* the restricted-API header the server and the clients agree on,
* the padding rule (a row of ``n`` tokens is padded to the smallest target that holds it),
* one typed parameter record per served model: the build writes a record into ``config.pbtxt`` with
  :meth:`Parameters.to_parameters`, the served ``model.py`` reads it back with
  :meth:`Parameters.from_config`, and the build reads every written config back through the same
  record (strictly) before it installs anything, so a renamed or missing parameter fails the build,
  not the first request.

The build copies this file next to every served ``model.py`` (see :mod:`tritonbundle.runtimes.served`),
so it imports nothing from the project: only the standard library and numpy, which every Python
backend has.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

# -- names -------------------------------------------------------------------------------------------
#: The ensemble's text input (every text task); a text-pair model's passages.
TEXT_INPUT = "TEXT"
#: A text-pair model's first text of each pair (the query a cross-encoder scores passages against).
QUERY_INPUT = "QUERY"
#: What a text-classification ensemble adds to the encoder's logits: the top label (BYTES) and its
#: probability; a text-pair ensemble's relevance score per pair (FP32).
LABEL_OUTPUT = "label"
SCORE_OUTPUT = "score"
#: Every text model's count of the tokens each text (or pair) became (INT32, one per row): what usage
#: is metered in, from the tokenizer that fed the encoder.
TOKENS_OUTPUT = "tokens"
#: A text longer than this (UTF-8) is refused before tokenizing (it is truncated to max_length tokens anyway).
MAX_TEXT_BYTES = 1 << 20


def has_content(text: str) -> bool:
    """Something a tokenizer keeps: not only whitespace and control characters ("\\x00")."""
    return any(not ch.isspace() and ch.isprintable() for ch in text)
#: The tasks: what the user-facing model takes and returns (tritonbundle.tasks), and the client method
#: that calls each.
TASK_METHODS = {"tensor": "infer", "text-embedding": "embed", "text-classification": "classify", "text-pair": "rerank"}
TASKS = tuple(TASK_METHODS)
TEXT_TASKS = TASKS[1:]


def task_of(parameters: Mapping[str, str], inputs: Mapping[str, str]) -> str:
    """A served model's task: what its config says (``TaskParameters``, or an encoder's record), else a
    guess from its inputs (name -> protocol data type) for a model the build did not write: BYTES
    ``QUERY`` and ``TEXT``: text-pair; BYTES ``TEXT``: text-embedding; else tensor."""
    if parameters.get("task"):
        return str(parameters["task"])
    if inputs.get(TEXT_INPUT) == "BYTES":
        return "text-pair" if inputs.get(QUERY_INPUT) == "BYTES" else "text-embedding"
    return "tensor"


#: Header that unlocks the restricted APIs (model control, repository, shared memory, trace, logging).
RESTRICTED_HEADER = "tritonbundle-key"
#: Triton's gRPC server reads a restricted-protocol key from this prefix + the header name.
GRPC_RESTRICTED_PREFIX = "triton-grpc-protocol-"
#: Restricted API groups: everything that changes or reveals the server's state beyond inference.
RESTRICTED_APIS = ("model-repository", "shared-memory", "trace", "logging")


def encoder_name(model: str, *, text: bool = True) -> str:
    """The Triton model that runs the network: ``<model>_encoder`` behind a text ensemble, else ``model``."""
    return f"{model}_encoder" if text else model


def tokenizer_name(model: str) -> str:
    return f"{model}_tokenizer"


def postprocess_name(model: str) -> str:
    """The Python model after the encoder of a text-classification or text-pair ensemble."""
    return f"{model}_postprocess"


# -- releases ----------------------------------------------------------------------------------------
#: ``tritonbundle release`` pins the ensemble's encoder step to the serving version while a candidate is
#: loaded beside it; a caller of the encoder itself (``embed_tokens``: the clients, the OpenAI gateway's
#: token-id requests, ``loadtest --input tokens``) would get the newest loaded version, the candidate. The
#: clients name the pinned version, read on their first token call and then every PIN_REFRESH_S in the
#: background (clients/pin.py); the release waits PIN_SETTLE_S after moving the pin before it changes the
#: versions the encoder serves, so every caller has read the new pin first.
PIN_REFRESH_S = 0.5
PIN_SETTLE_S = 3 * PIN_REFRESH_S


def encoder_pin(ensemble: Mapping[str, Any], encoder: str) -> int:
    """The version ``ensemble``'s step pins ``encoder`` to (a config as JSON; -1: the newest, as unpinned)."""
    for step in (ensemble.get("ensemble_scheduling") or {}).get("step") or []:
        if step.get("model_name") == encoder:
            return int(step.get("model_version", -1))  # int64: a JSON string
    return -1


# -- the padding rule ----------------------------------------------------------------------------------
def target_index(lengths: Sequence[int] | np.ndarray[Any, Any], targets: Sequence[int]) -> np.ndarray[Any, Any]:
    """Per length, the index of the smallest target that holds it; a length above the last target is an error."""
    index = np.searchsorted(np.asarray(targets, dtype=np.int64), np.asarray(lengths, dtype=np.int64), side="left")
    if index.size and int(index.max()) >= len(targets):
        raise ValueError(f"a row of {int(np.max(lengths))} tokens is longer than the longest padding target {targets[-1]}")
    return index


def token_counts(mask: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """[rows, 1] INT32: the tokens of each row of an attention mask (:data:`TOKENS_OUTPUT`)."""
    counts: np.ndarray[Any, Any] = np.count_nonzero(np.asarray(mask), axis=1).astype(np.int32)
    return counts.reshape(-1, 1)


def pad_length(longest: int, targets: Sequence[int]) -> int:
    """The length a request whose longest row has ``longest`` tokens is padded to: the smallest target
    that holds it, or ``longest`` itself when there are no targets (the ragged policy) or none holds it."""
    ordered = sorted(targets)
    i = bisect.bisect_left(ordered, longest)
    return int(ordered[i]) if i < len(ordered) else int(longest)


# -- token input a served encoder accepts ------------------------------------------------------------------
# A request that calls an encoder directly (not through the ensemble's tokenizer) may carry anything. What
# breaks the model gets a client error naming the input: an id outside the embedding table is an index
# error on the CPU, and on a GPU a device-side assert that leaves the CUDA context (so the model) dead.
def token_ids_problem(name: str, ids: np.ndarray[Any, Any], vocab_size: int) -> str:
    """Why ``ids`` cannot index a table of ``vocab_size`` rows ('' when it can; no check when the size is 0)."""
    if ids.size == 0 or vocab_size <= 0:
        return ""
    low, high = int(ids.min()), int(ids.max())
    if low >= 0 and high < vocab_size:
        return ""
    bad = low if low < 0 else high
    where = [int(i) for i in np.argwhere(ids == bad)[0]]
    return f"input {name} holds {bad} at {where}: token ids must lie in [0, {vocab_size}) (the model's vocabulary)"


#: The most elements one input of a request may hold (2^28: 2 GiB of INT64), far above any request the
#: bundle serves; a shape past it is refused before its data is read.
MAX_INPUT_ELEMENTS = 1 << 28


def shape_problem(name: str, shape: Sequence[int], dims: Sequence[int], *, max_batch: int, max_dynamic: int = 0) -> str:
    """Why a request's input ``shape`` cannot be what the config says (``dims``: without the batch dimension
    when ``max_batch`` > 0; -1 dynamic), read from the tensor's header before its data ('' when it can).
    A shape whose byte count overflows (Triton 2.51 accepts ``[1, 2**61]`` with a ``binary_data_size`` of
    0) would otherwise kill the Python stub that maps it."""
    expected = len(dims) + (1 if max_batch > 0 else 0)
    if len(shape) != expected:
        return f"input {name} must have rank {expected}, got shape {list(shape)}"
    if any(int(d) < 0 for d in shape):
        return f"input {name} has shape {list(shape)}: a dimension is negative"
    if max_batch > 0 and int(shape[0]) > max_batch:
        return f"input {name} has batch {shape[0]}: the model takes at most {max_batch}"
    rest = list(shape[1:]) if max_batch > 0 else list(shape)
    for axis, (size, dim) in enumerate(zip(rest, dims)):
        if dim > 0 and int(size) != dim:
            return f"input {name} has shape {list(shape)}: dimension {axis + (1 if max_batch > 0 else 0)} must be {dim}"
        if dim < 0 and max_dynamic and int(size) > max_dynamic:
            return f"input {name} has shape {list(shape)}: longer than the largest supported length {max_dynamic}"
    count = 1
    for size in shape:
        count *= int(size)
    if count > MAX_INPUT_ELEMENTS:
        return f"input {name} has shape {list(shape)}: {count} elements, more than one request may carry"
    return ""


# -- parameter records ---------------------------------------------------------------------------------
#: The request header that carries a caller's tenant (set by the gateway from the caller's key, never by
#: the caller); tritonserver forwards it to the models as a request parameter of the same name.
TENANT_HEADER = "tritonbundle-tenant"


class ContractError(ValueError):
    """A config's parameters do not match the record its model reads."""


P = TypeVar("P", bound="Parameters")


def _encode(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _decode(raw: str, kind: Any, where: str) -> Any:
    try:
        if kind is bool:
            if raw not in ("true", "false"):
                raise ValueError(f"expected true or false, got {raw!r}")
            return raw == "true"
        if kind is int:
            return int(raw)
        if kind is float:
            return float(raw)
        if kind is str:
            return raw
        origin = typing.get_origin(kind)
        if origin is tuple:
            return tuple(int(x) for x in raw.split(",") if x.strip())
        if origin is dict:
            value = json.loads(raw or "{}")
            if not isinstance(value, dict):
                raise ValueError(f"expected a JSON object, got {raw!r}")
            return value
    except ValueError as e:
        raise ContractError(f"{where}: {e}") from None
    raise TypeError(f"{where}: no codec for {kind!r}")


_FIELD_TYPES: dict[type, dict[str, Any]] = {}


def _field_types(cls: type) -> dict[str, Any]:
    """A record's field types, resolved once: ``typing.get_type_hints`` compiles every annotation each
    call (1.4 ms per token request in the load generator before this was cached)."""
    if cls not in _FIELD_TYPES:
        _FIELD_TYPES[cls] = typing.get_type_hints(cls)
    return _FIELD_TYPES[cls]


@dataclasses.dataclass(frozen=True)
class Parameters:
    """Base of the parameter records: each field is one ``parameters`` entry of ``config.pbtxt``
    (a string on the wire: ints and floats as text, booleans as true/false, tuples of ints
    comma-separated, dicts as JSON)."""

    def to_parameters(self) -> dict[str, str]:
        return {f.name: _encode(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_parameters(cls: type[P], params: Mapping[str, str], *, strict: bool = False, model: str = "") -> P:
        """Decode a record; a missing key is an error, unless its field has a default (a key added later:
        a repository written before it still reads, with the default); with ``strict`` (the build's own
        check) every key must be there and no other."""
        where = f"model {model!r}" if model else cls.__name__
        hints = _field_types(cls)
        optional = {f.name for f in dataclasses.fields(cls)
                    if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
        missing = [k for k in cls.keys() if k not in params and (strict or k not in optional)]
        if missing:
            raise ContractError(
                f"{where}: config parameters lack {', '.join(missing)} (the served model reads {cls.__name__}: "
                f"{', '.join(cls.keys())}); rebuild the repository with the same tritonbundle as the model"
            )
        unknown = sorted(set(params) - set(cls.keys()))
        if strict and unknown:
            raise ContractError(f"{where}: config parameters {', '.join(unknown)} are not in {cls.__name__} "
                                f"({', '.join(cls.keys())})")
        values = {k: _decode(params[k], hints[k], f"{where}: parameter {k}") for k in cls.keys() if k in params}
        return cls(**values)

    @classmethod
    def from_config(cls: type[P], config: Mapping[str, Any]) -> P:
        """Decode from the model config as JSON (what the Python backend passes to ``initialize``)."""
        raw = config.get("parameters") or {}
        params = {k: (v.get("string_value", "") if isinstance(v, dict) else str(v)) for k, v in raw.items()}
        return cls.from_parameters(params, model=str(config.get("name", "")))


@dataclasses.dataclass(frozen=True)
class EncoderParameters(Parameters):
    """What every encoder's config says about its inputs (clients read it to pad token input)."""

    #: ``targets``: requests arrive padded to a target; ``ragged``: the model pads each batch itself.
    padding_policy: str
    #: The plan's sequence bucket edges (empty under the ragged policy).
    padding_targets: tuple[int, ...]
    #: Longer token input is refused.
    max_sequence_length: int
    #: The task when this model is the one users call (a ``tensor`` model); behind a text ensemble, the
    #: ensemble's task. Written by the build stage, not by the runtime.
    task: str = dataclasses.field(default="tensor", kw_only=True)
    #: Input name -> its dimensions as the manifest names them ("batch,3,height,width"): the load tests
    #: and ``tritonbundle infer --random`` draw each named axis's size from the traffic sample.
    axes: dict[str, str] = dataclasses.field(default_factory=dict, kw_only=True)
    #: Named axis -> "least,typical,largest" size the plan serves (typical: the ``opt`` of the bucket
    #: that holds most of the traffic), for requests made up without a traffic sample.
    axis_sizes: dict[str, str] = dataclasses.field(default_factory=dict, kw_only=True)
    #: Input name -> rows of the table its values index (token ids -> the vocabulary size), from the ONNX
    #: graph's Gather nodes: the server and the clients refuse ids outside it (a TensorRT plan does not
    #: check them). Empty where the build found none.
    vocab_sizes: dict[str, int] = dataclasses.field(default_factory=dict, kw_only=True)


@dataclasses.dataclass(frozen=True)
class TensorRTParameters(EncoderParameters):
    #: Read by Triton's TensorRT backend (``src/model_state.cc``): ``ON_PROFILE_CHANGE`` sizes the
    #: activation memory of each execution context for its own profile, not the largest.
    execution_context_allocation_strategy: str


@dataclasses.dataclass(frozen=True)
class OnnxRuntimeParameters(EncoderParameters):
    """The CPU server's ONNX Runtime model (``runtimes/onnxruntime/model.py``)."""

    onnx_file: str
    #: ONNX Runtime threads per instance (0: ONNX Runtime's default).
    intra_op_threads: int
    #: Input name -> padding value (default 0).
    pad_values: dict[str, int]


@dataclasses.dataclass(frozen=True)
class PyTorchParameters(EncoderParameters):
    """The pytorch runtime's model (``runtimes/pytorch/model.py``)."""

    weights_file: str
    config_file: str
    recipe: str
    random_weights: bool
    #: fp32 | fp16 | bf16 (GPU only; the CPU always computes in FP32).
    precision: str
    cuda_graphs: bool
    #: Batch sizes CUDA graphs are captured for.
    batch_buckets: tuple[int, ...]
    #: Several texts per row of a launch (the encoder's packed forward).
    packing: bool
    #: Batches one instance runs at once, each in a lane with its own CUDA stream and graphs: with more
    #: than one, ``execute()`` hands the batch to a lane's thread and returns (responses are sent from it).
    batches_in_flight: int = dataclasses.field(default=1, kw_only=True)


@dataclasses.dataclass(frozen=True)
class TokenizerParameters(Parameters):
    """The tokenizer model (``runtimes/tokenizer/model.py``)."""

    tokenizer_file: str
    #: Longer texts are truncated to this many tokens.
    max_length: int
    #: Longer texts are refused before tokenizing.
    max_text_bytes: int
    padding_targets: tuple[int, ...]
    pad_id: int
    #: Threads one call of the fast tokenizer uses (1: the calling thread only).
    threads: int
    #: Each row is a pair (QUERY, TEXT), tokenized together (text-pair); else one TEXT per row.
    pairs: bool = False


@dataclasses.dataclass(frozen=True)
class TaskParameters(Parameters):
    """What the user-facing model of a task says about itself (the ensemble's config): clients and the
    command line read it to choose ``embed``, ``classify``, ``rerank`` or ``infer``."""

    task: str


@dataclasses.dataclass(frozen=True)
class PostprocessParameters(Parameters):
    """The post-processing model of a text-classification or text-pair ensemble
    (``tasks/postprocess_model.py``)."""

    task: str
    #: The name under which it returns the encoder's logits (FP32 [batch, n]) it reads.
    logits: str
    #: Class index (as a string) -> label; empty: the index itself is the label.
    labels: dict[str, str]


@dataclasses.dataclass(frozen=True)
class TextPyTorchParameters(PyTorchParameters):
    """The pytorch runtime's model serving text (``tokenize_in_encoder``): the encoder's record plus the
    tokenizer's (``padding_targets`` is the same in both)."""

    tokenizer_file: str
    max_length: int
    max_text_bytes: int
    pad_id: int
    threads: int


#: Every record a served model reads, by the name the build stage records in the config.
RECORDS: dict[str, type[Parameters]] = {
    cls.__name__: cls
    for cls in (EncoderParameters, TensorRTParameters, OnnxRuntimeParameters, PyTorchParameters, TokenizerParameters,
                TextPyTorchParameters, TaskParameters, PostprocessParameters)
}
