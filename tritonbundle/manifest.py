"""The models manifest (``build/models.yaml``): what to build, from what, for which runtime.

The YAML is validated against :data:`SCHEMA` (JSON Schema); every error names the key by its path (``models[0].precision``)
and, where the schema has them, the allowed values. The result is a tree of frozen dataclasses the build stage reads.

Shapes are written with the batch dimension included, using names for dynamic dimensions::

    inputs:
      - {name: input_ids, dtype: INT64, shape: [batch, sequence]}
    outputs:
      - {name: embedding, dtype: FP32, shape: [batch, 384]}

``batch`` (first position only) is the dynamic batch dimension; any other name is a dynamic axis whose
buckets are planned from the traffic sample (``sequence``: the token axis of text, the sample's
``tokens``; any other name, such as ``height`` or ``width``: the sample's ``shape``); integers are
static. ``axes`` bounds and buckets the named axes other than ``sequence``, as in
``axes: {height: {max: 1024, buckets: 2}, width: {max: 1024, buckets: 2}}``.

``task`` says what the user-facing model takes and returns (``tritonbundle.tasks``): ``tensor`` (the
graph's own inputs and outputs, the default), ``text-embedding``, ``text-classification`` or
``text-pair`` (text in: a tokenizer + encoder ensemble).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from tritonbundle import contract
from tritonbundle.errors import ConfigError
from tritonbundle.modelconfig import normalize_dtype

PRECISIONS = ("fp32", "fp16", "bf16", "int8")
TARGETS = ("cpu", "gpu")
TASKS = contract.TASKS
BATCH, SEQUENCE = "batch", "sequence"  # the batch dimension, the token axis; any other identifier is an axis too
AXIS_NAME = "^[A-Za-z_][A-Za-z0-9_]*$"
DEFAULT_AXIS_BUCKETS = 2  # of a named axis other than sequence when `axes` does not say


def knob(default: Any, schema: dict[str, Any], doc: str = "") -> Any:
    """A tunable manifest key: its default, its JSON Schema and its description, in one place."""
    return field(default=default, metadata={"schema": {**schema, **({"description": doc} if doc else {})}})


_BUCKETS = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 1}, "uniqueItems": True}


@dataclass(frozen=True, kw_only=True)
class Tunables:
    """Keys a model may set and ``defaults`` may set for every model: each defined once, here.

    The schema, the defaults and the typed fields of :class:`ModelSpec` all come from this class.
    """

    target: str = knob("cpu", {"enum": list(TARGETS)},
                       "cpu: the wheel's tritonserver (Python backend only); gpu: NGC tritonserver")
    #: Which runtime plug-in serves the network (``tritonbundle.runtimes``; validated by the build stage).
    runtime: str = knob("onnxruntime", {"type": "string", "minLength": 1},
                        "a runtime of tritonbundle.runtimes: onnxruntime, tensorrt, pytorch")
    precision: str = knob("fp32", {"enum": list(PRECISIONS)})
    batch_buckets: tuple[int, ...] = knob((1, 8, 32), _BUCKETS)
    sequence_buckets: int = knob(4, {"type": "integer", "minimum": 1, "maximum": 16})
    opt_percentile: float = knob(95.0, {"type": "number", "exclusiveMinimum": 0, "maximum": 100})
    max_queue_delay_us: int = knob(2000, {"type": "integer", "minimum": 0})
    preferred_batch_sizes: str = knob("buckets", {"enum": ["buckets", "max", "none"]},
                                      "dynamic batcher's preferred sizes: the batch buckets above 1, only the largest, "
                                      "or none (the batcher waits for max_batch_size or the queue delay)")
    #: Overload: at most this many requests wait per model; one that waited ``queue_timeout_us`` is
    #: rejected (UNAVAILABLE / HTTP 503) instead of piling up until clients time out.
    max_queue_size: int | str = knob(
        "auto", {"anyOf": [{"const": "auto"}, {"type": "integer", "minimum": 1}]},
        "requests that may wait per model (Triton counts the batch being formed among them); auto: two full "
        "batches per instance (runtimes.base.queue_size)")
    queue_timeout_us: int = knob(1_000_000, {"type": "integer", "minimum": 0})
    instances: int = knob(1, {"type": "integer", "minimum": 1})
    tokenizer_instances: int = knob(2, {"type": "integer", "minimum": 1},
                                    "Python-backend tokenizer instances (each uses one core)")
    tokenizer_queue_delay_us: int = knob(0, {"type": "integer", "minimum": 0},
                                         "how long the tokenizer's batcher waits to tokenize more requests in one call")
    tokenizer_threads: int = knob(1, {"type": "integer", "minimum": 1, "maximum": 64},
                                  "threads one call of the fast tokenizer uses, in each instance that tokenizes "
                                  "(1: the calling thread only)")
    workspace_mib: int = knob(4096, {"type": "integer", "minimum": 16})
    builder_optimization_level: int = knob(3, {"type": "integer", "minimum": 0, "maximum": 5})
    hardware_compatibility: str = knob("none", {"enum": ["none", "ampere+", "same-compute-capability"]})
    version_compatible: bool = knob(False, {"type": "boolean"})
    cuda_graphs: bool = knob(True, {"type": "boolean"})
    tokenize_in_encoder: bool = knob(False, {"type": "boolean"},
                                     "pytorch runtime: <name> is one Python model that tokenizes and encodes in "
                                     "the same process (no ensemble, no tokenizer model); <name>_encoder still "
                                     "takes token input, with one instance")
    packing: bool = knob(True, {"type": "boolean"},
                         "pytorch runtime: short texts share rows of a launch, each attending only to itself, "
                         "when that costs less than padding them to their own rows")
    batches_in_flight: int = knob(1, {"type": "integer", "minimum": 1, "maximum": 8}, (
        "pytorch runtime: batches one encoder instance runs at once, each with its own CUDA stream and graphs, so one "
        "batch's host work overlaps another's GPU work in one process (1: execute() runs its batch itself; H200: 2 did "
        "not raise the knee, with token rows or with tokenize_in_encoder: docs/benchmarks.md)"))
    multi_arch: bool = knob(False, {"type": "boolean"}, "name plans per compute capability (cc_model_filenames)")


def tunables_schema() -> dict[str, Any]:
    return {f.name: f.metadata["schema"] for f in fields(Tunables)}


_CONVERT: dict[str, Any] = {"int": int, "float": float, "bool": bool, "str": str, "tuple[int, ...]": lambda v: tuple(sorted(v)),
                            "int | str": lambda v: v}


def _tunable_value(f: Any, value: Any) -> Any:
    """A tunable's value in its field's type (YAML's 95 for a float knob becomes 95.0)."""
    return _CONVERT[f.type](value)


_TENSOR = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "dtype", "shape"],
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "dtype": {"type": "string"},
        "shape": {
            "type": "array",
            "minItems": 1,
            "items": {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "string", "pattern": AXIS_NAME}]},
        },
    },
}
SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "tritonbundle models manifest",
    "type": "object",
    "additionalProperties": False,
    "required": ["version", "models"],
    "properties": {
        "version": {"const": 1},
        "traffic": {"type": "string", "description": "traffic sample (JSON Lines), relative to the manifest"},
        "defaults": {"type": "object", "additionalProperties": False, "properties": tunables_schema()},
        "models": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "source", "inputs", "outputs"],
                "properties": {
                    "name": {"type": "string", "pattern": "^[A-Za-z][A-Za-z0-9_-]*$"},
                    "task": {"enum": list(TASKS)},
                    "source": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "recipe": {"type": "string", "minLength": 1},
                            "onnx": {"type": "string", "minLength": 1},
                        },
                        "oneOf": [{"required": ["recipe"]}, {"required": ["onnx"]}],
                    },
                    "tokenizer": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "file": {"type": "string", "minLength": 1},
                            "max_length": {"type": "integer", "minimum": 1},
                        },
                    },
                    "inputs": {"type": "array", "minItems": 1, "items": _TENSOR},
                    "outputs": {"type": "array", "minItems": 1, "items": _TENSOR},
                    "max_sequence_length": {"type": "integer", "minimum": 1},
                    "axes": {
                        "type": "object",
                        "description": "dynamic axes other than batch and sequence: their largest size and buckets",
                        "propertyNames": {"pattern": AXIS_NAME, "not": {"enum": [BATCH, SEQUENCE]}},
                        "additionalProperties": {
                            "type": "object", "additionalProperties": False,
                            "properties": {"max": {"type": "integer", "minimum": 1},
                                           "buckets": {"type": "integer", "minimum": 1, "maximum": 16}},
                        },
                    },
                    "labels": {
                        "type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1},
                        "description": "text-classification: the label of each logit, in order (default: the "
                                       "id2label of a config.json next to the tokenizer, else the index)",
                    },
                    "traffic": {"type": "string"},
                    "calibration": {
                        "type": "string",
                        "description": "INT8 calibration data: a .npz holding one array per input (first axis: samples)",
                    },
                    "tolerance": {"type": "number", "exclusiveMinimum": 0},
                    **tunables_schema(),
                },
            },
        },
    },
}


