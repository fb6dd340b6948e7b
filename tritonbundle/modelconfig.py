"""Triton model configuration as typed objects.

Every ``config.pbtxt`` this project writes is built from these dataclasses, validated in
``__post_init__``, turned into Triton's own ``ModelConfig`` protobuf (``model_config_pb2`` from
tritonclient) and printed with ``text_format``: never assembled from string templates. Reading a
config back goes through the same protobuf, so a field Triton does not know is an error here too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from tritonbundle.errors import ConfigError

if TYPE_CHECKING:
    from tritonclient.grpc import model_config_pb2 as pb_types


def _pb() -> ModuleType:
    """Triton's ModelConfig protobuf module (imported when a config is written or read, not at startup)."""
    from tritonclient.grpc import model_config_pb2

    module: ModuleType = model_config_pb2
    return module

#: Triton tensor data types (``TYPE_`` prefix dropped), as used by the protocol and in manifests.
DTYPES = (
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BF16", "STRING",
)
#: Protocol names that differ from the config's names.
_PROTOCOL_ALIASES = {"BYTES": "STRING"}
_NUMPY_DTYPES = {
    "BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
    "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64", "FP16": "float16",
    "FP32": "float32", "FP64": "float64", "STRING": "object",
}
KINDS = ("KIND_AUTO", "KIND_CPU", "KIND_GPU", "KIND_MODEL")


def normalize_dtype(dtype: str, *, where: str) -> str:
    """Accept ``INT64``, ``TYPE_INT64`` or the protocol's ``BYTES``; return the config name."""
    name = dtype.upper().removeprefix("TYPE_")
    name = _PROTOCOL_ALIASES.get(name, name)
    if name not in DTYPES:
        raise ConfigError(f"{where}: unknown data type {dtype!r}; allowed: {', '.join(DTYPES)} (or BYTES)")
    return name


def numpy_dtype(dtype: str) -> str:
    """The numpy dtype name for a config data type."""
    if dtype not in _NUMPY_DTYPES:
        raise ConfigError(f"data type {dtype} has no numpy equivalent")
    return _NUMPY_DTYPES[dtype]


@dataclass(frozen=True)
class TensorSpec:
    """One input or output. ``dims`` excludes the batch dimension when ``max_batch_size > 0``."""

    name: str
    dtype: str
    dims: tuple[int, ...]
    allow_ragged_batch: bool = False
    optional: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("tensor name must not be empty")
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype, where=f"tensor {self.name!r}"))
        dims = tuple(int(d) for d in self.dims)
        if any(d == 0 or d < -1 for d in dims):
            raise ConfigError(f"tensor {self.name!r}: dims must be positive or -1 (dynamic), got {list(dims)}")
        object.__setattr__(self, "dims", dims)


@dataclass(frozen=True)
class QueuePolicy:
    """What the scheduler does with requests that wait too long or find the queue full."""

    max_queue_size: int = 0
    default_timeout_us: int = 0
    reject_on_timeout: bool = True
    allow_timeout_override: bool = True

    def __post_init__(self) -> None:
        if self.max_queue_size < 0 or self.default_timeout_us < 0:
            raise ConfigError("queue policy: max_queue_size and default_timeout_us must be >= 0")


@dataclass(frozen=True)
class DynamicBatching:
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    preserve_ordering: bool = False
    queue_policy: QueuePolicy | None = None

    def __post_init__(self) -> None:
        if self.max_queue_delay_us < 0:
            raise ConfigError("dynamic_batching: max_queue_delay_microseconds must be >= 0")
        if any(b <= 0 for b in self.preferred_batch_sizes):
            raise ConfigError(f"dynamic_batching: preferred batch sizes must be > 0, got {self.preferred_batch_sizes}")


