"""Which TensorRT calls the builder makes, checked with a recording double of the ``tensorrt`` module.

The double has only what TensorRT 11 has (no ``BuilderFlag.FP16/INT8``, no calibrators, no
``platform_has_fast_fp16``), so a call TensorRT 11 removed fails here too. It records calls; it
never stands in for an engine: nothing here says a plan would build or run.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

from tests.runtimes.tensorrt.doubles import tensorrt11_enum
from tritonbundle.runtimes.tensorrt import engine as te

CALLS: list[tuple[Any, ...]] = []


class _Config:
    def __init__(self) -> None:
        self.builder_optimization_level = 3
        self.profiling_verbosity = None
        self.hardware_compatibility_level = None

    def set_memory_pool_limit(self, pool: Any, size: int) -> None:
        CALLS.append(("set_memory_pool_limit", size))

    def set_flag(self, flag: Any) -> None:
        CALLS.append(("set_flag", flag.name))

    def clear_flag(self, flag: Any) -> None:
        CALLS.append(("clear_flag", flag.name))

    def add_optimization_profile(self, profile: Any) -> int:
        CALLS.append(("add_optimization_profile", dict(profile.shapes)))
        return 0


class _Profile:
    def __init__(self) -> None:
        self.shapes: dict[str, tuple[Any, ...]] = {}

    def set_shape(self, name: str, lo: Any, opt: Any, hi: Any) -> None:
        self.shapes[name] = (tuple(lo), tuple(opt), tuple(hi))


class _Input:
    def __init__(self, name: str) -> None:
        self.name = name


class _Network:
    num_inputs = 2

    def get_input(self, i: int) -> _Input:
        return _Input(["input_ids", "attention_mask"][i])


class _Builder:
    def __init__(self, logger: Any) -> None:
        pass

    def create_network(self, flags: int) -> _Network:
        CALLS.append(("create_network", flags))
        return _Network()

    def create_builder_config(self) -> _Config:
        return _Config()

    def create_optimization_profile(self) -> _Profile:
        return _Profile()


class _Parser:
    num_errors = 0

    def __init__(self, network: Any, logger: Any) -> None:
        pass

    def parse_from_file(self, path: str) -> bool:
        CALLS.append(("parse_from_file", Path(path).name))
        return True


class _Runtime:
    def __init__(self, logger: Any) -> None:
        self._host = False

    @property
    def engine_host_code_allowed(self) -> bool:
        return self._host

    @engine_host_code_allowed.setter
    def engine_host_code_allowed(self, value: bool) -> None:
        CALLS.append(("engine_host_code_allowed", value))
        self._host = value

    def deserialize_cuda_engine(self, plan: bytes) -> object:
        CALLS.append(("deserialize_cuda_engine", self._host))
        return object()


@pytest.fixture
def fake_tensorrt(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    trt = types.ModuleType("tensorrt")
    trt.Logger = type("Logger", (), {"WARNING": 2, "__init__": lambda self, severity=2: None})  # type: ignore[attr-defined]
    trt.Builder = _Builder  # type: ignore[attr-defined]
    trt.OnnxParser = _Parser  # type: ignore[attr-defined]
    trt.Runtime = _Runtime  # type: ignore[attr-defined]
    for enum in ("BuilderFlag", "NetworkDefinitionCreationFlag", "MemoryPoolType", "ProfilingVerbosity",
                 "HardwareCompatibilityLevel"):  # TensorRT 11's values, from typings/tensorrt11
        setattr(trt, enum, tensorrt11_enum(enum))
    trt.Dims = lambda shape: tuple(shape)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    CALLS.clear()
    return trt


PROFILE = {"input_ids": ((1, 1), (8, 64), (8, 64)), "attention_mask": ((1, 1), (8, 64), (8, 64))}
H200 = te.Platform("NVIDIA H200", "9.0", "11.1.0.106")


def _config(precision: str, **options: Any) -> tuple[te.CreateConfig, list[tuple[Any, ...]]]:
    net = te.NetworkFromOnnxPath(Path("model.onnx"))()
    create = te.CreateConfig(te.EngineOptions(precision=precision, profiles=(PROFILE,), **options), platform=H200)
    create(net)
    return create, list(CALLS)


def test_networks_are_strongly_typed_with_the_flag_read_from_tensorrt(fake_tensorrt: Any) -> None:
    _config("fp16")
    assert ("create_network", 1 << 0) in CALLS  # TensorRT 11's value of STRONGLY_TYPED; 10.13's is 1
    assert ("parse_from_file", "model.onnx") in CALLS


def test_fp32_clears_tf32_and_says_so_in_the_recorded_flags(fake_tensorrt: Any) -> None:
    create, calls = _config("fp32")
    assert ("clear_flag", "TF32") in calls
    assert create.flags == ("-TF32",)


@pytest.mark.parametrize("precision", ["fp16", "bf16", "int8"])
def test_lower_precisions_set_no_precision_flag(fake_tensorrt: Any, precision: str) -> None:
    create, calls = _config(precision)
    assert not [c for c in calls if c[0] in ("set_flag", "clear_flag")]  # the ONNX holds the precision
    assert create.flags == ()


def test_version_compatibility_sets_its_flag_and_every_profile_is_added(fake_tensorrt: Any) -> None:
    create, calls = _config("fp16", version_compatible=True)
    assert ("set_flag", "VERSION_COMPATIBLE") in calls and "VERSION_COMPATIBLE" in create.flags
    assert ("add_optimization_profile", PROFILE) in calls


def test_a_version_compatible_plan_is_deserialized_with_host_code_allowed(fake_tensorrt: Any) -> None:
    te.deserialize(b"plan", version_compatible=True)
    assert CALLS == [("engine_host_code_allowed", True), ("deserialize_cuda_engine", True)]
    CALLS.clear()
    te.deserialize(b"plan", version_compatible=False)
    assert CALLS == [("deserialize_cuda_engine", False)]


def test_bf16_on_a_gpu_before_ampere_is_refused_before_any_build(fake_tensorrt: Any) -> None:
    from tritonbundle.errors import BuildError

    net = te.NetworkFromOnnxPath(Path("model.onnx"))()
    turing = te.Platform("Tesla T4", "7.5", "11.1.0.106")
    with pytest.raises(BuildError, match="bf16 needs compute capability >= 8.0, this GPU has 7.5"):
        te.CreateConfig(te.EngineOptions(precision="bf16", profiles=(PROFILE,)), platform=turing)(net)
