"""Unit tests of the client's pure parts: retry policy, error mapping, splitting, padding."""

from __future__ import annotations

import random

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from tritonbundle.clients import core, modelinfo
from tritonbundle.errors import (
    ClientError,
    DeadlineExceededError,
    InvalidInputError,
    ModelNotFoundError,
    ServerUnavailableError,
)


def test_backoff_is_bounded_jittered_and_capped() -> None:
    policy = core.RetryPolicy(max_attempts=6, initial_backoff_s=0.1, max_backoff_s=0.5)
    runs = [list(policy.delays(random.Random(seed))) for seed in range(200)]
    assert all(len(r) == 5 for r in runs)
    for k in range(5):
        values = [r[k] for r in runs]
        cap = min(0.5, 0.1 * 2**k)
        assert all(0 <= v <= cap for v in values)
        assert len(set(values)) > 150, "full jitter: retries of many clients must not line up"


@pytest.mark.parametrize(
    ("status", "message", "kind"),
    [
        ("400", "input 'TEXT' data-type is 'FP32'", InvalidInputError),
        ("StatusCode.INVALID_ARGUMENT", "TEXT[0] is empty", InvalidInputError),
        ("404", "Request for unknown model: 'x' is not found", ModelNotFoundError),
        ("StatusCode.NOT_FOUND", "Request for unknown model", ModelNotFoundError),
        ("400", "Request for unknown model: 'x' is not found", ModelNotFoundError),
        ("503", "Exceeds maximum queue size", ServerUnavailableError),
        ("StatusCode.UNAVAILABLE", "failed to connect to all addresses", ServerUnavailableError),
        ("StatusCode.DEADLINE_EXCEEDED", "Deadline Exceeded", DeadlineExceededError),
        ("500", "model crashed", ClientError),
        ("StatusCode.RESOURCE_EXHAUSTED", "too many requests in flight", ServerUnavailableError),
        # Triton's own RESOURCE_EXHAUSTED for oversized metadata: no retry ever succeeds.
        ("StatusCode.RESOURCE_EXHAUSTED", "received metadata size exceeds limit", InvalidInputError),
    ],
)
def test_server_errors_map_to_project_types(status: str, message: str, kind: type) -> None:
    err = core.classify(InferenceServerException(message, status=status), model="minilm", protocol="grpc")
    assert type(err) is kind
    assert "model 'minilm' over grpc" in str(err) and message in str(err)


def test_transport_errors_map_to_unavailable_and_deadline() -> None:
    assert isinstance(core.classify(ConnectionRefusedError(111, "refused"), model="m", protocol="http"), ServerUnavailableError)
    assert isinstance(core.classify(TimeoutError(), model="m", protocol="http"), DeadlineExceededError)


def test_only_unavailable_is_retryable() -> None:
    assert core.retryable(ServerUnavailableError("x"))
    for err in (InvalidInputError("x"), ModelNotFoundError("x"), DeadlineExceededError("x"), ClientError("x")):
        assert not core.retryable(err)


def test_final_error_reports_attempts() -> None:
    err = core.with_attempts(ServerUnavailableError("model 'm' over http: refused"), 4)
    assert err.attempts == 4 and str(err).endswith("(after 4 attempts)")


def test_chunks_cover_every_row_in_order() -> None:
    slices = core.chunks(70, 32)
    assert [(s.start, s.stop) for s in slices] == [(0, 32), (32, 64), (64, 70)]
    assert core.chunks(5, 0) == [slice(0, 5)]
    assert core.chunks(0, 8) == []


def test_tokens_pad_to_the_smallest_target_that_holds_the_longest_row() -> None:
    ids, mask = core.pad_tokens([[101, 7, 102], [101, 5, 6, 8, 9, 102]], None, targets=(4, 8, 16))
    assert ids.shape == mask.shape == (2, 8)
    assert mask.sum(axis=1).tolist() == [3, 6]
    assert ids[0, 3:].tolist() == [0] * 5


def test_tokens_pad_to_longest_row_under_the_ragged_policy() -> None:
    ids, mask = core.pad_tokens(np.ones((3, 5), dtype=np.int64), np.ones((3, 5), dtype=np.int64), targets=())
    assert ids.shape == (3, 5)


