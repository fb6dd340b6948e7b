"""``Release`` against a stand-in for Triton's HTTP API (the real server: tests/reliability/test_release.py):
the encoder step is found by name (a classifier's ensemble ends with its post-processing model), a serving
version that answers NaN refuses the release, a release stopped midway is named instead of read as a newer
serving version, and an interrupted comparison restores the serving version before the command ends."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tritonbundle.errors import ConfigError
from tritonbundle.release import Release


def _release(*, steps: tuple[str, ...] = ("m_tokenizer", "m_encoder", "m_postprocess"), versions: tuple[int, ...] = (1,),
             answers: dict[int, np.ndarray[Any, Any]] | None = None, inputs: tuple[str, ...] = ("TEXT",)) -> Release:
    release = Release("127.0.0.1:1", "m", 2, api_key="k")
    configs = {
        "m": {"name": "m", "platform": "ensemble", "input": [{"name": n} for n in inputs],
              "ensemble_scheduling": {"step": [{"model_name": s, "model_version": -1} for s in steps]}},
        "m_encoder": {"name": "m_encoder", "output": [{"name": "logits"}]},
        "m_tokenizer": {"name": "m_tokenizer", "output": [{"name": "input_ids"}, {"name": "tokens"}]},
    }
    loads: list[tuple[str, Any]] = []
    release.loads = loads  # type: ignore[attr-defined]
    release._config = lambda name: configs[name]  # type: ignore[method-assign]
    release._load = lambda name, config, what: loads.append((name, config))  # type: ignore[method-assign]
    release._tokens = lambda tokenizer, texts: {"input_ids": np.array([[101, 7, 102]])}  # type: ignore[method-assign]
    given = answers or {1: np.array([[0.6, 0.8]]), 2: np.array([[0.6, 0.8]])}
    release._embed = lambda encoder, version, feeds, output: (given[version], 1.0)  # type: ignore[method-assign]
    release.client.get_model_metadata = lambda name: {"versions": [str(v) for v in versions]}  # type: ignore[method-assign]
    return release


def _pins(release: Any) -> list[int]:
    return [c["ensemble_scheduling"]["step"][1]["model_version"] for name, c in release.loads if name == "m"]


def test_a_classifiers_encoder_step_is_found_by_name_and_pinned() -> None:
    release = _release()
    verdict = release.run(["a text"], rounds=1)
    assert verdict.promoted and verdict.encoder == "m_encoder", verdict
    assert _pins(release) == [1, 2, -1]  # the encoder step (index 1), not the post-processing one
    assert all(c["ensemble_scheduling"]["step"][2]["model_version"] == -1 for n, c in release.loads if n == "m")


def test_a_serving_version_that_answers_nan_refuses_the_release() -> None:
    release = _release(answers={1: np.array([[np.nan, 0.8]]), 2: np.array([[0.6, 0.8]])})
    verdict = release.run(["a text"], rounds=1)
    assert not verdict.promoted and "version 1 answers logits with values that are not finite" in verdict.reason


def test_a_release_stopped_midway_is_named_not_taken_for_a_newer_serving_version() -> None:
    with pytest.raises(ConfigError, match=r"'m_encoder' serves versions \[1, 2\] at once: an earlier release stopped"):
        _release(versions=(2, 1)).run(["a text"], rounds=1)


def test_text_pairs_are_refused_before_anything_loads() -> None:
    release = _release(steps=("m_tokenizer", "m_encoder", "m_postprocess"), inputs=("QUERY", "TEXT"))
    with pytest.raises(ConfigError, match="query and text pairs"):
        release.run(["a text"], rounds=1)
    assert release.loads == []  # type: ignore[attr-defined]


def test_an_interrupted_comparison_restores_the_serving_version_then_ends() -> None:
    release = _release()

    def interrupted(*args: Any) -> Any:
        raise KeyboardInterrupt

    release.compare = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        release.run(["a text"], rounds=1)
    loads = release.loads  # type: ignore[attr-defined]
    assert loads[-2][0] == "m_encoder" and loads[-2][1]["version_policy"] == {"specific": {"versions": [1]}}
    assert _pins(release)[-1] == -1  # unpinned: the ensemble serves what the encoder serves, version 1
