"""``tritonbundle init``: a manifest entry written from an ONNX graph, which ``plan`` and ``build`` accept as is.

From the graph: every input and output with its data type and dimensions. A dynamic first dimension
shared by every input and output (one name in the graph, on all of them) is ``batch``; the second dimension of token inputs (``input_ids``,
``attention_mask``, ``token_type_ids``) is ``sequence``; any other dynamic dimension keeps the name the
exporter gave it (``height``, ``width``; ``dim_2`` when it has none). The task: ``--task``, else, for a
graph that takes ``input_ids``, a text task when a tokenizer is given or lies next to the ONNX file
(``text-classification`` when the only output is ``logits``, else ``text-embedding``), else ``tensor``. Hugging Face exports (``optimum``,
``save_pretrained``) put ``tokenizer.json`` and ``config.json`` next to ``model.onnx``: both are found.

A named axis other than ``sequence`` needs its largest size (``--axis height=1024``) or a traffic
sample that gives it; a text model needs a traffic sample of token counts (the manifest's, ``--traffic``,
or a synthetic chat sample written next to the manifest).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tritonbundle.build.onnx_check import ONNX_DTYPES
from tritonbundle.contract import TASKS, TEXT_TASKS
from tritonbundle.errors import ConfigError
from tritonbundle.manifest import BATCH, SEQUENCE

TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
BATCH_NAMES = {"batch", "batch_size", "n", "bs"}
SEQUENCE_NAMES = {"sequence", "sequence_length", "seq_len", "seq", "sequence_len", "max_seq_len", "tokens"}


def _axis_name(param: str, position: int) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", param).strip("_")
    if not name:
        return f"dim_{position}"
    return name if re.match(r"^[A-Za-z_]", name) else f"d_{name}"


def _tensors(values: Sequence[Any], *, batched: bool, text: bool) -> list[dict[str, Any]]:
    out = []
    for value in values:
        ttype = value.type.tensor_type
        dtype = ONNX_DTYPES.get(ttype.elem_type)
        if dtype is None:
            raise ConfigError(f"{value.name}: ONNX element type {ttype.elem_type} has no Triton data type")
        shape: list[int | str] = []
        for position, dim in enumerate(ttype.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                shape.append(int(dim.dim_value))
            elif position == 0 and batched:
                shape.append(BATCH)
            elif text and position == 1 and (value.name in TOKEN_INPUTS or dim.dim_param.lower() in SEQUENCE_NAMES):
                shape.append(SEQUENCE)
            else:
                name = _axis_name(dim.dim_param, position)
                name = SEQUENCE if name.lower() in SEQUENCE_NAMES and text else name
                if name == BATCH or (name == SEQUENCE and not text):  # the manifest's own names, elsewhere
                    name = f"{name}_{position}"
                shape.append(name)
        out.append({"name": value.name, "dtype": dtype, "shape": shape})
    return out


def unbatched_why(graph: Any, *, text: bool = False) -> str | None:
    """Why ``graph`` is not batched (None: it is). Batched only where one named dimension leads every input
    and every output: Triton splits a batch's outputs by the rows each request sent, so an output whose
    first dimension is another quantity (detections: [num_boxes, 4]) would hand requests each other's rows;
    nor where the batch is a later dimension (time-major [sequence, batch, ...]). A text task's encoder
    takes [batch, sequence] and answers per text (its contract): any dynamic first dimensions will do,
    whatever the exporter named its outputs' (``batch_size``, ``Addlogits_dim_0``, ``unk__3``)."""
    initializers = {i.name for i in graph.initializer}
    values = [v for v in graph.input if v.name not in initializers] + list(graph.output)
    leading = {v.name: (v.type.tensor_type.shape.dim[0].dim_param or "?") if len(v.type.tensor_type.shape.dim) > 0
               and not v.type.tensor_type.shape.dim[0].dim_value else "" for v in values}
    fixed = [name for name, dim in leading.items() if not dim]
    if fixed:
        return f"{', '.join(fixed)} start with a fixed dimension (or have none)"
    if text:
        return None
    if len(set(leading.values())) > 1 or "?" in leading.values():
        return ("their first dimensions are named differently (" + ", ".join(f"{n}: {d}" for n, d in leading.items())
                + "); the batch is one name on every input and output: if each is the batch, name them alike in the "
                  "export (torch.onnx.export's dynamic_axes), or write `batch` in the entry by hand")
    name = next(iter(leading.values()))
    later = {d.dim_param.lower() for v in values for d in list(v.type.tensor_type.shape.dim)[1:]}
    if name.lower() in SEQUENCE_NAMES or later & BATCH_NAMES:
        return f"their first dimension {name!r} is a sequence, and a later one names the batch (time-major)"
    return None


