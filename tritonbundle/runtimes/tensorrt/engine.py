"""Build TensorRT engines as small composable steps named by what they turn into what, after
Polygraphy's loaders::

    network = NetworkFromOnnxPath(onnx_path)()
    config = CreateConfig(options, platform=platform)(network)
    plan = EngineFromNetwork(network, config, timing_cache=TimingCache(path))()
    SaveEngine(plan, path)()

Networks are strongly typed, on TensorRT 10.13 and 11 alike: the ONNX says the precision (an FP16,
BF16 or INT8 Q/DQ graph from :mod:`tritonbundle.build.precision`) and no precision flag is set.
TensorRT 10.12 deprecated and TensorRT 11 removed ``BuilderFlag.FP16/BF16/INT8``, the INT8
calibrators and ``platform_has_fast_fp16`` (NVIDIA/TensorRT v11.1 ``python/src/infer/pyCore.cpp``:
the ``BuilderFlag`` enum at 1599-1623, no ``pyInt8.cpp``); ``1 << STRONGLY_TYPED`` is right on both
(the flag's value changed from 1 to 0 and 11 ignores it: ``include/NvInfer.h`` v11.1 11464-11471).
TF32 is on by default in both; an "fp32" engine clears it so that it is FP32.

This module is type-checked with ``mypy --strict`` twice: against ``tensorrt-stubs==10.13.0.35.1`` and
against ``typings/tensorrt11`` (the subset called here, written from the v11.1 bindings, each
signature citing its source line), so it uses only calls both versions have. It runs inside the
NGC TensorRT image (there is no TensorRT on the development machines); ``tensorrt`` is imported
lazily, inside the steps.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
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
#: trtexec's spelling of each level (``samples/common/sampleOptions.cpp``, v10.13.3 1525-1542, v11.1
#: 1388-1405: "none", "ampere+", "sameComputeCapability").
TRTEXEC_HARDWARE_COMPATIBILITY = {"ampere+": "ampere+", "same-compute-capability": "sameComputeCapability"}
#: Where trtexec is in the NGC TensorRT image (NVIDIA's sample READMEs; Triton's QA scripts,
#: ``qa/L0_perf_resnet/test.sh``: ``TRTEXEC=/usr/src/tensorrt/bin/trtexec``). pip wheels have none.
TRTEXEC = "/usr/src/tensorrt/bin/trtexec"
#: Least compute capability per precision: BF16 math needs Ampere (8.0).
MIN_COMPUTE_CAPABILITY = {"bf16": (8, 0)}


@dataclass(frozen=True)
class EngineOptions:
    """Everything that changes the engine: recorded in its metadata and compared on rebuild."""

    precision: str = "fp32"  # fp32 | fp16 | bf16 | int8
    workspace_mib: int = 4096
    builder_optimization_level: int = 3
    hardware_compatibility: str = "none"
    version_compatible: bool = False
    profiles: tuple[ProfileShapes, ...] = ()
    #: (graph input, rows of the table it indexes): clamped to the table before the plan gathers
    #: (:mod:`tritonbundle.runtimes.tensorrt.clamp`); a plan built without them is rebuilt.
    index_clamps: tuple[tuple[str, int], ...] = ()

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
        # Left out when there is nothing to clamp: such a plan's metadata reads as before the clamps.
        if self.index_clamps:
            data["index_clamps"] = dict(self.index_clamps)
        else:
            del data["index_clamps"]
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
def check_precision(precision: str, compute_capability: str) -> None:
    """Refuse a precision this GPU cannot run, naming both (the ONNX already holds the precision)."""
    need = MIN_COMPUTE_CAPABILITY.get(precision)
    have = tuple(int(x) for x in compute_capability.split(".")[:2])
    if need is not None and have < need:
        raise BuildError(f"precision {precision} needs compute capability >= {need[0]}.{need[1]}, "
                         f"this GPU has {compute_capability}")


# -- the steps ------------------------------------------------------------------------------------
@dataclass
class Network:
    builder: trt.Builder
    network: trt.INetworkDefinition
    parser: trt.OnnxParser
    logger: trt.ILogger


class NetworkFromOnnxPath:
    """ONNX file -> strongly typed TensorRT network. Parser errors are reported per node."""

    def __init__(self, onnx_path: Path) -> None:
        self.onnx_path = onnx_path

    def __call__(self) -> Network:
        import tensorrt as trt

        logger = trt.Logger(trt.Logger.WARNING)
        builder = trt.Builder(logger)
        # Explicit batch always (TensorRT 10 and 11); strongly typed: needed on 10, the only mode on 11.
        network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
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
    """Builder config: memory pool, TF32, profiles, optimisation level and compatibility."""

    def __init__(self, options: EngineOptions, *, platform: Platform) -> None:
        self.options = options
        self.platform = platform
        #: The builder flags set (or cleared: ``-TF32``) by the last call (recorded in the metadata).
        self.flags: tuple[str, ...] = ()

    def __call__(self, net: Network) -> trt.IBuilderConfig:
        import tensorrt as trt

        o = self.options
        check_precision(o.precision, self.platform.compute_capability)
        config = net.builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, o.workspace_mib << 20)
        config.builder_optimization_level = o.builder_optimization_level
        config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED  # for the engine inspector
        flags = []
        if o.precision == "fp32":
            # TF32 is on by default (NvInfer.h v11.1 9973-9976: "Enabled by default"): FP32 means FP32.
            config.clear_flag(trt.BuilderFlag.TF32)
            flags.append("-TF32")
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


def deserialize(plan: bytes, *, version_compatible: bool) -> trt.ICudaEngine:
    """The engine of a plan. A version-compatible plan embeds TensorRT's lean runtime (host code),
    which a runtime refuses unless told to trust it (``NvInferRuntime.h``: setEngineHostCodeAllowed,
    "The default value is false"; trtexec does the same in ``sampleEngines.cpp``)."""
    import tensorrt as trt

    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    if version_compatible:
        runtime.engine_host_code_allowed = True
    engine = runtime.deserialize_cuda_engine(plan)
    if engine is None:
        raise BuildError("the plan just built could not be deserialized")
    return engine


def layer_information(plan: bytes, *, version_compatible: bool) -> str:
    """The engine inspector's per-layer JSON (kernels, precisions, shapes). Its schema differs between
    TensorRT 10 (``"Bindings"``) and 11 (``"I/O Tensors"``); it is written as TensorRT gives it."""
    import tensorrt as trt

    engine = deserialize(plan, version_compatible=version_compatible)
    inspector = engine.create_engine_inspector()
    if inspector is None:
        raise BuildError("the engine inspector is not available for this plan")
    return str(inspector.get_engine_information(trt.LayerInformationFormat.JSON))


# -- metadata --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EngineMetadata:
    """Written next to each plan; a plan is reused only while all of it still matches."""

    tensorrt_version: str
    gpu_name: str
    compute_capability: str
    onnx_sha256: str
    options: dict[str, Any]
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
            data.pop("calibration_sha256", None)  # written before precision moved into the ONNX
            return EngineMetadata(**data)
        except (OSError, ValueError, TypeError):
            return None


def mismatches(existing: EngineMetadata | None, *, platform: Platform, onnx_sha256: str, options: EngineOptions) -> list[str]:
    """Why an existing plan cannot be reused (empty: reuse it). The ONNX hash covers the precision (an
    INT8 graph holds its calibrated scales). The timing cache is not a reason: it changes build time,
    not the engine's correctness."""
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
    return reasons


