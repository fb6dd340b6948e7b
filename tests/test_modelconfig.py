from __future__ import annotations

import pytest
from tritonclient.grpc import model_config_pb2 as pb

from tritonbundle.errors import ConfigError
from tritonbundle.modelconfig import (
    DynamicBatching,
    EnsembleStep,
    InstanceGroup,
    ModelConfig,
    QueuePolicy,
    TensorSpec,
    parse_pbtxt,
)


def _config(**kw: object) -> ModelConfig:
    fields: dict[str, object] = dict(
        name="enc", backend="python", max_batch_size=8,
        inputs=(TensorSpec("input_ids", "INT64", (-1,), allow_ragged_batch=True),),
        outputs=(TensorSpec("embedding", "FP32", (384,)),),
    )
    fields.update(kw)
    return ModelConfig(**fields)  # type: ignore[arg-type]


def test_config_round_trips_through_triton_protobuf() -> None:
    cfg = _config(
        dynamic_batching=DynamicBatching((4, 8), 500, queue_policy=QueuePolicy(16, 1000)),
        instance_groups=(InstanceGroup(2, "KIND_CPU"),),
        parameters={"k": "v"},
    )
    parsed = parse_pbtxt(cfg.to_pbtxt())
    assert parsed.name == "enc"
    assert parsed.max_batch_size == 8
    assert parsed.input[0].data_type == pb.TYPE_INT64
    assert list(parsed.input[0].dims) == [-1]
    assert parsed.input[0].allow_ragged_batch
    assert list(parsed.dynamic_batching.preferred_batch_size) == [4, 8]
    assert parsed.dynamic_batching.default_queue_policy.max_queue_size == 16
    assert parsed.dynamic_batching.default_queue_policy.timeout_action == pb.ModelQueuePolicy.REJECT
    assert parsed.instance_group[0].count == 2
    assert parsed.parameters["k"].string_value == "v"


def test_protocol_bytes_is_accepted_as_string() -> None:
    assert TensorSpec("TEXT", "BYTES", (1,)).dtype == "STRING"


def test_writes_max_batch_size_0_when_batching_is_off() -> None:
    parsed = parse_pbtxt(_config(max_batch_size=0).to_pbtxt())
    assert parsed.max_batch_size == 0
    assert not parsed.HasField("dynamic_batching")


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"max_batch_size": 0, "dynamic_batching": DynamicBatching()}, "needs max_batch_size > 0"),
        ({"platform": "onnxruntime_onnx"}, "exactly one of platform or backend"),
        ({"dynamic_batching": DynamicBatching((16,))}, "exceed max_batch_size"),
        ({"outputs": (TensorSpec("input_ids", "FP32", (1,)),)}, "used twice"),
        ({"name": "a/b"}, "contains '/'"),
    ],
)
def test_invalid_configs_name_the_problem(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _config(**kw)


def test_unknown_dtype_lists_the_allowed_ones() -> None:
    with pytest.raises(ConfigError, match="unknown data type 'FLOAT'.*FP32"):
        TensorSpec("x", "FLOAT", (1,))


def test_zero_dims_are_refused() -> None:
    with pytest.raises(ConfigError, match="dims must be positive or -1"):
        TensorSpec("x", "FP32", (0,))


def test_ensemble_needs_steps_and_writes_them() -> None:
    with pytest.raises(ConfigError, match="at least one step"):
        _config(backend="", platform="ensemble")
    cfg = _config(
        backend="", platform="ensemble",
        ensemble_steps=(EnsembleStep("tok", {"TEXT": "TEXT"}, {"input_ids": "_ids"}),),
    )
    parsed = parse_pbtxt(cfg.to_pbtxt())
    assert parsed.ensemble_scheduling.step[0].model_name == "tok"
    assert parsed.ensemble_scheduling.step[0].output_map["input_ids"] == "_ids"


def test_parse_error_names_the_file() -> None:
    with pytest.raises(ConfigError, match="my/config.pbtxt: not a valid Triton ModelConfig"):
        parse_pbtxt("name: 'x'\nno_such_field: 1\n", source="my/config.pbtxt")
