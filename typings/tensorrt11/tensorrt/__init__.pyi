# Type stubs for the subset of the TensorRT 11 Python API that tritonbundle calls
# (tritonbundle/runtimes/tensorrt/engine.py). Written from NVIDIA/TensorRT tag v11.1
# (commit 82d1dca801c8318a5605399d5240780d0679e4e1, VERSION 11.1.0.106): each signature cites the
# pybind11 definition it comes from (python/src/infer/pyCore.cpp = pyCore, python/src/infer/
# pyFoundationalTypes.cpp = pyFT, python/src/parsers/pyOnnx.cpp = pyOnnx). Only what exists in 11 is
# here: BuilderFlag.FP16/BF16/INT8, the INT8 calibrators (pyInt8.cpp is gone), IBuilderConfig.
# int8_calibrator/set_calibration_profile and Builder.platform_has_fast_fp16/int8 were removed, so
# code that uses them fails `make lint` against these stubs.
from collections.abc import Sequence

from typing_extensions import Buffer
from enum import IntEnum
from typing import ClassVar, overload

__version__: str  # python/packaging/bindings_wheel/tensorrt/__init__.py:98

class ILogger:  # pyCore 923-933: nested enum Severity, exported into ILogger
    class Severity(IntEnum):
        INTERNAL_ERROR = 0
        ERROR = 1
        WARNING = 2
        INFO = 3
        VERBOSE = 4
    INTERNAL_ERROR: ClassVar[ILogger.Severity]
    ERROR: ClassVar[ILogger.Severity]
    WARNING: ClassVar[ILogger.Severity]
    INFO: ClassVar[ILogger.Severity]
    VERBOSE: ClassVar[ILogger.Severity]
    def log(self, severity: ILogger.Severity, msg: str) -> None: ...

class Logger(ILogger):  # pyCore 996-999: py::init<Severity>(), "min_severity"_a = kWARNING
    min_severity: ILogger.Severity
    def __init__(self, min_severity: ILogger.Severity = ...) -> None: ...

class Dims:  # pyFT 234-255: init(), init(vector<int64_t> shape); implicitly convertible from a sequence
    MAX_DIMS: ClassVar[int]
    @overload
    def __init__(self) -> None: ...
    @overload
    def __init__(self, shape: Sequence[int]) -> None: ...
    def __len__(self) -> int: ...
    def __getitem__(self, index: int) -> int: ...

# Enum values are NvInfer.h's (v11.1), not the order pyCore lists them in; tests/runtimes/tensorrt/test_enums.py
# checks them.
class NetworkDefinitionCreationFlag(IntEnum):  # pyCore 1771-1779; NvInfer.h 11462-11481 (STRONGLY_TYPED: deprecated, ignored)
    STRONGLY_TYPED = 0
    PREFER_JIT_PYTHON_PLUGINS = 1
    PREFER_AOT_PYTHON_PLUGINS = 2

class BuilderFlag(IntEnum):  # pyCore 1599-1623; NvInfer.h 9958-10098 (no FP16, BF16, INT8, FP8, INT4, FP4 in 11)
    DEBUG = 2
    GPU_FALLBACK = 3
    REFIT = 4
    DISABLE_TIMING_CACHE = 5
    TF32 = 6
    SPARSE_WEIGHTS = 7
    SAFETY_SCOPE = 8
    DIRECT_IO = 11
    VERSION_COMPATIBLE = 12
    EXCLUDE_LEAN_RUNTIME = 13
    ERROR_ON_TIMING_CACHE_MISS = 15
    DISABLE_COMPILATION_CACHE = 17
    STRIP_PLAN = 18
    REFIT_IDENTICAL = 19
    WEIGHT_STREAMING = 20
    REFIT_INDIVIDUAL = 22
    STRICT_NANS = 23
    MONITOR_MEMORY = 24
    EDITABLE_TIMING_CACHE = 26
    DISTRIBUTIVE_INDEPENDENCE = 27

class MemoryPoolType(IntEnum):  # pyCore 1625-1631; NvInfer.h 10288
    WORKSPACE = 0
    DLA_MANAGED_SRAM = 1
    DLA_LOCAL_DRAM = 2
    DLA_GLOBAL_DRAM = 3
    TACTIC_DRAM = 4
    TACTIC_SHARED_MEMORY = 5

class HardwareCompatibilityLevel(IntEnum):  # pyCore 1639-1644; NvInfer.h 10396
    NONE = 0
    AMPERE_PLUS = 1
    SAME_COMPUTE_CAPABILITY = 2

