"""The bounded queue of every batched model: large enough for full batches, never unbounded."""

from __future__ import annotations

import dataclasses

from tritonbundle import manifest
from tritonbundle.manifest import ModelSpec, TensorDecl
from tritonbundle.runtimes.base import queue_policy, queue_size
from tritonbundle.runtimes.tokenizer import plugin as tokenizer_plugin


def _spec(**tunables: object) -> ModelSpec:
    return ModelSpec(
        name="enc", task="text-embedding", recipe="minilm", onnx_path=None,
        inputs=(TensorDecl("input_ids", "INT64", ("batch", "sequence")),
                TensorDecl("attention_mask", "INT64", ("batch", "sequence"))),
        outputs=(TensorDecl("embedding", "FP32", ("batch", 4)),),
        max_sequence_length=128, tokenizer_file=None, tokenizer_max_length=128, traffic=None, calibration=None,
        **tunables,  # type: ignore[arg-type]
    )


def test_auto_holds_two_full_batches_per_instance() -> None:
    # Triton counts the batch being gathered as queued: a bound under max_batch_size would cap batches.
    spec = _spec(batch_buckets=(1, 8, 32, 128), instances=4, tokenizer_instances=3)
    assert queue_size(spec, spec.instances) == 2 * 128 * 4
    assert queue_size(spec, spec.tokenizer_instances) == 2 * 128 * 3
    policy = queue_policy(spec, spec.instances)
    assert policy.max_queue_size == 1024 and policy.default_timeout_us == spec.queue_timeout_us
    assert policy.allow_timeout_override


def test_a_set_size_is_kept_as_written() -> None:
    spec = _spec(batch_buckets=(1, 8, 32), instances=2, max_queue_size=7)
    assert queue_size(spec, 2) == 7


def test_the_tokenizer_queue_follows_its_own_instances() -> None:
    spec = _spec(batch_buckets=(1, 8, 32), instances=1, tokenizer_instances=4)
    config = tokenizer_plugin.config(spec, _plan_stub())
    assert config.dynamic_batching is not None and config.dynamic_batching.queue_policy is not None
    assert config.dynamic_batching.queue_policy.max_queue_size == 2 * 32 * 4


def _plan_stub() -> object:
    @dataclasses.dataclass
    class Plan:
        padding_targets: tuple[int, ...] = (16, 32)

    return Plan()


def test_the_default_is_auto() -> None:
    assert {f.name: f.default for f in dataclasses.fields(manifest.Tunables)}["max_queue_size"] == "auto"
