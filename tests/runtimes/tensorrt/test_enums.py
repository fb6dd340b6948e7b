"""typings/tensorrt11 carries TensorRT 11's enum values as NvInfer.h defines them (pybind11 exports the C++
values, not list positions). The table below is copied from NVIDIA/TensorRT v11.1 (commit 82d1dca8):
``include/NvInfer.h`` BuilderFlag 9958-10098, NetworkDefinitionCreationFlag 11462-11481, MemoryPoolType
10288, HardwareCompatibilityLevel 10396; ``include/NvInferRuntime.h`` ProfilingVerbosity 2791,
LayerInformationFormat 4877. scripts/check_tensorrt_enums.py compares the stub with a header checkout."""

from __future__ import annotations

from tests.runtimes.tensorrt.doubles import ENUMS

NVINFER_11_1 = {
    "BuilderFlag": {
        "DEBUG": 2, "GPU_FALLBACK": 3, "REFIT": 4, "DISABLE_TIMING_CACHE": 5, "TF32": 6, "SPARSE_WEIGHTS": 7,
        "SAFETY_SCOPE": 8, "DIRECT_IO": 11, "VERSION_COMPATIBLE": 12, "EXCLUDE_LEAN_RUNTIME": 13,
        "ERROR_ON_TIMING_CACHE_MISS": 15, "DISABLE_COMPILATION_CACHE": 17, "STRIP_PLAN": 18, "REFIT_IDENTICAL": 19,
        "WEIGHT_STREAMING": 20, "REFIT_INDIVIDUAL": 22, "STRICT_NANS": 23, "MONITOR_MEMORY": 24,
        "EDITABLE_TIMING_CACHE": 26, "DISTRIBUTIVE_INDEPENDENCE": 27,
    },
    "NetworkDefinitionCreationFlag": {"STRONGLY_TYPED": 0, "PREFER_JIT_PYTHON_PLUGINS": 1, "PREFER_AOT_PYTHON_PLUGINS": 2},
    "MemoryPoolType": {"WORKSPACE": 0, "DLA_MANAGED_SRAM": 1, "DLA_LOCAL_DRAM": 2, "DLA_GLOBAL_DRAM": 3,
                       "TACTIC_DRAM": 4, "TACTIC_SHARED_MEMORY": 5},
    "HardwareCompatibilityLevel": {"NONE": 0, "AMPERE_PLUS": 1, "SAME_COMPUTE_CAPABILITY": 2},
    "ProfilingVerbosity": {"LAYER_NAMES_ONLY": 0, "NONE": 1, "DETAILED": 2},
    "LayerInformationFormat": {"ONELINE": 0, "JSON": 1},
}


def test_every_enum_of_the_tensorrt_11_stub_has_nvinfer_values() -> None:
    stub = ENUMS.stub_enums()
    assert set(NVINFER_11_1) <= set(stub)
    assert ENUMS.differences(stub, NVINFER_11_1) == []
    assert stub["BuilderFlag"]["TF32"] == 6  # the value the list-position copy got wrong (5)


def test_the_header_reader_takes_values_not_positions_and_skips_comments() -> None:
    header = """
    enum class BuilderFlag : int32_t
    {
        //! kFP16 = 0 was removed in 11
        kDEBUG = 2,
        kSAFETY_SCOPE TRT_DEPRECATED_ENUM = 8,
        kTF32 = 6,
    };
    """
    assert ENUMS.header_enums(header) == {"BuilderFlag": {"DEBUG": 2, "SAFETY_SCOPE": 8, "TF32": 6}}
    assert ENUMS.differences({"BuilderFlag": {"TF32": 5}}, ENUMS.header_enums(header)) == [
        "BuilderFlag.TF32: stub 5, header 6"]
