"""Which outputs the pytorch runtime's served model puts into a response (its ``_run``), with a stand-in
for the Python backend's ``pb_utils`` that records the tensors: the real stub and server are exercised
in test_serving.py; this pins the rule that only requested outputs are attached (model.py's docstring
says why: tritonserver 2.51's Python backend frees the others without the GIL)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tritonbundle.contract import TOKENS_OUTPUT
from tritonbundle.runtimes.pytorch import model as served
from tritonbundle.runtimes.stats import new_stats


class _Pb:
    """The two pb_utils classes ``_run`` builds responses from."""

    class Tensor:
        def __init__(self, name: str, array: Any) -> None:
            self.name, self.array = name, array

    class InferenceResponse:
        def __init__(self, output_tensors: list[Any], error: Any = None) -> None:
            self.output_tensors, self.error = output_tensors, error


def _request(*names: str) -> Any:
    return SimpleNamespace(requested_output_names=lambda: set(names))


def test_a_response_carries_the_token_counts_only_when_its_request_asked_for_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(served, "pb_utils", _Pb)
    model = object.__new__(served.TritonPythonModel)
    model.counts, model.output_name = True, "embedding"
    model.engine = SimpleNamespace(embed=lambda ids, masks, lengths, stats, lane=0: np.arange(ids.shape[0] * 2, dtype=np.float32).reshape(-1, 2))
    requests = [_request("embedding"), _request("embedding", TOKENS_OUTPUT), _request(TOKENS_OUTPUT, "embedding")]
    counted = {i for i, r in enumerate(requests) if model._wants_counts(r)}
    masks = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]], dtype=np.int64)
    responses: list[Any] = [None] * 3
    model._run([0, 1, 2], counted, (masks * 7, masks, [1, 2, 1]), responses, new_stats(), 0)
    assert [[t.name for t in r.output_tensors] for r in responses] == [
        ["embedding"], ["embedding", TOKENS_OUTPUT], ["embedding", TOKENS_OUTPUT]]
    assert responses[1].output_tensors[0].array.tolist() == [[2.0, 3.0], [4.0, 5.0]], "each request's own rows"
    assert responses[1].output_tensors[1].array[:, 0].tolist() == [1, 3]


def test_a_model_without_the_counts_output_never_attaches_them() -> None:
    model = object.__new__(served.TritonPythonModel)
    model.counts = False
    assert not model._wants_counts(_request("embedding", TOKENS_OUTPUT))
