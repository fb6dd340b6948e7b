"""Write docs/manifest.md, the manifest's reference, from its JSON Schema (tritonbundle/manifest.py).

    python scripts/manifest_reference.py            # rewrite docs/manifest.md
    python scripts/manifest_reference.py --check    # exit 1 if it is out of date

Types, allowed values and defaults come from the schema and the tunables' dataclass; the prose for each
key is here (:data:`PROSE`), and tests/test_manifest.py fails when a schema key has none, so a new key
cannot go undocumented.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "manifest.md"

#: Key path (dots; ``models.<key>`` for a model's keys) -> what it means, for a newcomer.
PROSE = {
    "version": "The manifest format's version: always 1.",
    "traffic": "The traffic sample (JSON Lines, relative to the manifest) every model's dynamic axes are planned "
               "from and the load tests draw their requests from; a model's own `traffic` replaces it. "
               "Format: build/traffic/README.md.",
    "defaults": "Tunables (any key of the last table) applied to every model that does not set its own.",
    "models": "The models to build: a list of entries with the keys below.",
    "models.name": "The name clients call: a letter, then letters, digits, `_`, `-` (`tritonbundle init` takes it "
                   "from the file name unless `--name`). A text model is the ensemble `<name>`, its "
                   "network `<name>_encoder`; a tensor model is `<name>` itself.",
    "models.task": "What the model takes and returns: `tensor` (the graph's own inputs and outputs; the default), "
                   "`text-embedding` (TEXT in, the encoder's outputs out), `text-classification` (TEXT in; logits, "
                   "`label` and `score` out), `text-pair` (QUERY and TEXT in; a relevance `score` per pair).",
    "models.source": "Where the network comes from: exactly one of `onnx` and `recipe`.",
    "models.source.onnx": "Your ONNX file, relative to the manifest (by convention under build/models/, which the "
                          "images carry). `tritonbundle init FILE.onnx` writes the entry for you.",
    "models.source.recipe": "A model this project knows how to export from PyTorch (`minilm`, `bert-base`).",
    "models.tokenizer": "The tokenizer of a text task.",
    "models.tokenizer.file": "Its tokenizer.json (Hugging Face `tokenizers` format), relative to the manifest. "
                             "Required for a text model from ONNX.",
    "models.tokenizer.max_length": "Longer texts are truncated to this many tokens (default: max_sequence_length).",
    "models.inputs": "The network's inputs, in the graph's order (a text task: token ids, attention mask and "
                     "optionally token type ids, each `[batch, sequence]`).",
    "models.outputs": "The network's outputs (a classifier or pair scorer: one, its logits `[batch, n]`).",
    "models.inputs[].name": "The tensor's name in the ONNX graph.",
    "models.inputs[].dtype": "Its data type: BOOL, UINT8..UINT64, INT8..INT64, FP16, FP32, FP64, BF16, STRING (or BYTES).",
    "models.inputs[].shape": "Its dimensions, batch included: an integer is static; `batch` (first only) is the dynamic "
                             "batch; `sequence` is the token axis of text (sized by the traffic's `tokens`); any other "
                             "name (`height`, `width`, `frames`) is a dynamic axis sized by the traffic's `shape` or "
                             "`axes`.",
    "models.max_sequence_length": "The longest `sequence` the model serves (default 512 when it has one); longer "
                                  "token input is refused, longer texts truncated.",
    "models.axes": "Dynamic axes other than batch and sequence: per axis `max` (its largest size; default: the "
                   "traffic sample's largest) and `buckets` (profiles planned on it; default 2). An axis the traffic "
                   "sample does not size needs `max`.",
    "models.labels": "A text-classification model's label per logit, in order (default: the `id2label` of a "
                     "config.json next to the tokenizer, else the index).",
    "models.traffic": "This model's traffic sample (replaces the manifest's).",
    "models.calibration": "INT8 calibration data: a .npz with one array per input, first axis the samples (a text "
                          "model calibrates on its traffic when there is none). Keep it under build/calibration/.",
    "models.tolerance": "The accuracy gate's largest absolute difference from FP32 (replaces the precision's).",
}


#: Tunables whose schema has no description.
TUNABLE_PROSE = {
    "batch_buckets": "Batch sizes of the optimization profiles (TensorRT), or of the CUDA graphs every launch is "
                     "padded up to (pytorch runtime): there buckets between the powers of two (1, 2, 3, 4, 6, 8, "
                     "10, ... 56, 64) pad fewer rows and passed 6.6 % more on the H200 (docs/benchmarks.md).",
    "precision": "The network's precision, decided in the ONNX graph (FP16/BF16 rewritten, INT8 quantized with "
                 "Q/DQ) and checked against FP32 on the CPU before any engine is built (docs/tensorrt.md).",
    "sequence_buckets": "How many buckets the `sequence` axis is split into (padding targets; TensorRT profiles "
                        "per batch bucket), chosen from the traffic to pad the fewest tokens.",
    "opt_percentile": "A TensorRT profile's `opt` on an axis that is not padded: this percentile of the sizes in "
                      "its bucket.",
    "max_queue_delay_us": "How long Triton's dynamic batcher holds a request to gather a larger batch.",
    "queue_timeout_us": "A request that waited this long in the queue is refused (HTTP 503, gRPC UNAVAILABLE).",
    "instances": "Instances of the network per server (processes or execution contexts).",
    "workspace_mib": "TensorRT: the builder's workspace memory pool.",
    "builder_optimization_level": "TensorRT: how hard the builder searches for kernels (0-5).",
    "hardware_compatibility": "TensorRT: build plans that also run on other GPU architectures.",
    "version_compatible": "TensorRT: build plans that also run on later TensorRT versions (with its lean runtime).",
    "cuda_graphs": "pytorch runtime: capture a CUDA graph per batch bucket and padding target.",
}


def _schema() -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from tritonbundle import manifest

    return manifest.SCHEMA


def tunables() -> list[tuple[str, Any, dict[str, Any]]]:
    from tritonbundle import manifest

    return [(f.name, f.default, f.metadata["schema"]) for f in dataclasses.fields(manifest.Tunables)]


def keys() -> list[str]:
    """Every documented key path of the schema, tunables excluded."""
    schema = _schema()
    model = schema["properties"]["models"]["items"]["properties"]
    tunable = {name for name, _, _ in tunables()}
    out = list(schema["properties"])
    for name, sub in model.items():
        if name in tunable:
            continue
        out.append(f"models.{name}")
        if name in ("source", "tokenizer"):
            out += [f"models.{name}.{k}" for k in sub["properties"]]
    out += [f"models.inputs[].{k}" for k in schema["properties"]["models"]["items"]["properties"]["inputs"]["items"]["properties"]]
    return out


def _allowed(schema: dict[str, Any]) -> str:
    if "enum" in schema:
        return ", ".join(f"`{v}`" for v in schema["enum"])
    if "anyOf" in schema:
        return " or ".join(_allowed(s) for s in schema["anyOf"])
    if "const" in schema:
        return f"`{schema['const']}`"
    kind = schema.get("type", "")
    bounds = [f">= {schema['minimum']}" for _ in [0] if "minimum" in schema]
    bounds += [f"<= {schema['maximum']}" for _ in [0] if "maximum" in schema]
    bounds += [f"> {schema['exclusiveMinimum']}" for _ in [0] if "exclusiveMinimum" in schema]
    if kind == "array":
        return "list of " + (_allowed(schema.get("items", {})) or "values")
    return " ".join([kind, *bounds]).strip()


def _default(value: Any) -> str:
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple):
        return f"`[{', '.join(map(str, value))}]`"
    return f"`{value}`"


def render() -> str:
    missing = [k for k in keys() if k not in PROSE]
    if missing:
        raise SystemExit(f"scripts/manifest_reference.py: no prose for {', '.join(missing)}")
    lines = [
        "# The models manifest: every key",
        "",
        "`build/models.yaml` says what to build. Generated from the schema in `tritonbundle/manifest.py` by",
        "`python scripts/manifest_reference.py` (a test keeps it up to date); the README's \"Your own model\"",
        "walks through a first one. A manifest is checked against the schema before anything is built: an",
        "unknown key, a wrong type or a value outside its range is named by its path (`models[0].precision`).",
        "",
        "```yaml",
        "version: 1",
        "traffic: traffic/chat.jsonl",
        "defaults: {target: cpu, runtime: onnxruntime}",
        "models:",
        "  - name: mlp",
        "    source: {onnx: models/mlp.onnx}",
        "    inputs:  [{name: features, dtype: FP32, shape: [batch, 16]}]",
        "    outputs: [{name: logits, dtype: FP32, shape: [batch, 4]}]",
        "```",
        "",
        "## Top level and each model",
        "",
        "| key | what it is |",
        "|---|---|",
    ]
    for key in keys():
        lines.append(f"| `{key}` | {PROSE[key]} |")
    lines += [
        "",
        "## Tunables",
        "",
        "A model sets these for itself, or `defaults` sets them for every model; `tritonbundle build --target`,",
        "`--runtime` and `--precision` override them on the command line, and `tritonbundle tune` searches several.",
        "",
        "| key | default | allowed | what it does |",
        "|---|---|---|---|",
    ]
    for name, default, schema in tunables():
        prose = schema.get("description") or TUNABLE_PROSE.get(name)
        if not prose:
            raise SystemExit(f"scripts/manifest_reference.py: no prose for the tunable {name}")
        lines.append(f"| `{name}` | {_default(default)} | {_allowed(schema)} | {prose} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if argv[:1] == ["--check"]:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is out of date: run python scripts/manifest_reference.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
