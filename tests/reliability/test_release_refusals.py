"""``Release`` when the candidate cannot be compared: refused, the serving version restored, the ensemble
unpinned. A recording double of tritonclient's HTTP client isolates the steps (which loads, in which
order); the release on the real server is tests/reliability/test_release.py."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from tritonbundle.errors import ConfigError
from tritonbundle.release import Release


class _Answer:
    def __init__(self, array: np.ndarray[Any, Any]) -> None:
        self.array = array

    def as_numpy(self, name: str) -> np.ndarray[Any, Any]:
        return self.array


class _Server:
    """Ensemble ``m`` (tokenizer ``tok`` -> encoder ``enc``); ``enc`` serves version 1 (ones), the
    candidate 2 answers ``candidate``. Records each load as (model, encoder versions or pinned version)."""

    def __init__(self, candidate: np.ndarray[Any, Any]) -> None:
        self.candidate, self.loads = candidate, []  # type: list[tuple[str, Any]]

    def get_model_config(self, name: str) -> dict[str, Any]:
        if name == "m":
            return {"name": "m", "platform": "ensemble",
                    "ensemble_scheduling": {"step": [{"model_name": "tok"}, {"model_name": "enc"}]}}
        if name == "tok":
            return {"output": [{"name": "input_ids"}, {"name": "tokens"}]}
        return {"name": "enc", "output": [{"name": "embedding"}]}

    def get_model_metadata(self, name: str) -> dict[str, Any]:
        return {"versions": ["1"]}

    def load_model(self, name: str, headers: Any = None, config: str = "{}") -> None:
        c = json.loads(config)
        policy = c.get("version_policy")
        self.loads.append((name, policy["specific"]["versions"] if policy else
                           c["ensemble_scheduling"]["step"][-1].get("model_version")))

    def infer(self, model: str, tensors: Any, model_version: str | None = None) -> _Answer:
        if model == "tok":
            return _Answer(np.array([[101, 7, 102]]))
        return _Answer(np.ones((1, 4), np.float32) if model_version == "1" else self.candidate)


def _release(candidate: np.ndarray[Any, Any]) -> tuple[Release, _Server]:
    release = Release("127.0.0.1:1", "m", 2, api_key=None)
    server = _Server(candidate)
    release.client = server  # type: ignore[assignment]
    return release, server


#: What a refusal leaves: the encoder serving version 1 alone, the ensemble unpinned (its latest).
RESTORED = [("enc", [1]), ("m", -1)]


@pytest.mark.parametrize(("candidate", "named"), [
    (np.full((1, 4), np.nan, np.float32), "not finite"),
    (np.ones((1, 8), np.float32), "of shape [1, 8], version 1 [1, 4]"),
])
def test_a_candidate_whose_answers_cannot_be_compared_is_refused_and_the_serving_version_restored(
        candidate: np.ndarray[Any, Any], named: str) -> None:
    release, server = _release(candidate)
    verdict = release.run(["a", "b"], rounds=2)
    assert not verdict.promoted
    assert "the comparison failed" in verdict.reason and named in verdict.reason
    assert server.loads == [("enc", [1]), ("m", 1), ("enc", [1, 2]), *RESTORED]


def test_an_agreeing_candidate_is_promoted_and_the_ensemble_unpinned() -> None:
    release, server = _release(np.full((1, 4), 2.0, np.float32))  # same direction: cosine 1
    verdict = release.run(["a"], rounds=1, slack_ms=1e6)
    assert verdict.promoted, verdict.reason
    assert server.loads == [("enc", [1]), ("m", 1), ("enc", [1, 2]), ("m", 2), ("enc", [2]), ("m", -1)]


def test_a_differing_candidate_is_refused() -> None:
    release, server = _release(np.array([[1.0, -1.0, 1.0, -1.0]], np.float32))  # cosine 0
    verdict = release.run(["a"], rounds=1)
    assert not verdict.promoted and "answers differ: least cosine 0.000000" in verdict.reason
    assert server.loads[-2:] == RESTORED


@pytest.mark.parametrize(("texts", "rounds"), [([], 3), (["a"], 0)])
def test_a_release_that_would_compare_nothing_is_refused_before_any_load(texts: list[str], rounds: int) -> None:
    release, server = _release(np.ones((1, 4), np.float32))
    with pytest.raises(ConfigError, match="at least one text once"):
        release.run(texts, rounds=rounds)
    assert server.loads == []
