"""The protocol every task plug-in follows."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from tritonbundle.contract import Parameters
from tritonbundle.manifest import ModelSpec
from tritonbundle.runtimes.base import BuildContext, Runtime

#: Triton model name -> the parameter record its config carries (None: an ensemble's own).
Written = dict[str, type[Parameters] | None]


class Task(Protocol):
    #: The manifest's name (``task: text-classification``).
    name: str
    #: The client method that calls the user-facing model (``infer``, ``embed``, ``classify``, ``rerank``).
    method: str

    def check(self, spec: ModelSpec) -> None:
        """Refuse, with a :class:`ConfigError` naming the manifest key, a spec this task cannot serve."""
        ...

    def write(self, ctx: BuildContext, runtime: Runtime, staging: Path, tokenizer_json: Path | None) -> Written:
        """Write the Triton models around the encoder (the encoder itself is the runtime's) into ``staging``."""
        ...
