"""Test doubles for the parts of TensorRT and Polygraphy that cannot run here, built to behave like the
library where a caller can get it wrong. None of them stands in for an engine's numerics: the "engine"
below *is* the FP32 ONNX (run by ONNX Runtime), so a gate driven through it must pass, and any failure
is the caller's handling of buffers, profiles or contexts.

- :func:`tensorrt11_enum` reads an enum of ``typings/tensorrt11`` (the one copy of TensorRT 11's values,
  checked against ``NvInfer.h`` in test_enums.py), so the recording double of test_builder_calls.py
  cannot drift from the stub mypy checks against.
- :class:`OnnxEngine` + :class:`ReusingTrtRunner`: Polygraphy's ``TrtRunner`` as its caller sees it
  (polygraphy 0.53.6, ``polygraphy/backend/trt/runner.py``), on Polygraphy's own ``BaseRunner`` (input
  checks, activation bookkeeping) and its own buffer helpers:

  * each output is copied into one flat ``uint8`` host buffer per output name that lives as long as the
    runner is active, resized in place with ``util.array.resize_or_reallocate`` (``numpy.ndarray.resize``
    with ``refcheck=False``), and returned as ``util.array.view`` of it (``_get_array_on_cpu`` and
    ``_infer_impl``): the next call overwrites, and may move, what the previous call returned;
  * the shapes must lie within the active optimization profile's min/max, or ``set_input_shape``
    fails (``G_LOGGER.critical``: "failed to set shape"); the profile is the one passed as
    ``optimization_profile``, else profile 0 (``activate_impl`` / ``set_profile``);
  * each active runner holds an execution context; ``allocation_strategy`` None/"static" sizes its
    device memory for the largest profile, "profile" for the active one. The engine records the
    contexts alive and the memory they hold, so a test can see what a caller keeps.
"""

from __future__ import annotations

import ctypes
import importlib.util
from collections import OrderedDict
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from polygraphy import util
from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata
from polygraphy.datatype import DataType
from polygraphy.logger import G_LOGGER

ROOT = Path(__file__).resolve().parents[3]


def _load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: scripts/check_tensorrt_enums.py: reads the stub's enums and TensorRT's headers.
ENUMS = _load_script("check_tensorrt_enums")


def tensorrt11_enum(name: str) -> type[IntEnum]:
    """The ``IntEnum`` class ``name`` of typings/tensorrt11, with the stub's values."""
    return IntEnum(name, ENUMS.stub_enums()[name])  # type: ignore[return-value]


Shapes = dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]


@dataclass
class OnnxEngine:
    """Stands in for a deserialized ``ICudaEngine`` whose plan was built from ``onnx_path`` with ``profiles``:
    it runs the ONNX itself. ``activity`` records what the runners did, in order."""

    onnx_path: Path
    profiles: list[Shapes]
    activity: list[tuple[Any, ...]] = field(default_factory=list)
    live_contexts: int = 0
    peak_contexts: int = 0
    #: Bytes of context memory held now and at most (a row of ``max`` shape counts one byte per element).
    live_bytes: int = 0
    peak_bytes: int = 0

    def __post_init__(self) -> None:
        import onnxruntime as ort

        self.session = ort.InferenceSession(str(self.onnx_path), providers=["CPUExecutionProvider"])

    def memory_for(self, profile: int | None) -> int:
        chosen = self.profiles if profile is None else [self.profiles[profile]]
        return max(sum(int(np.prod(hi)) for _, _, hi in p.values()) for p in chosen)


class ReusingTrtRunner(BaseRunner):  # type: ignore[misc]
    """Polygraphy's TrtRunner, as its caller sees it (module docstring)."""

    def __init__(self, engine: OnnxEngine, name: str | None = None, optimization_profile: int | None = None,
                 allocation_strategy: str | None = None) -> None:
        super().__init__(name=name, prefix="trt-runner-double")
        self._engine = engine
        self.optimization_profile = optimization_profile
        self.allocation_strategy = allocation_strategy

    def activate_impl(self) -> None:
        engine = self._engine
        strategy = util.default(self.allocation_strategy, "static")
        if strategy not in ("static", "profile", "runtime"):
            G_LOGGER.critical("Invalid allocation strategy specified.")
        self.profile = util.default(self.optimization_profile, 0)
        self.context_bytes = engine.memory_for(None if strategy == "static" else self.profile)
        engine.live_contexts += 1
        engine.live_bytes += self.context_bytes
        engine.peak_contexts = max(engine.peak_contexts, engine.live_contexts)
        engine.peak_bytes = max(engine.peak_bytes, engine.live_bytes)
        engine.activity.append(("activate", self.profile, strategy))
        self.host_output_buffers: OrderedDict[str, Any] = OrderedDict()

    def get_input_metadata_impl(self) -> TensorMetadata:
        meta = TensorMetadata()
        for tensor in self._engine.session.get_inputs():
            dtype = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(float)": np.float32,
                     "tensor(float16)": np.float16, "tensor(bool)": np.bool_}[tensor.type]
            meta.add(tensor.name, DataType.from_dtype(np.dtype(dtype)), [-1 if not isinstance(d, int) else d
                                                                         for d in tensor.shape])
        return meta

    def infer_impl(self, feed_dict: dict[str, Any]) -> OrderedDict[str, Any]:
        shapes = self._engine.profiles[self.profile]
        for name, array in feed_dict.items():
            lo, _, hi = shapes[name]
            if len(array.shape) != len(lo) or not all(a <= d <= b for a, d, b in zip(lo, array.shape, hi)):
                G_LOGGER.critical(f"For input: {name}, failed to set shape to: {tuple(array.shape)} "
                                  f"(profile {self.profile}: min {lo}, max {hi})")
        self._engine.activity.append(("infer", self.profile, {n: tuple(a.shape) for n, a in feed_dict.items()}))
        names = [o.name for o in self._engine.session.get_outputs()]
        results = self._engine.session.run(names, dict(feed_dict))
        out: OrderedDict[str, Any] = OrderedDict()
        for name, result in zip(names, results):
            result = np.ascontiguousarray(result)
            if name not in self.host_output_buffers:
                self.host_output_buffers[name] = np.empty((result.nbytes,), dtype=np.uint8)
            buffer = util.array.resize_or_reallocate(self.host_output_buffers[name], (result.nbytes,))
            self.host_output_buffers[name] = buffer
            ctypes.memmove(util.array.data_ptr(buffer), result.ctypes.data, result.nbytes)
            out[name] = util.array.view(buffer, DataType.from_dtype(result.dtype), result.shape)
        return out

    def deactivate_impl(self) -> None:
        engine = self._engine
        engine.live_contexts -= 1
        engine.live_bytes -= self.context_bytes
        engine.activity.append(("deactivate", self.profile))
        del self.host_output_buffers
