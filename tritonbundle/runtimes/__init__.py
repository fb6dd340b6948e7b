"""Runtimes: one folder per way of running a model's network, each a small plug-in.

A runtime folder holds ``plugin.py`` (the host side: checks a manifest entry, names its padding
policy and parameter record, writes the model's files and config fields), the served ``model.py``
where the runtime is a Python-backend model, and whatever only that runtime needs (TensorRT:
``engine.py``, ``check.py``). The tokenizer of text models lives in ``tokenizer/``.

The build stage asks :func:`get` for a plug-in and talks to it through the
:class:`~tritonbundle.runtimes.base.Runtime` protocol; nothing outside this package branches on a
runtime's name. Adding a runtime is one new folder plus one line in :data:`PLUGINS`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from tritonbundle.errors import ConfigError

if TYPE_CHECKING:
    from tritonbundle.runtimes.base import Runtime

#: Runtime name -> ``module:class`` of its plug-in (imported only when asked for).
PLUGINS = {
    "onnxruntime": "tritonbundle.runtimes.onnxruntime.plugin:OnnxRuntime",
    "tensorrt": "tritonbundle.runtimes.tensorrt.plugin:TensorRTRuntime",
    "pytorch": "tritonbundle.runtimes.pytorch.plugin:PyTorchRuntime",
}


def names() -> tuple[str, ...]:
    return tuple(PLUGINS)


def get(name: str) -> Runtime:
    if name not in PLUGINS:
        raise ConfigError(f"unknown runtime {name!r}; allowed: {', '.join(PLUGINS)}")
    module, cls = PLUGINS[name].split(":")
    runtime: Runtime = getattr(importlib.import_module(module), cls)()
    return runtime