# -- trtexec equivalent ------------------------------------------------------------------------------
def _shape_arg(shapes: Mapping[str, tuple[int, ...]]) -> str:
    return ",".join(f"{name}:{'x'.join(map(str, dims))}" for name, dims in shapes.items())


def trtexec_command(
    onnx_path: Path, plan_path: Path, options: EngineOptions, *, timing_cache: Path | None,
    layer_info: Path | None = None,
) -> list[str]:
    """The ``trtexec`` command that builds the same engine (written to reproduce.sh). Every option is
    one both TensorRT 10.13 and 11 accept (``--fp16``, ``--int8``, ``--calib`` are gone in 11: the
    precision is in the ONNX); ``--stronglyTyped`` is what 10.13 needs and a no-op on 11."""
    argv = [TRTEXEC, f"--onnx={onnx_path}", f"--saveEngine={plan_path}", "--stronglyTyped"]
    for index, profile in enumerate(options.profiles):
        argv.append(f"--profile={index}")
        argv.append("--minShapes=" + _shape_arg({k: v[0] for k, v in profile.items()}))
        argv.append("--optShapes=" + _shape_arg({k: v[1] for k, v in profile.items()}))
        argv.append("--maxShapes=" + _shape_arg({k: v[2] for k, v in profile.items()}))
    argv.append(f"--memPoolSize=workspace:{options.workspace_mib}M")
    argv.append(f"--builderOptimizationLevel={options.builder_optimization_level}")
    if options.precision == "fp32":
        argv.append("--noTF32")
    if options.hardware_compatibility != "none":
        argv.append(f"--hardwareCompatibilityLevel={TRTEXEC_HARDWARE_COMPATIBILITY[options.hardware_compatibility]}")
    if options.version_compatible:
        argv.append("--versionCompatible")
    if timing_cache is not None:
        argv.append(f"--timingCacheFile={timing_cache}")
    argv.append("--profilingVerbosity=detailed")
    if layer_info is not None:
        argv += ["--dumpLayerInfo", f"--exportLayerInfo={layer_info}"]
    argv.append("--skipInference")
    return argv