def guess_task(output_names: Sequence[str], tokenizer: Path | None) -> str:
    if tokenizer is None:
        return "tensor"
    return "text-classification" if list(output_names) == ["logits"] else "text-embedding"


def describe(onnx_path: Path, *, name: str, task: str | None = None, tokenizer: Path | None = None,
             axes: Mapping[str, int] | None = None, relative_to: Path | None = None) -> dict[str, Any]:
    """The manifest entry of the model at ``onnx_path`` (paths relative to ``relative_to``, the manifest's folder)."""
    import onnx

    if not onnx_path.is_file():
        raise ConfigError(f"{onnx_path} does not exist")
    try:
        graph = onnx.load(str(onnx_path), load_external_data=False).graph
    except Exception as e:  # noqa: BLE001 - onnx raises DecodeError and friends
        raise ConfigError(f"{onnx_path} is not a readable ONNX model: {e}") from e
    initializers = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in initializers]
    takes_tokens = TOKEN_INPUTS[0] in {i.name for i in inputs}
    if tokenizer is None and (task in TEXT_TASKS or (task is None and takes_tokens)) \
            and (onnx_path.parent / "tokenizer.json").is_file():
        tokenizer = onnx_path.parent / "tokenizer.json"
    task = task or guess_task([o.name for o in graph.output], tokenizer if takes_tokens else None)
    if task not in TASKS:
        raise ConfigError(f"task {task!r} is not one of {', '.join(TASKS)}")
    text = task in TEXT_TASKS
    if text and tokenizer is None:
        raise ConfigError(f"a {task} model needs its tokenizer.json: pass --tokenizer PATH")

    batched = unbatched_why(graph, text=text) is None
    base = relative_to or onnx_path.parent

    def rel(path: Path) -> str:
        try:
            return str(path.resolve().relative_to(base.resolve()))
        except ValueError:
            return str(path.resolve())

    entry: dict[str, Any] = {"name": name, "task": task, "source": {"onnx": rel(onnx_path)}}
    if tokenizer is not None and text:
        entry["tokenizer"] = {"file": rel(tokenizer)}
    entry["inputs"] = _tensors(inputs, batched=batched, text=text)
    entry["outputs"] = _tensors(graph.output, batched=batched, text=text)
    named = {d for t in entry["inputs"] for d in t["shape"][1 if batched else 0:] if isinstance(d, str)} - {SEQUENCE}
    limits = {axis: {"max": int(size)} for axis, size in (axes or {}).items()}
    unknown = sorted(set(limits) - named)
    if unknown:
        raise ConfigError(f"--axis {', '.join(unknown)}: not a dynamic axis of the inputs (they have: "
                          f"{', '.join(sorted(named)) or 'none'})")
    if limits:
        entry["axes"] = limits
    return entry


def missing_sizes(entry: Mapping[str, Any], traffic_axes: Sequence[str]) -> list[str]:
    """Named axes (other than sequence) that neither ``axes`` bounds nor the traffic sample gives."""
    named = {d for t in entry["inputs"] for d in t["shape"] if isinstance(d, str)} - {SEQUENCE, BATCH}
    return sorted(a for a in named if a not in entry.get("axes", {}) and a not in traffic_axes)


def append_model(manifest: Path, entry: Mapping[str, Any], *, traffic: str | None = None) -> str:
    """Add ``entry`` to ``manifest`` (created when missing) keeping the file's own text and comments;
    return the YAML written. The result is read back through the manifest's schema."""
    block = yaml.safe_dump([dict(entry)], sort_keys=False, default_flow_style=None, width=110)
    block = "".join(f"  {line}" if line.strip() else line for line in block.splitlines(keepends=True))
    if manifest.exists():
        existing = yaml.safe_load(manifest.read_text()) or {}
        if any(m.get("name") == entry["name"] for m in existing.get("models", [])):
            raise ConfigError(f"{manifest} already has a model named {entry['name']!r}: choose another --name")
        if list(existing)[-1:] != ["models"]:
            raise ConfigError(f"{manifest}: 'models' is not its last key, so the entry cannot be appended without "
                              f"rewriting the file; add this to its models list by hand:\n{block}")
        text = manifest.read_text()
        if not existing.get("models"):  # `models: []` (or empty): the list starts here
            text = re.sub(r"^models:.*$", "models:", text, count=1, flags=re.M)
        manifest.write_text(text + ("" if text.endswith("\n") else "\n") + block)
    else:
        head = "# The models manifest (tritonbundle init wrote it; schema: docs/manifest.md).\nversion: 1\n"
        if traffic:
            head += f"traffic: {traffic}\n"
        manifest.parent.mkdir(parents=True, exist_ok=True)
        manifest.write_text(head + "models:\n" + block)
    return block