@dataclass(frozen=True)
class TensorDecl:
    name: str
    dtype: str
    #: Full shape, batch included: ints are static, "batch" and "sequence" are dynamic.
    shape: tuple[int | str, ...]

    @property
    def batched(self) -> bool:
        return bool(self.shape) and self.shape[0] == "batch"

    @property
    def dims(self) -> tuple[int, ...]:
        """Triton dims: without the batch dimension, -1 for dynamic ones."""
        rest = self.shape[1:] if self.batched else self.shape
        return tuple(-1 if isinstance(d, str) else d for d in rest)

    @property
    def sequence_axes(self) -> tuple[int, ...]:
        """Axes (batch included) that are planned sequence dimensions."""
        return tuple(i for i, d in enumerate(self.shape) if d == SEQUENCE)

    @property
    def axis_names(self) -> tuple[str, ...]:
        """The named dynamic axes, batch excluded, in order."""
        return tuple(d for i, d in enumerate(self.shape) if isinstance(d, str) and not (i == 0 and d == BATCH))


@dataclass(frozen=True)
class Axis:
    """A named dynamic axis other than batch: its largest size (0: the traffic sample's largest) and buckets."""

    name: str
    max: int
    buckets: int


@dataclass(frozen=True, kw_only=True)
class ModelSpec(Tunables):
    """One model of the manifest: what it is, where it comes from, and its tunables."""

    name: str
    task: str
    recipe: str | None
    onnx_path: Path | None
    inputs: tuple[TensorDecl, ...]
    outputs: tuple[TensorDecl, ...]
    max_sequence_length: int
    tokenizer_file: Path | None
    tokenizer_max_length: int
    traffic: Path | None
    calibration: Path | None
    tolerance: float | None = None
    #: The manifest's ``axes``: named dynamic axes other than batch and sequence (see :attr:`axes`).
    axis_limits: tuple[Axis, ...] = ()
    #: text-classification: the label of each logit (empty: the index).
    labels: tuple[str, ...] = ()

    @property
    def batched(self) -> bool:
        return all(t.batched for t in self.inputs)

    @property
    def text(self) -> bool:
        """Text in: a tokenizer + encoder ensemble (every task but ``tensor``)."""
        return self.task in contract.TEXT_TASKS

    @property
    def axes(self) -> tuple[Axis, ...]:
        """Every named dynamic axis other than batch, in order of first appearance in the inputs:
        ``sequence`` from max_sequence_length and sequence_buckets, the others from ``axes``."""
        limits = {a.name: a for a in self.axis_limits}
        out: list[Axis] = []
        for t in self.inputs:
            for name in t.axis_names:
                if name in (a.name for a in out):
                    continue
                if name == SEQUENCE:
                    out.append(Axis(SEQUENCE, self.max_sequence_length, self.sequence_buckets))
                else:
                    out.append(limits.get(name, Axis(name, 0, DEFAULT_AXIS_BUCKETS)))
        return tuple(out)

    def axis(self, name: str) -> Axis:
        for a in self.axes:
            if a.name == name:
                return a
        raise KeyError(name)

    @property
    def max_batch_size(self) -> int:
        return max(self.batch_buckets) if self.batched else 0

    @property
    def has_sequence(self) -> bool:
        return any(t.sequence_axes for t in self.inputs)

    @property
    def encoder_name(self) -> str:
        """The name of the model that runs the network (the ensemble keeps the plain name)."""
        return contract.encoder_name(self.name, text=self.text)

    @property
    def tokenizer_name(self) -> str:
        return contract.tokenizer_name(self.name)


