"""``tensor``: the user calls the encoder itself, with the ONNX graph's own inputs and outputs."""

from __future__ import annotations

from pathlib import Path

from tritonbundle.contract import TASK_METHODS
from tritonbundle.errors import ConfigError
from tritonbundle.manifest import ModelSpec
from tritonbundle.runtimes.base import BuildContext, Runtime
from tritonbundle.tasks.base import Written


class TensorTask:
    name = "tensor"
    method = TASK_METHODS["tensor"]

    def check(self, spec: ModelSpec) -> None:
        if spec.tokenize_in_encoder:
            raise ConfigError(f"model {spec.name}.tokenize_in_encoder: a tensor model has no text to tokenize")

    def write(self, ctx: BuildContext, runtime: Runtime, staging: Path, tokenizer_json: Path | None) -> Written:
        return {}  # the encoder is the model users call