def test_trailing_padding_is_dropped_before_choosing_the_target() -> None:
    ids, mask = core.pad_tokens([[1, 2, 0, 0, 0, 0, 0, 0, 0]], [[1, 1, 0, 0, 0, 0, 0, 0, 0]], targets=(4, 16))
    assert ids.shape == (1, 4)


def test_too_long_and_mismatched_rows_are_refused_before_sending() -> None:
    with pytest.raises(InvalidInputError, match="a row has 600 tokens; the model takes at most 512"):
        core.pad_tokens([[1] * 600], None, targets=(), max_length=512)
    with pytest.raises(InvalidInputError, match="same shape"):
        core.pad_tokens([[1, 2]], [[1]], targets=())


def test_text_array_refuses_a_bare_string() -> None:
    with pytest.raises(TypeError, match="not a single string"):
        core.text_array("hello")  # type: ignore[arg-type]
    arr = core.text_array(["é", b"\xff"])
    assert arr.shape == (2, 1) and arr[0, 0] == "é".encode()


@pytest.mark.parametrize(
    ("status", "message"),
    [
        ("500", "Stub process 'minilm_encoder_0_0' is not healthy."),
        ("StatusCode.INTERNAL", "Stub process 'minilm_encoder_0_0' is not healthy."),
        ("500", "in ensemble 'minilm', Stub process 'minilm_encoder_0_0' is not healthy."),  # as measured
    ],
)
def test_a_python_stub_being_restarted_is_retryable(status: str, message: str) -> None:
    """Triton 2.51 answers "Stub process '<instance>' is not healthy." (HTTP 500 / INTERNAL) while a model's
    Python stub is dead, until `serve --restart` restarts the server: retried like a refused connection."""
    err = core.classify(InferenceServerException(message, status=status), model="minilm", protocol="http")
    assert type(err) is ServerUnavailableError and core.retryable(err)
    assert message in str(err) and "stub is dead and restarting" in str(err)
    other = core.classify(InferenceServerException("Stub process 'x' failed to load", status="500"), model="m",
                          protocol="http")
    assert type(other) is ClientError and not core.retryable(other)


def test_model_info_reads_the_task_parameter_and_guesses_without_it() -> None:
    def info(params: dict[str, object], inputs: list[tuple[str, str]]) -> modelinfo.ModelInfo:
        metadata = {"name": "m", "versions": ["1"], "inputs": [{"name": n, "datatype": d, "shape": [-1, 1]}
                                                               for n, d in inputs], "outputs": []}
        return modelinfo.model_info(metadata, {"config": {"max_batch_size": 4, "parameters": params}})

    classifier = info({"task": {"string_value": "text-classification"}}, [("TEXT", "BYTES")])
    assert classifier.task == classifier.kind() == "text-classification"
    assert info({}, [("TEXT", "BYTES")]).task is None
    assert info({}, [("TEXT", "BYTES")]).kind() == "text-embedding"
    assert info({}, [("QUERY", "BYTES"), ("TEXT", "BYTES")]).kind() == "text-pair"
    assert info({}, [("TEXT", "FP32")]).kind() == "tensor"
    assert info({"task": {"string_value": ""}}, [("x", "FP32")]).task is None


def test_response_output_names_come_from_the_response_itself() -> None:
    from tests.clients.fake_triton import grpc_result, http_result

    outputs = {"logits": np.zeros((2, 3), np.float32), "label": np.array([[b"a"], [b"b"]], dtype=object)}
    assert modelinfo.response_output_names(http_result(outputs)) == ["logits", "label"]
    assert modelinfo.response_output_names(grpc_result(outputs)) == ["logits", "label"]


def test_classifications_pair_each_label_score_and_logits_row() -> None:
    rows = modelinfo.classifications(
        {"label": np.array([[b"pos"], ["né".encode()]], dtype=object), "score": np.array([[0.9], [0.6]], np.float32),
         "logits": np.array([[1, 2], [3, 4]], np.float32)}, "logits")
    assert [(r.label, round(r.score, 3), r.logits.tolist()) for r in rows] == [("pos", 0.9, [1, 2]), ("né", 0.6, [3, 4])]
    assert rows[0] == modelinfo.Classification("pos", rows[0].score, np.array([1, 2], np.float32))
    assert rows[0] != rows[1]
    bare = modelinfo.classifications({"label": np.array([[b"x"]], dtype=object), "score": np.ones((1, 1), np.float32)}, None)
    assert bare[0].logits.shape == (0,)
