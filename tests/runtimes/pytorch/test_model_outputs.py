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


def test_reading_and_tokenizing_are_timed_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """An encoder that tokenizes itself splits execute()'s first phase into ``read`` (the requests'
    tensors, checked and decoded) and ``tokenize`` (one tokenizer call for every text): the H200's
    timelines had one figure for both. Here reading takes 2 ms a request and tokenizing 200 ms a call
    (far apart: a busy machine's late wake-ups do not blur them)."""
    import threading
    import time

    from tritonbundle.recipes import tokenizer_file
    from tritonbundle.runtimes.text import load_tokenizer

    class Tensor:
        def __init__(self, texts: list[bytes]) -> None:
            self.array = np.array(texts, dtype=object).reshape(-1, 1)

        def shape(self) -> list[int]:
            return list(self.array.shape)

        def as_numpy(self) -> Any:
            time.sleep(0.002)
            return self.array

    class Pb(_Pb):
        @staticmethod
        def get_input_tensor_by_name(request: Any, name: str) -> Any:
            return request.tensor

    class SlowTokenizer:
        def __init__(self, whole: Any) -> None:
            self.whole = whole

        def encode_batch(self, rows: list[Any]) -> list[Any]:
            time.sleep(0.200)
            return list(self.whole.encode_batch_fast(rows))

    monkeypatch.setattr(served, "pb_utils", Pb)
    model = object.__new__(served.TritonPythonModel)
    tokenizer = load_tokenizer(str(tokenizer_file("minilm")), 32)
    model.tokenizer, model.max_batch, model.max_text_bytes, model.max_length, model.pad_id = (
        SlowTokenizer(tokenizer), 64, 4096, 32, 0)
    model.counts, model._free, model._workers = False, None, None
    model.stats, model._stats_lock = new_stats(), threading.Lock()
    seen: list[Any] = []
    monkeypatch.setattr(model, "_run", lambda indices, counted, batch, responses, stats, lane: seen.append(batch))
    requests = [SimpleNamespace(tensor=Tensor([b"hello world", b"a second text"]), requested_output_names=set)
                for _ in range(4)]
    model.execute(requests)
    ids, masks, rows = seen[0]
    assert rows == [2, 2, 2, 2] and ids.shape[0] == 8 and masks.shape == ids.shape
    assert 0.008 <= model.stats["t_read_s"] < 0.200, "four requests of 2 ms, without the tokenizer's 200"
    assert model.stats["t_tokenize_s"] >= 0.200