@dataclass(frozen=True)
class InstanceGroup:
    count: int = 1
    kind: str = "KIND_CPU"
    gpus: tuple[int, ...] = ()
    #: TensorRT optimization profiles (by index, as strings) this instance may use.
    profiles: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ConfigError(f"instance_group: count must be >= 1, got {self.count}")
        if self.kind not in KINDS:
            raise ConfigError(f"instance_group: kind {self.kind!r} is not one of {', '.join(KINDS)}")


@dataclass(frozen=True)
class EnsembleStep:
    model_name: str
    input_map: Mapping[str, str]
    output_map: Mapping[str, str]
    model_version: int = -1


@dataclass(frozen=True)
class WarmupInput:
    dtype: str
    dims: tuple[int, ...]
    #: "zero", "random" or "ones"
    data: str = "zero"

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype, where="warmup input"))
        if self.data not in ("zero", "random", "ones"):
            raise ConfigError(f"warmup input: data must be zero, random or ones, got {self.data!r}")


@dataclass(frozen=True)
class Warmup:
    name: str
    batch_size: int
    inputs: Mapping[str, WarmupInput]
    count: int = 1


@dataclass(frozen=True)
class ModelConfig:
    """A model's ``config.pbtxt``; exactly one of ``platform``/``backend`` is set."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int = 0
    platform: str = ""
    backend: str = ""
    dynamic_batching: DynamicBatching | None = None
    instance_groups: tuple[InstanceGroup, ...] = ()
    ensemble_steps: tuple[EnsembleStep, ...] = ()
    parameters: Mapping[str, str] = field(default_factory=dict)
    #: Serve the latest N versions.
    latest_versions: int = 1
    warmups: tuple[Warmup, ...] = ()
    #: For repositories that serve several GPU architectures: compute capability -> plan file name.
    cc_model_filenames: Mapping[str, str] = field(default_factory=dict)
    default_model_filename: str = ""
    #: Batch input/output descriptors are not needed yet; ragged inputs are flagged per tensor.

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ConfigError(f"model name {self.name!r} is empty or contains '/'")
        if bool(self.platform) == bool(self.backend):
            raise ConfigError(f"model {self.name!r}: set exactly one of platform or backend")
        if self.max_batch_size < 0:
            raise ConfigError(f"model {self.name!r}: max_batch_size must be >= 0")
        if self.max_batch_size == 0 and self.dynamic_batching is not None:
            raise ConfigError(f"model {self.name!r}: dynamic_batching needs max_batch_size > 0")
        if self.platform == "ensemble" and not self.ensemble_steps:
            raise ConfigError(f"model {self.name!r}: an ensemble needs at least one step")
        names = [t.name for t in self.inputs] + [t.name for t in self.outputs]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigError(f"model {self.name!r}: tensor names used twice: {', '.join(duplicates)}")
        if self.dynamic_batching is not None:
            too_big = [b for b in self.dynamic_batching.preferred_batch_sizes if b > self.max_batch_size]
            if too_big:
                raise ConfigError(
                    f"model {self.name!r}: preferred batch sizes {too_big} exceed max_batch_size {self.max_batch_size}"
                )
        if self.latest_versions < 1:
            raise ConfigError(f"model {self.name!r}: latest_versions must be >= 1")

    # -- protobuf ---------------------------------------------------------------------------
    def to_proto(self) -> pb_types.ModelConfig:
        pb = _pb()
        cfg = pb.ModelConfig(name=self.name, max_batch_size=self.max_batch_size)
        if self.platform:
            cfg.platform = self.platform
        if self.backend:
            cfg.backend = self.backend
        for t in self.inputs:
            inp = cfg.input.add(name=t.name, data_type=pb.DataType.Value(f"TYPE_{t.dtype}"), dims=t.dims)
            inp.allow_ragged_batch = t.allow_ragged_batch
            inp.optional = t.optional
        for t in self.outputs:
            cfg.output.add(name=t.name, data_type=pb.DataType.Value(f"TYPE_{t.dtype}"), dims=t.dims)
        cfg.version_policy.latest.num_versions = self.latest_versions
        if self.dynamic_batching is not None:
            db = self.dynamic_batching
            cfg.dynamic_batching.preferred_batch_size.extend(db.preferred_batch_sizes)
            cfg.dynamic_batching.max_queue_delay_microseconds = db.max_queue_delay_us
            cfg.dynamic_batching.preserve_ordering = db.preserve_ordering
            if db.queue_policy is not None:
                qp = cfg.dynamic_batching.default_queue_policy
                qp.max_queue_size = db.queue_policy.max_queue_size
                qp.default_timeout_microseconds = db.queue_policy.default_timeout_us
                qp.allow_timeout_override = db.queue_policy.allow_timeout_override
                qp.timeout_action = (
                    pb.ModelQueuePolicy.REJECT if db.queue_policy.reject_on_timeout else pb.ModelQueuePolicy.DELAY
                )
        for group in self.instance_groups:
            g = cfg.instance_group.add()
            g.count = group.count
            g.kind = pb.ModelInstanceGroup.Kind.Value(group.kind)
            g.gpus.extend(group.gpus)
            g.profile.extend(group.profiles)
        for step in self.ensemble_steps:
            s = cfg.ensemble_scheduling.step.add()
            s.model_name = step.model_name
            s.model_version = step.model_version
            for k, v in step.input_map.items():
                s.input_map[k] = v
            for k, v in step.output_map.items():
                s.output_map[k] = v
        for key, value in self.parameters.items():
            cfg.parameters[key].string_value = str(value)
        for w in self.warmups:
            sample = cfg.model_warmup.add()
            sample.name = w.name
            sample.batch_size = w.batch_size
            sample.count = w.count
            for input_name, wi in w.inputs.items():
                d = sample.inputs[input_name]
                d.data_type = pb.DataType.Value(f"TYPE_{wi.dtype}")
                d.dims.extend(wi.dims)
                if wi.data == "zero":
                    d.zero_data = True
                elif wi.data == "random":
                    d.random_data = True
                else:
                    raise ConfigError(f"warmup {w.name!r}: data {wi.data!r} cannot be written to the config")
        for cc, filename in self.cc_model_filenames.items():
            cfg.cc_model_filenames[cc] = filename
        if self.default_model_filename:
            cfg.default_model_filename = self.default_model_filename
        return cfg

    def to_pbtxt(self) -> str:
        from google.protobuf import text_format

        return str(text_format.MessageToString(self.to_proto()))


def parse_pbtxt(text: str, *, source: str = "config.pbtxt") -> pb_types.ModelConfig:
    """Parse a ``config.pbtxt`` into Triton's ``ModelConfig``; raise :class:`ConfigError` naming the file."""
    from google.protobuf import text_format

    try:
        config: pb_types.ModelConfig = text_format.Parse(text, _pb().ModelConfig())
        return config
    except text_format.ParseError as e:
        raise ConfigError(f"{source}: not a valid Triton ModelConfig: {e}") from e


def read_config(path: Path) -> pb_types.ModelConfig:
    return parse_pbtxt(path.read_text(), source=str(path))


def header(source: str) -> str:
    """The first line of every config the build writes: where it came from."""
    return f"# Generated by `tritonbundle build` from {source}; edit the manifest, not this file.\n"


def write_config(config: ModelConfig, model_dir: Path, *, source: str = "the models manifest") -> Path:
    """Write ``<model_dir>/config.pbtxt`` with a header saying where it came from."""
    model_dir.mkdir(parents=True, exist_ok=True)
    path = model_dir / "config.pbtxt"
    path.write_text(header(source) + config.to_pbtxt())
    return path


def restamp(path: Path, source: str) -> None:
    """Name ``source`` (the manifest a build read) in the header of a config :func:`write_config` wrote."""
    text = path.read_text()
    first, _, rest = text.partition("\n")
    if first.startswith("# Generated by `tritonbundle build`"):
        path.write_text(header(source) + rest)
