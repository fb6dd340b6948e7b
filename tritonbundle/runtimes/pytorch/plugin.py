"""PyTorch: a Python-backend model running the recipe's encoder, for GPUs without TensorRT.

The served model is ``model.py`` next to this file (with :mod:`.engine`, :mod:`.launch`,
:mod:`.stats` and :mod:`tritonbundle.recipes` copied beside it); the build writes the recipe's
weights next to it (``model.safetensors`` in the manifest's precision, ``config.json``) and
``weights.json`` (where they came from). The config takes everything the model needs from the plan:
padding targets, batch buckets (one CUDA graph per bucket and target), preferred batch sizes.

Inputs allow ragged batching: the tokenizer pads each request to its padding target, so requests of
different targets reach the model in one batch and the model groups rows by target itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tritonbundle import recipes
from tritonbundle.contract import (
    TEXT_INPUT,
    TOKENS_OUTPUT,
    PyTorchParameters,
    TextPyTorchParameters,
    TokenizerParameters,
)
from tritonbundle.errors import BuildError, ConfigError, ExportError
from tritonbundle.files import sha256
from tritonbundle.log import LOG
from tritonbundle.manifest import ModelSpec
from tritonbundle.modelconfig import InstanceGroup, ModelConfig, TensorSpec
from tritonbundle.runtimes import served
from tritonbundle.runtimes.base import (
    BuildContext,
    Written,
    dynamic_batching,
    encoder_config,
    link_or_copy,
    warmups,
)

MODEL_PY = Path(__file__).with_name("model.py")
RECORD = "weights.json"
#: Storage dtype of the weights per manifest precision (int8 is refused: no quantisation here).
STORAGE = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
#: Instances of ``<name>_encoder`` (token rows in) when ``<name>`` tokenizes itself (``tokenize_in_encoder``):
#: the text model, with the manifest's ``instances``, carries the traffic; the token-rows model stays for
#: clients that tokenize, with one instance. Each instance captures and times its own graphs at start-up
#: and holds its own weights: with six of each, BERT-base took 34-39 s to start on the H200 against
#: 17-22 s for six instances alone (docs/benchmarks.md, "texts in under MPS").
TOKEN_MODEL_INSTANCES = 1


class PyTorchRuntime:
    name = "pytorch"
    needs_onnx = False

    def parameters(self, spec: ModelSpec) -> type[PyTorchParameters]:
        return PyTorchParameters

    def check(self, spec: ModelSpec) -> None:
        where = f"model {spec.name}"
        if spec.precision not in STORAGE:
            raise ConfigError(f"{where}.precision: the pytorch runtime supports fp32, fp16 or bf16, not {spec.precision}")
        if spec.recipe is None:
            raise ConfigError(f"{where}.source: the pytorch runtime needs a source recipe ({', '.join(recipes.RECIPES)}), "
                              "not an ONNX file")
        if len(spec.inputs) != 2 or not all(t.sequence_axes and t.dtype == "INT64" for t in spec.inputs):
            raise ConfigError(
                f"{where}.inputs: the pytorch runtime runs BERT-style encoders: two INT64 [batch, sequence] inputs "
                "(token ids, attention mask)"
            )
        if len(spec.outputs) != 1 or spec.outputs[0].dtype != "FP32" or len(spec.outputs[0].dims) != 1:
            raise ConfigError(f"{where}.outputs: the pytorch runtime writes one FP32 [batch, hidden] output (the embedding)")
        if not spec.batched:
            raise ConfigError(f"{where}: the pytorch runtime needs a batch dimension ('batch' first in every shape)")

    def padding_policy(self, target: str) -> str:
        return "targets"

    def _parameters(self, ctx: BuildContext) -> PyTorchParameters:
        spec, plan = ctx.spec, ctx.plan
        gpu = spec.target == "gpu"
        return PyTorchParameters(
            padding_policy=plan.policy, padding_targets=plan.padding_targets,
            max_sequence_length=spec.max_sequence_length, weights_file=recipes.WEIGHTS_FILE,
            config_file=recipes.CONFIG_FILE, recipe=str(spec.recipe),
            random_weights=recipes.recipe(str(spec.recipe)).random_weights, precision=spec.precision,
            cuda_graphs=bool(spec.cuda_graphs and gpu), batch_buckets=tuple(b.max for b in plan.batch_buckets),
            packing=spec.packing, batches_in_flight=spec.batches_in_flight,
        )

    def config(self, ctx: BuildContext, written: Written) -> ModelConfig:
        gpu = ctx.spec.target == "gpu"
        params = self._parameters(ctx)
        # The model captures and warms every (batch bucket, target) graph in initialize(); one
        # small sample here runs the whole execute path once before the model is READY.
        return encoder_config(ctx, params, ragged=True, kind="KIND_GPU" if gpu else "KIND_CPU", backend="python",
                              instances=TOKEN_MODEL_INSTANCES if ctx.spec.tokenize_in_encoder else None,
                              warmups=warmups(ctx, every_bucket=False))

    def write_files(self, ctx: BuildContext, version_dir: Path) -> Written:
        served.install(MODEL_PY, version_dir)
        write_weights(ctx, version_dir)
        return Written()

    def text_model(
        self, ctx: BuildContext, encoder_version_dir: Path, version_dir: Path, tokenizer: TokenizerParameters,
    ) -> tuple[ModelConfig, type[TextPyTorchParameters]]:
        """``<name>`` as one Python model that tokenizes and encodes (``tokenize_in_encoder``): the same
        ``model.py``, the encoder's weights (linked: both were written by this build), a TEXT input.
        No warm-up samples: Triton's zero data would be empty texts, which the model refuses; the
        engine warms itself up (and captures its graphs) in ``initialize``."""
        spec = ctx.spec
        served.install(MODEL_PY, version_dir)
        for name in (recipes.WEIGHTS_FILE, recipes.CONFIG_FILE, RECORD):
            link_or_copy(encoder_version_dir / name, version_dir / name)
        params = TextPyTorchParameters(
            **{**vars(self._parameters(ctx)), "tokenizer_file": tokenizer.tokenizer_file,
               "max_length": tokenizer.max_length, "max_text_bytes": tokenizer.max_text_bytes, "pad_id": tokenizer.pad_id,
               "threads": tokenizer.threads, "task": spec.task},
        )
        config = ModelConfig(
            name=spec.name, backend="python", max_batch_size=spec.max_batch_size,
            inputs=(TensorSpec(TEXT_INPUT, "STRING", (1,)),),
            outputs=(*(TensorSpec(t.name, t.dtype, t.dims) for t in spec.outputs), TensorSpec(TOKENS_OUTPUT, "INT32", (1,))),
            dynamic_batching=dynamic_batching(ctx),
            instance_groups=(InstanceGroup(count=spec.instances, kind="KIND_GPU" if spec.target == "gpu" else "KIND_CPU"),),
            parameters=params.to_parameters(),
        )
        return config, TextPyTorchParameters


def fingerprint(recipe: str, precision: str) -> dict[str, str]:
    """What the weights depend on: reused from the previous build only when all of it matches."""
    import importlib.metadata as md

    record = {"recipe": recipe, "precision": precision, "dtype": STORAGE[precision]}
    source = recipes.weights_source(recipe)
    if source is not None:
        st = source.stat()
        record["source"] = f"{source.resolve()}:{st.st_size}:{int(st.st_mtime)}"
    else:
        for dist in ("torch", "transformers"):
            try:
                record[dist] = md.version(dist)
            except md.PackageNotFoundError:
                record[dist] = "-"
    return record


def _reuse(ctx: BuildContext, record: dict[str, str], version_dir: Path) -> bool:
    previous = ctx.previous_dir
    names = (recipes.WEIGHTS_FILE, recipes.CONFIG_FILE, RECORD)
    if previous is None or ctx.force or not all((previous / n).exists() for n in names):
        return False
    if json.loads((previous / RECORD).read_text()).get("fingerprint") != record:
        return False
    for name in names:
        link_or_copy(previous / name, version_dir / name)
    return True


def write_weights(ctx: BuildContext, version_dir: Path) -> None:
    """config.json + model.safetensors (in the precision's dtype) + weights.json into ``version_dir``."""
    spec = ctx.spec
    assert spec.recipe is not None
    try:
        record = fingerprint(spec.recipe, spec.precision)
    except ExportError as e:
        raise BuildError(f"model {spec.name}: {e}") from e
    if _reuse(ctx, record, version_dir):
        LOG.info("    %s: weights are up to date (weights.json matches); reused", spec.name)
        return
    import torch
    from safetensors.torch import save_file

    config, state = recipes.load_weights(spec.recipe)
    hidden = int(config.get("hidden_size", 0))
    declared = spec.outputs[0].dims[0]
    if declared != hidden:
        raise BuildError(
            f"model {spec.name}.outputs[0]: declares [batch, {declared}], but the recipe {spec.recipe!r} "
            f"has hidden size {hidden}"
        )
    dtype = getattr(torch, STORAGE[spec.precision])
    tensors: dict[str, Any] = {k: v.detach().to(dtype=dtype).contiguous() for k, v in state.items() if v.is_floating_point()}
    tensors.update({k: v.detach().contiguous() for k, v in state.items() if not v.is_floating_point()})
    weights = version_dir / recipes.WEIGHTS_FILE
    tmp = version_dir / (recipes.WEIGHTS_FILE + ".tmp")
    save_file(tensors, str(tmp), metadata={"recipe": spec.recipe, "dtype": STORAGE[spec.precision]})
    tmp.chmod(0o644)  # safetensors writes 0600; the server may run as another user (containers)
    tmp.replace(weights)
    (version_dir / recipes.CONFIG_FILE).write_text(json.dumps(config, indent=2))
    (version_dir / RECORD).write_text(json.dumps({
        "fingerprint": record, "sha256": sha256(weights), "random_weights": recipes.recipe(spec.recipe).random_weights,
        "description": recipes.recipe(spec.recipe).description,
    }, indent=2))
    LOG.info("    %s: wrote %s (%s, %.0f MB)", spec.name, recipes.WEIGHTS_FILE, STORAGE[spec.precision],
             weights.stat().st_size / 1e6)
