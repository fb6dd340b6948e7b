"""Small file helpers shared by the build stage and the benchmark."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

from tritonbundle.errors import ConfigError

#: The weights of an ONNX model saved with external data, next to it (``model.onnx`` -> ``model.onnx.data``).
ONNX_DATA_SUFFIX = ".data"
#: The weights one ONNX file holds at most: protobuf's 2 GiB (``onnx.checker.MAXIMUM_PROTOBUF``), less room
#: for the graph around them. A model with more is saved with its weights beside it.
ONNX_FILE_WEIGHTS = (2 << 30) - (64 << 20)


def onnx_data(path: Path) -> Path:
    """Where an ONNX file's external weights are, when it has them (``<file>.data``)."""
    return Path(path).with_name(Path(path).name + ONNX_DATA_SUFFIX)


def tensor_bytes(tensor: Any) -> int:
    """An ONNX tensor's size from its type and dims (``ByteSize()`` walks the data: seconds per GB)."""
    from onnx import helper

    return int(math.prod(tensor.dims) * helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize)


def save_onnx(model: Any, path: Path, *, external: bool = False) -> None:
    """Save ``model`` at ``path``, with its weights in ``<path>.data`` beside it when ``external`` or when
    they are more than one file holds (:data:`ONNX_FILE_WEIGHTS`). A ``.data`` left from an earlier save
    is removed first: onnx appends to an existing one."""
    import onnx

    data = onnx_data(path)
    data.unlink(missing_ok=True)
    if external or sum(map(tensor_bytes, model.graph.initializer)) > ONNX_FILE_WEIGHTS:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data.name, size_threshold=1024)
    else:
        onnx.save_model(model, str(path))


def onnx_weight_files(path: Path) -> list[str]:
    """The files an ONNX model's external weights are in, relative to its folder: ``<file>.data`` as the
    build stage saves them, or whatever an exporter named them (Optimum: ``model.onnx_data``); [] when
    the weights are inside the file. Only the graph's structure is read, not the weights."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors, uses_external_data

    model = onnx.load(str(path), load_external_data=False)
    files = sorted({ExternalDataInfo(t).location for t in _get_all_tensors(model) if uses_external_data(t)})
    outside = [f for f in files if Path(f).is_absolute() or ".." in Path(f).parts]
    if outside:  # copied into a version folder under the same name: never outside it
        raise ConfigError(f"{path}: its weights are outside its folder ({', '.join(outside)}): save them beside it")
    return files


def sha256(path: Path) -> str:
    """The file's SHA-256, read in 1 MiB chunks; for an ONNX file with external weights, of both."""
    digest = hashlib.sha256()
    parts = [Path(path)]
    if Path(path).suffix == ".onnx":  # and its external weights, whatever their names
        parts += [Path(path).parent / location for location in onnx_weight_files(path)]
    for part in parts:
        with part.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def write_json(result: dict[str, Any], path: Path) -> Path:
    """``result`` as JSON, written whole or not at all (inf as "inf", NaN as null)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_clean(result), indent=2, default=str))
    tmp.replace(path)
    return path


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf"
        return value
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value
