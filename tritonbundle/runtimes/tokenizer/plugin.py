"""The tokenizer model of a text model: ``<name>_tokenizer``, a Python-backend model (``model.py`` next
to this file) that turns text (or query and text pairs) into the encoder's token ids, attention mask
and, when the encoder takes them, token type ids, padded to the plan's targets, and each text's token
count (``tokens``)."""

from __future__ import annotations

from pathlib import Path

from tritonbundle.contract import MAX_TEXT_BYTES, QUERY_INPUT, TEXT_INPUT, TOKENS_OUTPUT, TokenizerParameters
from tritonbundle.manifest import ModelSpec
from tritonbundle.modelconfig import DynamicBatching, InstanceGroup, ModelConfig, TensorSpec
from tritonbundle.plan import ModelPlan
from tritonbundle.runtimes import served
from tritonbundle.runtimes.base import copy_artifact, queue_policy

MODEL_PY = Path(__file__).with_name("model.py")
TOKENIZER_FILE = "tokenizer.json"
#: Each text's (or pair's) token count, a tokenizer output and every text model's output.
TOKENS_OUTPUT_SPEC = TensorSpec(TOKENS_OUTPUT, "INT32", (1,))


def parameters(spec: ModelSpec, plan: ModelPlan) -> TokenizerParameters:
    """How ``spec``'s texts are read and tokenized (also by an encoder that tokenizes itself)."""
    return TokenizerParameters(
        tokenizer_file=TOKENIZER_FILE, max_length=spec.tokenizer_max_length, max_text_bytes=MAX_TEXT_BYTES,
        padding_targets=plan.padding_targets, pad_id=0, threads=spec.tokenizer_threads,
        pairs=spec.task == "text-pair",
    )


def text_inputs(spec: ModelSpec) -> tuple[TensorSpec, ...]:
    """What the user sends a text model: one text per row, or a query and a text per row."""
    names = (QUERY_INPUT, TEXT_INPUT) if spec.task == "text-pair" else (TEXT_INPUT,)
    return tuple(TensorSpec(name, "STRING", (1,)) for name in names)


def config(spec: ModelSpec, plan: ModelPlan) -> ModelConfig:
    params = parameters(spec, plan)
    return ModelConfig(
        name=spec.tokenizer_name,
        backend="python",
        max_batch_size=spec.max_batch_size,
        inputs=text_inputs(spec),
        # In the encoder's input order: token ids, attention mask[, token type ids]; then each text's count.
        outputs=(*(TensorSpec(t.name, t.dtype, (-1,)) for t in spec.inputs), TOKENS_OUTPUT_SPEC),
        # One tokenizer call serves every request the batcher gathered (runtimes/text.py);
        # a short delay gathers more of them under load. The queue is bounded like the encoder's, so
        # overload is refused at the door.
        dynamic_batching=DynamicBatching(max_queue_delay_us=spec.tokenizer_queue_delay_us, queue_policy=queue_policy(spec, spec.tokenizer_instances)),
        instance_groups=(InstanceGroup(count=spec.tokenizer_instances, kind="KIND_CPU"),),
        parameters=params.to_parameters(),
    )


def write_files(tokenizer_json: Path, version_dir: Path) -> None:
    served.install(MODEL_PY, version_dir)
    write_tokenizer(tokenizer_json, version_dir)


def write_tokenizer(tokenizer_json: Path, version_dir: Path) -> None:
    copy_artifact(tokenizer_json, version_dir / TOKENIZER_FILE)
