"""Small file helpers shared by the build stage and the benchmark."""

from __future__ import annotations

import hashlib
from pathlib import Path

#: The weights of an ONNX model saved with external data, next to it (``model.onnx`` -> ``model.onnx.data``).
ONNX_DATA_SUFFIX = ".data"


def onnx_data(path: Path) -> Path:
    """Where an ONNX file's external weights are, when it has them (``<file>.data``)."""
    return Path(path).with_name(Path(path).name + ONNX_DATA_SUFFIX)


def sha256(path: Path) -> str:
    """The file's SHA-256, read in 1 MiB chunks; for an ONNX file with external weights, of both."""
    digest = hashlib.sha256()
    parts = [Path(path)]
    if Path(path).suffix == ".onnx" and onnx_data(path).exists():
        parts.append(onnx_data(path))
    for part in parts:
        with part.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()
