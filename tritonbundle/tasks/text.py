"""The text tasks: text in, through a tokenizer + encoder ensemble.

=====================  ===========================  =========================================================
task                   the user sends               the user gets
=====================  ===========================  =========================================================
text-embedding         ``TEXT`` [batch, 1]          the encoder's outputs (``embedding``)
text-classification    ``TEXT`` [batch, 1]          the logits, ``label`` (BYTES) and ``score`` (its probability)
text-pair              ``QUERY``, ``TEXT``          ``score`` per pair (sigmoid of one logit, or the probability
                       [batch, 1] each              of class 1 of two) and the logits
=====================  ===========================  =========================================================

Every text task also returns ``tokens`` (INT32 [batch, 1]): the tokens each text (or pair) became, counted
by the tokenizer that fed the encoder (what usage is metered in).

Each becomes Triton models around the encoder ``<name>_encoder``::

    <name>_tokenizer     Python backend: text (or pairs) -> token ids, attention mask[, token type ids]
    <name>_postprocess   Python backend (classification, pairs): logits -> label/score
    <name>               ensemble: text in, the task's outputs out; its config says its task

A text-embedding model with ``tokenize_in_encoder`` (the pytorch runtime) is instead one model that
tokenizes and encodes (:meth:`Runtime.text_model`).
"""

from __future__ import annotations

import json
from pathlib import Path

from tritonbundle.contract import (
    LABEL_OUTPUT,
    SCORE_OUTPUT,
    TASK_METHODS,
    TOKENS_OUTPUT,
    PostprocessParameters,
    TaskParameters,
    TokenizerParameters,
    postprocess_name,
)
from tritonbundle.errors import BuildError, ConfigError
from tritonbundle.manifest import ModelSpec
from tritonbundle.modelconfig import (
    DynamicBatching,
    EnsembleStep,
    InstanceGroup,
    ModelConfig,
    TensorSpec,
    write_config,
)
from tritonbundle.runtimes import served
from tritonbundle.runtimes.base import BuildContext, Runtime, queue_policy
from tritonbundle.runtimes.tokenizer import plugin as tokenizer
from tritonbundle.tasks.base import Written

POSTPROCESS_PY = Path(__file__).with_name("postprocess") / "model.py"
#: The post-processing model's input: the encoder's logits (its outputs include them under their own name).
POSTPROCESS_INPUT = "encoder_logits"


