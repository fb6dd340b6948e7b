"""Build TensorRT engines (TensorRT 10 API), as small composable steps named by what they turn into
what, after Polygraphy's loaders::

    network = NetworkFromOnnxPath(onnx_path)()
    config = CreateConfig(options)(network)
    plan = EngineFromNetwork(network, config, timing_cache=TimingCache(path))()
    SaveEngine(plan, path)()

This module is type-checked with ``mypy --strict`` against ``tensorrt-stubs==10.13.0.35.1``, so no
call that TensorRT 10 removed (``max_workspace_size``, ``build_engine``, ``set_binding_shape``,
``EXPLICIT_BATCH`` networks) can remain. It runs inside the pinned NGC TensorRT image (there is no
TensorRT on the development machines); ``tensorrt`` is imported lazily, inside the steps.

Where Polygraphy fits better than hand-written code it is used: its ``Calibrator`` owns the device
buffers for INT8 calibration, and its ``TrtRunner`` runs the engine for the accuracy gate.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tritonbundle.errors import BuildError
from tritonbundle.files import sha256

if TYPE_CHECKING:
    import tensorrt as trt

#: Shapes of one optimization profile: input name -> (min, opt, max).
ProfileShapes = Mapping[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]

HARDWARE_COMPATIBILITY = {"none": "NONE", "ampere+": "AMPERE_PLUS", "same-compute-capability": "SAME_COMPUTE_CAPABILITY"}


@dataclass(frozen=True)
class EngineOptions:
    """Everything that changes the engine: recorded in its metadata and compared on rebuild."""

    precision: str = "fp32"  # fp32 | fp16 | bf16 | int8
    workspace_mib: int = 4096
    builder_optimization_level: int = 3
    hardware_compatibility: str = "none"
    version_compatible: bool = False
    profiles: tuple[ProfileShapes, ...] = ()
    #: INT8: ``.npz`` of calibration inputs; None with explicit Q/DQ in the graph.
    calibration_data: str | None = None

    def __post_init__(self) -> None:
        if self.precision not in ("fp32", "fp16", "bf16", "int8"):
            raise BuildError(f"precision {self.precision!r} is not one of fp32, fp16, bf16, int8")
        if self.hardware_compatibility not in HARDWARE_COMPATIBILITY:
            raise BuildError(f"hardware_compatibility must be one of {', '.join(HARDWARE_COMPATIBILITY)}")
        if not self.profiles:
            raise BuildError("an engine needs at least one optimization profile")

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["profiles"] = [{k: [list(s) for s in v] for k, v in p.items()} for p in self.profiles]
        return data


@dataclass(frozen=True)
class Platform:
    """The GPU and TensorRT an engine is built for (plans are not portable across either)."""

    gpu_name: str
    compute_capability: str  # "9.0"
    tensorrt_version: str

    @property
    def fingerprint(self) -> str:
        gpu = "".join(c if c.isalnum() else "-" for c in self.gpu_name.lower()).strip("-")
        while "--" in gpu:
            gpu = gpu.replace("--", "-")
        return f"{gpu}-cc{self.compute_capability.replace('.', '')}-trt{self.tensorrt_version}"


def current_platform() -> Platform:
    """This machine's GPU 0 (via nvidia-smi) and the importable TensorRT version."""
    from tritonbundle import proc

    try:
        import tensorrt as trt
    except ImportError as e:
        raise BuildError(
            "TensorRT is not importable here: build engines inside the pinned NGC TensorRT image "
            "(docker/versions.env), e.g. `docker compose run build`"
        ) from e
    try:
        out = proc.run(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"], timeout_s=30).stdout
    except Exception as e:  # noqa: BLE001 - CommandError, missing binary
        raise BuildError(f"no NVIDIA GPU visible (nvidia-smi failed: {e})") from e
    name, cc = (part.strip() for part in out.strip().splitlines()[0].split(","))
    return Platform(gpu_name=name, compute_capability=cc, tensorrt_version=str(trt.__version__))


def sha256_file(path: Path | None) -> str | None:
    if path is None or not path.exists():
        return None
    return sha256(path)


# -- precision ------------------------------------------------------------------------------------
def precision_flags(precision: str, *, compute_capability: str, has_fast_fp16: bool, has_fast_int8: bool) -> tuple[str, ...]:
    """Builder flags for a precision, only where the platform has it; raise where it does not.

    FP16 needs fast native FP16; BF16 needs compute capability >= 8.0 (Ampere); INT8 needs fast
    INT8 and keeps FP16 on as a fallback for layers without INT8 kernels.
    """
    major = int(compute_capability.split(".")[0])
    if precision == "fp32":
        return ()
    if precision == "fp16":
        if not has_fast_fp16:
            raise BuildError(f"precision fp16: this GPU (compute capability {compute_capability}) has no fast FP16")
        return ("FP16",)
    if precision == "bf16":
        if major < 8:
            raise BuildError(f"precision bf16 needs compute capability >= 8.0, this GPU has {compute_capability}")
        return ("BF16",)
    if precision == "int8":
        if not has_fast_int8:
            raise BuildError(f"precision int8: this GPU (compute capability {compute_capability}) has no fast INT8")
        return ("INT8", "FP16") if has_fast_fp16 else ("INT8",)
    raise BuildError(f"unknown precision {precision!r}")


# -- the steps ------------------------------------------------------------------------------------
@dataclass
class Network:
    builder: trt.Builder
    network: trt.INetworkDefinition
    parser: trt.OnnxParser
    logger: trt.ILogger


class NetworkFromOnnxPath:
    """ONNX file -> TensorRT network. Parser errors are reported per node."""

    def __init__(self, onnx_path: Path, *, strongly_typed: bool = False) -> None:
        self.onnx_path = onnx_path
        self.strongly_typed = strongly_typed

    def __call__(self) -> Network:
        import tensorrt as trt

        logger = trt.Logger(trt.Logger.WARNING)
        builder = trt.Builder(logger)
        # TensorRT 10 networks are always explicit-batch; the only creation flag left is typing.
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if self.strongly_typed else 0
        network = builder.create_network(flags)
        parser = trt.OnnxParser(network, logger)
        if not parser.parse_from_file(str(self.onnx_path)):
            errors = []
            for i in range(parser.num_errors):
                err = parser.get_error(i)
                errors.append(
                    f"  node {err.node()} {err.node_name()!r} ({err.node_operator()}): {err.desc()} [{err.code()}]"
                )
            raise BuildError(f"{self.onnx_path}: the TensorRT ONNX parser failed:\n" + "\n".join(errors))
        return Network(builder, network, parser, logger)


class TimingCache:
    """A persistent timing cache: loaded before the build, merged with what is on disk after it
    (another build may have written meanwhile) and saved back atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def attach(self, config: trt.IBuilderConfig) -> None:
        data = self.path.read_bytes() if self.path.exists() else b""
        cache = config.create_timing_cache(data)
        config.set_timing_cache(cache, ignore_mismatch=False)

    def save(self, config: trt.IBuilderConfig) -> None:
        cache = config.get_timing_cache()
        if cache is None:
            return
        if self.path.exists():
            on_disk = config.create_timing_cache(self.path.read_bytes())
            cache.combine(on_disk, ignore_mismatch=True)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(bytes(cache.serialize()))
        tmp.replace(self.path)


class CreateConfig:
    """Builder config: memory pool, precision flags, profiles, optimisation and compatibility."""

    def __init__(self, options: EngineOptions, *, platform: Platform, calibrator: Any = None) -> None:
        self.options = options
        self.platform = platform
        self.calibrator = calibrator
        #: The builder flags set by the last call (recorded in the plan's metadata).
        self.flags: tuple[str, ...] = ()

    def __call__(self, net: Network) -> trt.IBuilderConfig:
        import tensorrt as trt

        o = self.options
        config = net.builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, o.workspace_mib << 20)
        config.builder_optimization_level = o.builder_optimization_level
        config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED  # for the engine inspector
        flags = list(precision_flags(
            o.precision, compute_capability=self.platform.compute_capability,
            has_fast_fp16=net.builder.platform_has_fast_fp16, has_fast_int8=net.builder.platform_has_fast_int8,
        ))
        for flag in flags:
            config.set_flag(getattr(trt.BuilderFlag, flag))
        if o.hardware_compatibility != "none":
            config.hardware_compatibility_level = getattr(
                trt.HardwareCompatibilityLevel, HARDWARE_COMPATIBILITY[o.hardware_compatibility]
            )
        if o.version_compatible:
            config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
            flags.append("VERSION_COMPATIBLE")
        self.flags = tuple(flags)
        inputs = {net.network.get_input(i).name for i in range(net.network.num_inputs)}
        for index, shapes in enumerate(o.profiles):
            missing = inputs - set(shapes)
            if missing:
                raise BuildError(f"profile {index} has no shapes for inputs {sorted(missing)}")
            profile = net.builder.create_optimization_profile()
            for name, (lo, opt, hi) in shapes.items():
                profile.set_shape(name, trt.Dims(list(lo)), trt.Dims(list(opt)), trt.Dims(list(hi)))
            if config.add_optimization_profile(profile) < 0:
                raise BuildError(f"profile {index} was refused by TensorRT: {dict(shapes)}")
            if index == 0 and self.calibrator is not None:
                config.set_calibration_profile(profile)
        if self.calibrator is not None:
            # Implicit INT8 calibration is deprecated since TensorRT 10.1 in favour of explicit
            # Q/DQ; it still works and is what an un-quantized ONNX needs.
            config.int8_calibrator = self.calibrator
        return config


class EngineFromNetwork:
    """Network + config -> serialized plan, using and updating the timing cache."""

    def __init__(self, net: Network, config: trt.IBuilderConfig, *, timing_cache: TimingCache | None = None) -> None:
        self.net = net
        self.config = config
        self.timing_cache = timing_cache

    def __call__(self) -> bytes:
        if self.timing_cache is not None:
            self.timing_cache.attach(self.config)
        serialized = self.net.builder.build_serialized_network(self.net.network, self.config)
        if serialized is None:
            raise BuildError("TensorRT could not build the engine (see the build log above for the failing layer)")
        if self.timing_cache is not None:
            self.timing_cache.save(self.config)
        return bytes(serialized)


class SaveEngine:
    def __init__(self, plan: bytes, path: Path) -> None:
        self.plan = plan
        self.path = path

    def __call__(self) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(self.plan)
        tmp.replace(self.path)
        return self.path


def layer_information(plan: bytes) -> str:
    """The engine inspector's per-layer JSON (kernels, precisions, shapes)."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    engine = trt.Runtime(logger).deserialize_cuda_engine(plan)
    if engine is None:
        raise BuildError("the plan just built could not be deserialized")
    inspector = engine.create_engine_inspector()
    if inspector is None:
        raise BuildError("the engine inspector is not available for this plan")
    return str(inspector.get_engine_information(trt.LayerInformationFormat.JSON))


# -- INT8 calibration ------------------------------------------------------------------------------
def calibration_batches(npz_path: Path, input_names: Sequence[str], batch_size: int) -> Iterator[dict[str, Any]]:
    """Feed dicts from a ``.npz`` holding one array per input (first axis = samples)."""
    import numpy as np

    data = np.load(npz_path)
    missing = [n for n in input_names if n not in data.files]
    if missing:
        raise BuildError(f"calibration data {npz_path} has no arrays for inputs {missing} (has {data.files})")
    total = min(int(data[n].shape[0]) for n in input_names)
    for start in range(0, total, batch_size):
        yield {n: np.ascontiguousarray(data[n][start : start + batch_size]) for n in input_names}


def entropy_calibrator(batches: Iterable[dict[str, Any]], cache_path: Path) -> Any:
    """Polygraphy's Calibrator as an ``IInt8EntropyCalibrator2``, with a calibration cache file."""
    import tensorrt as trt
    from polygraphy.backend.trt import Calibrator

    return Calibrator(batches, cache=str(cache_path), BaseClass=trt.IInt8EntropyCalibrator2)


# -- metadata --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EngineMetadata:
    """Written next to each plan; a plan is reused only while all of it still matches."""

    tensorrt_version: str
    gpu_name: str
    compute_capability: str
    onnx_sha256: str
    options: dict[str, Any]
    calibration_sha256: str | None = None
    timing_cache_sha256: str | None = None
    flags: tuple[str, ...] = ()
    built_at: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @staticmethod
    def read(path: Path) -> EngineMetadata | None:
        try:
            data = json.loads(path.read_text())
            data["flags"] = tuple(data.get("flags", ()))
            return EngineMetadata(**data)
        except (OSError, ValueError, TypeError):
            return None


def mismatches(
    existing: EngineMetadata | None, *, platform: Platform, onnx_sha256: str, options: EngineOptions,
    calibration_sha256: str | None,
) -> list[str]:
    """Why an existing plan cannot be reused (empty: reuse it). The timing cache is not a reason:
    it changes build time, not the engine's correctness."""
    if existing is None:
        return ["no plan metadata"]
    reasons = []
    if existing.tensorrt_version != platform.tensorrt_version:
        reasons.append(f"TensorRT {existing.tensorrt_version} != {platform.tensorrt_version}")
    if existing.compute_capability != platform.compute_capability or existing.gpu_name != platform.gpu_name:
        reasons.append(
            f"GPU {existing.gpu_name} (cc {existing.compute_capability}) != {platform.gpu_name} (cc {platform.compute_capability})"
        )
    if existing.onnx_sha256 != onnx_sha256:
        reasons.append("the ONNX model changed")
    if existing.options != options.to_json():
        reasons.append("build options or profiles changed")
    if existing.calibration_sha256 != calibration_sha256:
        reasons.append("the calibration data changed")
    return reasons


# -- trtexec equivalent ------------------------------------------------------------------------------
def _shape_arg(shapes: Mapping[str, tuple[int, ...]]) -> str:
    return ",".join(f"{name}:{'x'.join(map(str, dims))}" for name, dims in shapes.items())


def trtexec_command(
    onnx_path: Path, plan_path: Path, options: EngineOptions, *, timing_cache: Path | None,
    calibration_cache: Path | None = None, layer_info: Path | None = None,
) -> list[str]:
    """The ``trtexec`` command that builds the same engine (written to reproduce.sh)."""
    argv = ["trtexec", f"--onnx={onnx_path}", f"--saveEngine={plan_path}"]
    for index, profile in enumerate(options.profiles):
        argv.append(f"--profile={index}")
        argv.append("--minShapes=" + _shape_arg({k: v[0] for k, v in profile.items()}))
        argv.append("--optShapes=" + _shape_arg({k: v[1] for k, v in profile.items()}))
        argv.append("--maxShapes=" + _shape_arg({k: v[2] for k, v in profile.items()}))
    argv.append(f"--memPoolSize=workspace:{options.workspace_mib}M")
    argv.append(f"--builderOptimizationLevel={options.builder_optimization_level}")
    if options.precision == "fp16":
        argv.append("--fp16")
    elif options.precision == "bf16":
        argv.append("--bf16")
    elif options.precision == "int8":
        argv += ["--int8", "--fp16"]
        if calibration_cache is not None:
            argv.append(f"--calib={calibration_cache}")
    if options.hardware_compatibility != "none":
        argv.append(f"--hardwareCompatibilityLevel={options.hardware_compatibility}")
    if options.version_compatible:
        argv.append("--versionCompatible")
    if timing_cache is not None:
        argv.append(f"--timingCacheFile={timing_cache}")
    argv.append("--profilingVerbosity=detailed")
    if layer_info is not None:
        argv += ["--dumpLayerInfo", f"--exportLayerInfo={layer_info}"]
    argv.append("--skipInference")
    return argv