@dataclass(frozen=True)
class Manifest:
    path: Path
    models: tuple[ModelSpec, ...]
    traffic: Path | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def model(self, name: str) -> ModelSpec:
        for m in self.models:
            if m.name == name:
                return m
        raise ConfigError(f"{self.path}: no model named {name!r} (models: {', '.join(m.name for m in self.models)})")


def _path_of(error_path: Sequence[Any]) -> str:
    out = ""
    for part in error_path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _describe(error: Any) -> str:
    """One line for a jsonschema error: the key path and what is allowed there."""
    where = _path_of(error.absolute_path)
    schema = error.schema if isinstance(error.schema, dict) else {}
    if error.validator == "additionalProperties":
        allowed = sorted(schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed)) if isinstance(error.instance, dict) else []
        close = [m for key in extra for m in difflib.get_close_matches(key, allowed, n=1)]
        hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
        return f"{where}: unknown key {', '.join(map(repr, extra))}{hint}; allowed keys: {', '.join(allowed)}"
    if error.validator == "enum":
        return f"{where}: {error.instance!r} is not allowed; allowed values: {', '.join(map(str, schema['enum']))}"
    if error.validator == "oneOf" and "source" in where:
        return f"{where}: give exactly one of 'recipe' (a name from tritonbundle.recipes) or 'onnx' (a path)"
    if error.validator == "anyOf" and "shape" in where:
        return (f"{where}: {error.instance!r} is not a dimension; use a positive integer, 'batch' (first only), "
                "'sequence' (the token axis of text) or a name for another dynamic axis (height, width, ...)")
    return f"{where}: {error.message}"