class ProfilingVerbosity(IntEnum):  # pyCore 1662-1665; NvInferRuntime.h 2791
    LAYER_NAMES_ONLY = 0
    NONE = 1
    DETAILED = 2

class LayerInformationFormat(IntEnum):  # pyCore 1378-1380; NvInferRuntime.h 4877
    ONELINE = 0
    JSON = 1

class ITensor:
    name: str

class INetworkDefinition:
    @property
    def num_inputs(self) -> int: ...
    def get_input(self, index: int) -> ITensor: ...

class IOptimizationProfile:  # pyCore 1038-1050: set_shape("input"_a, "min"_a, "opt"_a, "max"_a)
    def set_shape(self, input: str, min: Dims | Sequence[int], opt: Dims | Sequence[int], max: Dims | Sequence[int]) -> None: ...
    def get_shape(self, input: str) -> list[Dims]: ...
    def __bool__(self) -> bool: ...

class IHostMemory(Buffer):  # pyFT 297-302: buffer protocol
    @property
    def nbytes(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...

class ITimingCache:  # pyCore 1685-1697
    def serialize(self) -> IHostMemory: ...
    def combine(self, input_cache: ITimingCache, ignore_mismatch: bool) -> bool: ...  # no default
    def reset(self) -> bool: ...

class IBuilderConfig:  # pyCore 1707-1768 (no int8_calibrator, set/get_calibration_profile in 11)
    builder_optimization_level: int  # 1750
    profiling_verbosity: ProfilingVerbosity  # 1733
    hardware_compatibility_level: HardwareCompatibilityLevel  # 1753
    flags: int
    def set_memory_pool_limit(self, pool: MemoryPoolType, pool_size: int) -> None: ...  # 1711
    def get_memory_pool_limit(self, pool: MemoryPoolType) -> int: ...
    def set_flag(self, flag: BuilderFlag) -> None: ...  # 1720
    def clear_flag(self, flag: BuilderFlag) -> None: ...  # 1719
    def get_flag(self, flag: BuilderFlag) -> bool: ...
    def add_optimization_profile(self, profile: IOptimizationProfile) -> int: ...  # 1724
    def create_timing_cache(self, serialized_timing_cache: Buffer) -> ITimingCache: ...  # 1738
    def set_timing_cache(self, cache: ITimingCache, ignore_mismatch: bool) -> bool: ...  # 1740, no default
    def get_timing_cache(self) -> ITimingCache | None: ...  # 1743

class Builder:  # pyCore 1782-1830 (no platform_has_fast_fp16/int8/tf32 in 11)
    def __init__(self, logger: ILogger) -> None: ...  # 1785
    def create_network(self, flags: int = 0) -> INetworkDefinition: ...  # 1787
    def create_optimization_profile(self) -> IOptimizationProfile: ...  # 1792
    def create_builder_config(self) -> IBuilderConfig: ...  # 1796
    def build_serialized_network(self, network: INetworkDefinition, config: IBuilderConfig) -> IHostMemory | None: ...  # 1798

class EngineInspector:  # pyCore 1384-1393
    def get_engine_information(self, format: LayerInformationFormat) -> str: ...
    def get_layer_information(self, layer_index: int, format: LayerInformationFormat) -> str: ...

class ICudaEngine:  # pyCore 1523-1524
    def create_engine_inspector(self) -> EngineInspector | None: ...

class Runtime:  # pyCore 1833-1858
    engine_host_code_allowed: bool  # 1855
    def __init__(self, logger: ILogger) -> None: ...  # 1836
    def deserialize_cuda_engine(self, serialized_engine: Buffer) -> ICudaEngine | None: ...  # 1838
    def load_runtime(self, path: str) -> Runtime: ...

class ErrorCode(IntEnum):  # pyOnnx 221
    SUCCESS = 0

class ParserError:  # pyOnnx 240-248
    def code(self) -> ErrorCode: ...
    def desc(self) -> str: ...
    def node(self) -> int: ...
    def node_name(self) -> str: ...
    def node_operator(self) -> str: ...

class OnnxParser:  # pyOnnx 174-191
    def __init__(self, network: INetworkDefinition, logger: ILogger) -> None: ...  # 177
    def parse_from_file(self, model: str) -> bool: ...  # 182
    @property
    def num_errors(self) -> int: ...  # 190
    def get_error(self, index: int) -> ParserError: ...  # 191