class TextTask:
    def __init__(self, name: str) -> None:
        self.name = name
        self.method = TASK_METHODS[name]

    def check(self, spec: ModelSpec) -> None:
        if TOKENS_OUTPUT in {t.name for t in (*spec.inputs, *spec.outputs)}:
            raise ConfigError(f"model {spec.name}: an input or output named {TOKENS_OUTPUT!r} would clash with the token "
                              "counts every text model returns; rename it in the manifest")
        if spec.tokenize_in_encoder and self.name != "text-embedding":
            raise ConfigError(f"model {spec.name}.tokenize_in_encoder: only a text-embedding model can tokenize in "
                              f"its encoder (this one is {self.name}): leave it false")

    def write(self, ctx: BuildContext, runtime: Runtime, staging: Path, tokenizer_json: Path | None) -> Written:
        spec, plan, version = ctx.spec, ctx.plan, str(ctx.version)
        if tokenizer_json is None:
            raise BuildError(f"model {spec.name}: a {self.name} model needs a tokenizer.json (run export first)")
        if spec.tokenize_in_encoder:
            text_dir = staging / spec.name
            tokenizer.write_tokenizer(tokenizer_json, text_dir / version)
            config, record = runtime.text_model(
                ctx, staging / spec.encoder_name / version, text_dir / version, tokenizer.parameters(spec, plan)
            )
            write_config(config, text_dir)
            return {spec.name: record}
        written: Written = {}
        tok_dir = staging / spec.tokenizer_name
        tokenizer.write_files(tokenizer_json, tok_dir / version)
        write_config(tokenizer.config(spec, plan), tok_dir)
        written[spec.tokenizer_name] = TokenizerParameters
        if self.name != "text-embedding":
            post_dir = staging / postprocess_name(spec.name)
            served.install(POSTPROCESS_PY, post_dir / version)
            write_config(self.postprocess_config(spec, labels(spec, tokenizer_json)), post_dir)
            written[postprocess_name(spec.name)] = PostprocessParameters
        ens_dir = staging / spec.name
        (ens_dir / version).mkdir(parents=True, exist_ok=True)
        (ens_dir / version / ".gitkeep").touch()
        write_config(self.ensemble_config(spec), ens_dir)
        written[spec.name] = TaskParameters
        return written

    def outputs(self, spec: ModelSpec) -> tuple[TensorSpec, ...]:
        """What the ensemble returns."""
        encoder = tuple(TensorSpec(t.name, t.dtype, t.dims) for t in spec.outputs)
        if self.name == "text-classification":
            encoder = (*encoder, TensorSpec(LABEL_OUTPUT, "STRING", (1,)), TensorSpec(SCORE_OUTPUT, "FP32", (1,)))
        elif self.name == "text-pair":
            encoder = (*encoder, TensorSpec(SCORE_OUTPUT, "FP32", (1,)))
        return (*encoder, tokenizer.TOKENS_OUTPUT_SPEC)

    def ensemble_config(self, spec: ModelSpec) -> ModelConfig:
        token_map = {t.name: f"_{t.name}" for t in spec.inputs}
        texts = tokenizer.text_inputs(spec)
        encoded = {t.name: t.name for t in spec.outputs}
        post = None
        if self.name != "text-embedding":
            # The post-processing step returns the logits it read too: Triton 2.51's ensemble scheduler
            # fails a request that names `score` but not `logits` when `logits` is both an ensemble output
            # and a later step's input ("unexpected deadlock, at least one output is not set").
            logits = spec.outputs[0].name
            encoded = {logits: f"_{logits}"}
            added = (LABEL_OUTPUT, SCORE_OUTPUT) if self.name == "text-classification" else (SCORE_OUTPUT,)
            post = EnsembleStep(postprocess_name(spec.name), input_map={POSTPROCESS_INPUT: f"_{logits}"},
                                output_map={name: name for name in (logits, *added)})
        steps = [
            EnsembleStep(spec.tokenizer_name, input_map={t.name: t.name for t in texts},
                         output_map={**token_map, TOKENS_OUTPUT: TOKENS_OUTPUT}),
            EnsembleStep(spec.encoder_name, input_map=token_map, output_map=encoded),
            *([post] if post else []),
        ]
        return ModelConfig(
            name=spec.name, platform="ensemble", max_batch_size=spec.max_batch_size, inputs=texts,
            outputs=self.outputs(spec), ensemble_steps=tuple(steps),
            parameters=TaskParameters(task=self.name).to_parameters(),
        )

    def postprocess_config(self, spec: ModelSpec, labels: dict[str, str]) -> ModelConfig:
        logits = spec.outputs[0]
        params = PostprocessParameters(task=self.name, logits=logits.name, labels=labels)
        outputs = [TensorSpec(logits.name, logits.dtype, logits.dims), TensorSpec(SCORE_OUTPUT, "FP32", (1,))]
        if self.name == "text-classification":
            outputs.insert(1, TensorSpec(LABEL_OUTPUT, "STRING", (1,)))
        return ModelConfig(
            name=postprocess_name(spec.name), backend="python", max_batch_size=spec.max_batch_size,
            inputs=(TensorSpec(POSTPROCESS_INPUT, logits.dtype, logits.dims),), outputs=tuple(outputs),
            # Every request the batcher gathered in one numpy call; bounded like the tokenizer's queue.
            dynamic_batching=DynamicBatching(queue_policy=queue_policy(spec, spec.tokenizer_instances)),
            instance_groups=(InstanceGroup(count=spec.tokenizer_instances, kind="KIND_CPU"),),
            parameters=params.to_parameters(),
        )


def labels(spec: ModelSpec, tokenizer_json: Path) -> dict[str, str]:
    """Class index -> label: the manifest's ``labels``, else the ``id2label`` of a Hugging Face
    ``config.json`` next to the tokenizer (where ``save_pretrained`` puts both), else none (the index)."""
    if spec.labels:
        return {str(i): label for i, label in enumerate(spec.labels)}
    if spec.task != "text-classification":
        return {}
    source = spec.tokenizer_file or tokenizer_json
    config = source.with_name("config.json")
    if not config.is_file():
        return {}
    try:
        id2label = json.loads(config.read_text()).get("id2label") or {}
    except (OSError, ValueError) as e:
        raise BuildError(f"model {spec.name}: {config} (labels for the classifier) is not readable JSON: {e}") from e
    n = spec.outputs[0].shape[1]
    if isinstance(n, int) and len(id2label) != n:
        raise BuildError(f"model {spec.name}: {config} names {len(id2label)} labels for {n} logits; set `labels` in "
                         "the manifest")
    return {str(int(k)): str(v) for k, v in id2label.items()}