def schema(*, runtimes: Sequence[str] = (), recipes: Sequence[str] = ()) -> dict[str, Any]:
    """The manifest's JSON Schema; with the names of the runtimes and recipes that exist (the build
    stage passes them; this module knows neither), those keys only take those names."""
    import copy

    out = copy.deepcopy(SCHEMA)
    model = out["properties"]["models"]["items"]["properties"]
    if runtimes:
        for props in (model, out["properties"]["defaults"]["properties"]):
            props["runtime"] = {"enum": list(runtimes)}
    if recipes:
        model["source"]["properties"]["recipe"] = {"enum": list(recipes)}
    return out


def validate(data: Any, *, source: str, runtimes: Sequence[str] = (), recipes: Sequence[str] = ()) -> None:
    """Check ``data`` against the schema; raise one :class:`ConfigError` listing every problem."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema(runtimes=runtimes, recipes=recipes))
    errors = sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        lines = "\n".join(f"  - {_describe(e)}" for e in errors)
        raise ConfigError(f"{source}: the manifest is invalid:\n{lines}")


def _tensor(raw: Mapping[str, Any], *, where: str) -> TensorDecl:
    shape = tuple(raw["shape"])
    if "batch" in shape[1:]:
        raise ConfigError(f"{where}.shape: 'batch' may only be the first dimension, got {list(shape)}")
    return TensorDecl(raw["name"], normalize_dtype(raw["dtype"], where=f"{where}.dtype"), shape)


def load(path: Path | str, *, runtimes: Sequence[str] = (), recipes: Sequence[str] = ()) -> Manifest:
    """Read and validate a manifest; relative paths in it are relative to the manifest's folder."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError as e:
        raise ConfigError(f"manifest {path} does not exist") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    return from_dict(data, path=path, runtimes=runtimes, recipes=recipes)


def from_dict(data: Any, *, path: Path, runtimes: Sequence[str] = (), recipes: Sequence[str] = ()) -> Manifest:
    validate(data, source=str(path), runtimes=runtimes, recipes=recipes)
    base = path.parent
    defaults = data.get("defaults", {})
    manifest_traffic = base / data["traffic"] if data.get("traffic") else None
    models = []
    seen: set[str] = set()
    for index, raw in enumerate(data["models"]):
        where = f"models[{index}]"
        if raw["name"] in seen:
            raise ConfigError(f"{path}: {where}.name: {raw['name']!r} is used by two models")
        seen.add(raw["name"])
        tunables = {
            f.name: _tunable_value(f, raw[f.name] if f.name in raw else defaults.get(f.name, f.default))
            for f in fields(Tunables)
        }

        inputs = tuple(_tensor(t, where=f"{where}.inputs[{i}]") for i, t in enumerate(raw["inputs"]))
        outputs = tuple(_tensor(t, where=f"{where}.outputs[{i}]") for i, t in enumerate(raw["outputs"]))
        batched = {t.batched for t in inputs + outputs}
        if len(batched) > 1:
            raise ConfigError(f"{path}: {where}: either every input and output starts with 'batch' or none does")
        task = raw.get("task", "tensor")
        tokenizer = raw.get("tokenizer", {})
        if task in contract.TEXT_TASKS:
            _check_text_model(raw, inputs, outputs, task, tokenizer, where=f"{path}: {where}")
        if raw.get("labels") and task != "text-classification":
            raise ConfigError(f"{path}: {where}.labels: only a text-classification model has labels (task is {task})")
        sequence = any(t.sequence_axes for t in inputs)
        max_seq = int(raw.get("max_sequence_length", 512 if sequence else 0))
        if max_seq and int(tokenizer.get("max_length", 0)) > max_seq:  # longer texts would reach no profile
            raise ConfigError(f"{path}: {where}.tokenizer.max_length {tokenizer['max_length']} is more than "
                              f"max_sequence_length {max_seq}, the longest row the model is built for")
        axes = _axis_limits(raw, inputs, where=f"{path}: {where}")
        models.append(
            ModelSpec(
                name=raw["name"],
                task=task,
                recipe=raw["source"].get("recipe"),
                onnx_path=(base / raw["source"]["onnx"]) if raw["source"].get("onnx") else None,
                inputs=inputs,
                outputs=outputs,
                max_sequence_length=max_seq,
                tokenizer_file=(base / tokenizer["file"]) if tokenizer.get("file") else None,
                tokenizer_max_length=int(tokenizer.get("max_length", max_seq or 512)),
                traffic=(base / raw["traffic"]) if raw.get("traffic") else manifest_traffic,
                calibration=(base / raw["calibration"]) if raw.get("calibration") else None,
                tolerance=raw.get("tolerance"),
                axis_limits=axes,
                labels=tuple(raw.get("labels", ())),
                **tunables,
            )
        )
    return Manifest(path=path, models=tuple(models), traffic=manifest_traffic, raw=data)


