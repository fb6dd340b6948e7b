"""Tasks: what the user-facing model takes and returns, a plug-in like a runtime.

``tensor`` (the ONNX graph's own inputs and outputs), ``text-embedding``, ``text-classification`` and
``text-pair`` (cross-encoder scores). A task owns the Triton models around the encoder (the tokenizer,
the post-processing model, the ensemble), names the client method that calls it (``infer``, ``embed``,
``classify``, ``rerank``) and makes the requests load tests, tune and ``tritonbundle infer --random``
send (:mod:`tritonbundle.payloads`). The runtimes stay unaware of tasks; the build stage, the CLI
and the measurement code ask the task.
"""

from __future__ import annotations

from tritonbundle.contract import TASKS
from tritonbundle.errors import ConfigError
from tritonbundle.tasks.base import Task


def get(name: str) -> Task:
    from tritonbundle.tasks.tensor import TensorTask
    from tritonbundle.tasks.text import TextTask

    if name not in TASKS:
        raise ConfigError(f"unknown task {name!r}; allowed: {', '.join(TASKS)}")
    return TensorTask() if name == "tensor" else TextTask(name)


def names() -> tuple[str, ...]:
    return TASKS
