"""Runtimes: small plug-ins that write one model's files and config fields.

Nothing outside this package branches on the runtime: the build stage asks :func:`get` for the
plug-in and calls :meth:`Runtime.config` and :meth:`Runtime.write_files`.
"""

from __future__ import annotations

from tritonbundle.errors import ConfigError
from tritonbundle.runtimes.base import BuildContext, Runtime


def get(name: str) -> Runtime:
    if name == "onnxruntime":
        from tritonbundle.runtimes.onnxruntime import OnnxRuntime

        return OnnxRuntime()
    if name == "tensorrt":
        from tritonbundle.runtimes.tensorrt import TensorRTRuntime

        return TensorRTRuntime()
    if name == "pytorch":
        from tritonbundle.runtimes.pytorch import PyTorchRuntime

        return PyTorchRuntime()
    raise ConfigError(f"unknown runtime {name!r}; allowed: onnxruntime, tensorrt, pytorch")


__all__ = ["BuildContext", "Runtime", "get"]