def _check_text_model(raw: Mapping[str, Any], inputs: Sequence[TensorDecl], outputs: Sequence[TensorDecl], task: str,
                      tokenizer: Mapping[str, Any], *, where: str) -> None:
    """A text task's encoder: token ids, attention mask and optionally token type ids, each [batch, sequence]."""
    if len(inputs) not in (2, 3) or not all(t.shape == (BATCH, SEQUENCE) for t in inputs):
        raise ConfigError(f"{where}.inputs: a {task} model takes two or three [batch, sequence] inputs (token ids, "
                          f"attention mask, and optionally token type ids, in that order), got {[t.name for t in inputs]} "
                          f"with shapes {[list(t.shape) for t in inputs]}")
    if wide := [f"{t.name} ({t.dtype})" for t in inputs if t.dtype != "INT64"]:  # what tokenizers and clients send
        raise ConfigError(f"{where}.inputs: a {task} model's token inputs are INT64, got {', '.join(wide)}: export "
                          "them as int64 (the Hugging Face exporters' default), or serve it as a tensor model")
    if not tokenizer.get("file") and raw["source"].get("recipe") is None:
        raise ConfigError(f"{where}.tokenizer.file: a {task} model from ONNX needs its tokenizer.json")
    if task in ("text-classification", "text-pair"):
        if len(outputs) != 1 or len(outputs[0].shape) != 2 or outputs[0].shape[0] != BATCH:
            raise ConfigError(f"{where}.outputs: a {task} model has one output, its logits, shaped [batch, n]; got "
                              f"{[(t.name, list(t.shape)) for t in outputs]}")
        if not outputs[0].dtype.startswith("FP"):
            raise ConfigError(f"{where}.outputs[0].dtype: logits must be floating point, got {outputs[0].dtype}")
        n = outputs[0].shape[1]
        if task == "text-pair" and isinstance(n, int) and n not in (1, 2):
            raise ConfigError(f"{where}.outputs[0].shape: a text-pair model scores each pair with one logit (or two: "
                              f"not relevant, relevant), got {n}")
        if raw.get("labels") and isinstance(n, int) and len(raw["labels"]) != n:
            raise ConfigError(f"{where}.labels: {len(raw['labels'])} labels for {n} logits")


def _axis_limits(raw: Mapping[str, Any], inputs: Sequence[TensorDecl], *, where: str) -> tuple[Axis, ...]:
    declared = raw.get("axes", {})
    named = {a for t in inputs for a in t.axis_names}
    unknown = sorted(set(declared) - named)
    if unknown:
        raise ConfigError(f"{where}.axes: {', '.join(unknown)} is not a dimension of any input "
                          f"(named axes: {', '.join(sorted(named)) or 'none'})")
    return tuple(Axis(name, int(v.get("max", 0)), int(v.get("buckets", DEFAULT_AXIS_BUCKETS)))
                 for name, v in declared.items())


def override(manifest: Manifest, **changes: Any) -> Manifest:
    """A copy with tunables of every model replaced (``--target gpu`` on the command line, say).
    The build stage checks the result with the runtimes, as it does a manifest read from a file."""
    changes = {k: v for k, v in changes.items() if v is not None}
    known = {f.name for f in fields(Tunables)}
    unknown = sorted(set(changes) - known)
    if unknown:
        raise ConfigError(f"cannot override {', '.join(unknown)}: not a tunable ({', '.join(sorted(known))})")
    if not changes:
        return manifest
    return replace(manifest, models=tuple(replace(m, **changes) for m in manifest.models))
