"""``Release`` when the candidate cannot be compared: refused, the serving version restored, the ensemble
unpinned; the encoder step found by name, a release stopped midway named, an interrupted one restored. A recording double of tritonclient's HTTP client isolates the steps (which loads, in which
order); the release on the real server is tests/reliability/test_release.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tritonbundle.errors import ConfigError
from tritonbundle.release import RUN_AGAIN, Release, ReleaseInterrupted, Verdict


class _Answer:
    def __init__(self, array: np.ndarray[Any, Any]) -> None:
        self.array = array

    def as_numpy(self, name: str) -> np.ndarray[Any, Any]:
        return self.array


class _Server:
    """Ensemble ``m`` (tokenizer ``m_tokenizer`` -> encoder ``m_encoder``); the encoder serves version 1 (ones), the
    candidate 2 answers ``candidate``. Records each load as (model, encoder versions or pinned version)."""

    def __init__(self, candidate: np.ndarray[Any, Any], *, serving: np.ndarray[Any, Any] | None = None,
                 versions: tuple[int, ...] = (1,), postprocess: bool = False, pairs: bool = False,
                 pinned: int | None = None, batching: bool = True) -> None:
        self.candidate, self.loads = candidate, []  # type: list[tuple[str, Any]]
        self.calls: list[tuple[str, int]] = []  # (model, rows) of each inference
        self.serving = np.ones((1, 4), np.float32) if serving is None else serving
        self.versions = versions
        #: A classifier's ensemble ends with its post-processing model; a text-pair one takes QUERY too.
        self.steps = ["m_tokenizer", "m_encoder"] + (["m_postprocess"] if postprocess else [])
        self.inputs = ["QUERY", "TEXT"] if pairs else ["TEXT"]
        self.pinned = pinned  # the encoder step's model_version, as Triton's JSON says an int64: a string
        self.max_batch = (8, 4) if batching else (0, 0)  # the tokenizer's, the encoder's max_batch_size
        #: The error load_model raises for the encoder with versions (1, 2) (None: it loads).
        self.load_error: BaseException | None = None
        #: How many loads came before each wait for the gateway to read the ensemble's pin.
        self.settled: list[int] = []

    def get_model_config(self, name: str) -> dict[str, Any]:
        if name == "m":
            return {"name": "m", "platform": "ensemble", "input": [{"name": i} for i in self.inputs],
                    "ensemble_scheduling": {"step": [
                        {"model_name": n, **({"model_version": str(self.pinned)} if n == "m_encoder" and
                                             self.pinned is not None else {})} for n in self.steps]}}
        if name == "m_tokenizer":
            return {"max_batch_size": self.max_batch[0], "output": [{"name": "input_ids"}, {"name": "tokens"}]}
        return {"name": "m_encoder", "max_batch_size": self.max_batch[1], "output": [{"name": "embedding"}]}

    def get_model_metadata(self, name: str) -> dict[str, Any]:
        return {"versions": [str(v) for v in self.versions]}

    def load_model(self, name: str, headers: Any = None, config: str = "{}") -> None:
        c = json.loads(config)
        policy = c.get("version_policy")
        steps = c.get("ensemble_scheduling", {}).get("step", [])
        self.loads.append((name, policy["specific"]["versions"] if policy else
                           next(s.get("model_version") for s in steps if s["model_name"] == "m_encoder")))
        assert all(s.get("model_version") in (None, -1) for s in steps if s["model_name"] != "m_encoder")
        if self.load_error is not None and self.loads[-1] == ("m_encoder", [1, 2]):
            raise self.load_error

    def infer(self, model: str, tensors: Any, model_version: str | None = None) -> _Answer:
        """A batch of n rows answers n rows: the answer's first row repeated, or the candidate's as it
        is when it has n rows (a row that differs within a batch)."""
        rows = tensors[0].shape()[0]
        self.calls.append((model, rows))
        if model == "m_tokenizer":
            return _Answer(np.tile(np.array([[101, 7, 102]]), (rows, 1)))
        answer = self.serving if model_version == "1" else self.candidate
        return _Answer(answer if len(answer) == rows else np.tile(answer[:1], (rows, 1)))


def _release(candidate: np.ndarray[Any, Any], **server_options: Any) -> tuple[Release, _Server]:
    release = Release("127.0.0.1:1", "m", 2, api_key=None)
    server = _Server(candidate, **server_options)
    release.client = release.loader = server  # type: ignore[assignment]
    release._settle = lambda: server.settled.append(len(server.loads))  # type: ignore[method-assign]
    return release, server


#: What a refusal leaves: the encoder serving version 1 alone, the ensemble unpinned (its latest).
RESTORED = [("m_encoder", [1]), ("m", -1)]


@pytest.mark.parametrize(("candidate", "named"), [
    (np.full((1, 4), np.nan, np.float32), "not finite"),
    (np.ones((1, 8), np.float32), "of shape [1, 8], version 1 [1, 4]"),
])
def test_a_candidate_whose_answers_cannot_be_compared_is_refused_and_the_serving_version_restored(
        candidate: np.ndarray[Any, Any], named: str) -> None:
    release, server = _release(candidate)
    verdict = release.run(["a", "b"], rounds=2)
    assert not verdict.promoted and verdict.candidate_at_fault
    assert "the comparison failed" in verdict.reason and named in verdict.reason
    assert server.loads == [("m_encoder", [1]), ("m", 1), ("m_encoder", [1, 2]), *RESTORED]


def test_an_agreeing_candidate_is_promoted_and_the_ensemble_unpinned() -> None:
    release, server = _release(np.full((1, 4), 2.0, np.float32))  # same direction: cosine 1
    verdict = release.run(["a"], rounds=1, slack_ms=1e6)
    assert verdict.promoted, verdict.reason
    assert server.loads == [("m_encoder", [1]), ("m", 1), ("m_encoder", [1, 2]), ("m", 2), ("m_encoder", [2]), ("m", -1)]
    # The gateway's token-id calls read the pin before the encoder's versions change: after each move of the pin.
    assert server.settled == [2, 4]


def test_a_differing_candidate_is_refused() -> None:
    release, server = _release(np.array([[1.0, -1.0, 1.0, -1.0]], np.float32))  # cosine 0
    verdict = release.run(["a"], rounds=1)
    assert not verdict.promoted and "answers differ: least cosine 0.000000" in verdict.reason
    assert verdict.candidate_at_fault and server.loads[-2:] == RESTORED


@pytest.mark.parametrize(("texts", "rounds"), [([], 3), (["a"], 0)])
def test_a_release_that_would_compare_nothing_is_refused_before_any_load(texts: list[str], rounds: int) -> None:
    release, server = _release(np.ones((1, 4), np.float32))
    with pytest.raises(ConfigError, match="at least one text once"):
        release.run(texts, rounds=rounds)
    assert server.loads == []


def test_a_classifiers_encoder_step_is_found_by_name_and_pinned() -> None:
    """The last step was taken for the encoder: a classifier's is its post-processing model, so every
    classifier release was refused with a wrong reason (the double asserts no other step is pinned)."""
    release, server = _release(np.full((1, 4), 2.0, np.float32), postprocess=True)
    verdict = release.run(["a"], rounds=1, slack_ms=1e6)
    assert verdict.promoted and verdict.encoder == "m_encoder", verdict.reason
    assert server.loads == [("m_encoder", [1]), ("m", 1), ("m_encoder", [1, 2]), ("m", 2), ("m_encoder", [2]), ("m", -1)]


def test_a_serving_version_that_answers_nan_refuses_the_release() -> None:
    """NaN compares false with everything: the serving version's NaN dropped out of the least cosine."""
    release, server = _release(np.ones((1, 4), np.float32), serving=np.full((1, 4), np.nan, np.float32))
    verdict = release.run(["a"], rounds=1)
    assert not verdict.promoted and "version 1 answers embedding with values that are not finite" in verdict.reason
    assert not verdict.candidate_at_fault, "the serving version's NaN is not the candidate's doing"
    assert server.loads[-2:] == RESTORED


def test_a_release_stopped_midway_unpinned_is_named_not_taken_for_a_newer_serving_version() -> None:
    release, server = _release(np.ones((1, 4), np.float32), versions=(2, 1), pinned=-1)
    with pytest.raises(ConfigError, match=r"'m_encoder' serves versions \[1, 2\] at once and 'm' is not pinned"):
        release.run(["a"], rounds=1)
    assert server.loads == []


def test_a_release_killed_during_the_comparison_is_restored_from_the_ensembles_pin() -> None:
    """Killed while N=1 and N+1=3 served side by side, the ensemble pinned to 1: the next release takes 1
    for the serving version (its first loads make it serve alone) and goes on with its own candidate."""
    release, server = _release(np.full((1, 4), 2.0, np.float32), versions=(3, 1), pinned=1)
    verdict = release.run(["a"], rounds=1, slack_ms=1e6)
    assert verdict.serving == 1 and verdict.promoted, verdict.reason
    assert server.loads[0] == ("m_encoder", [1]) and "an earlier release stopped midway" in verdict.steps[0]
    assert release.left_over == [3], "the stopped release's candidate: never promoted"


def test_releasing_the_pinned_version_again_after_a_kill_restores_it_and_says_so() -> None:
    release, server = _release(np.ones((1, 4), np.float32), versions=(2, 1), pinned=2)
    with pytest.raises(ConfigError, match=r"already serves version 2 \(restored: it serves that version alone"):
        release.run(["a"], rounds=1)
    assert server.loads == [("m_encoder", [2]), ("m", -1)]
    assert release.left_over == [], "1, below the pin, is the version the promotion replaced: it stays"


def test_text_pairs_are_refused_before_anything_loads() -> None:
    release, server = _release(np.ones((1, 4), np.float32), postprocess=True, pairs=True)
    with pytest.raises(ConfigError, match="query and text pairs"):
        release.run(["a"], rounds=1)
    assert server.loads == []


def test_an_interrupted_comparison_restores_the_serving_version_then_ends() -> None:
    release, server = _release(np.ones((1, 4), np.float32))

    def interrupted(*args: Any) -> Any:
        raise KeyboardInterrupt

    release.compare = interrupted  # type: ignore[method-assign]
    with pytest.raises(ReleaseInterrupted, match="during the comparison; m_encoder serves version 1 alone again"):
        release.run(["a"], rounds=1)
    assert server.loads == [("m_encoder", [1]), ("m", 1), ("m_encoder", [1, 2]), *RESTORED]


def test_a_repository_without_the_candidates_folder_is_refused_before_any_load(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from tritonbundle.cli import main
    from tritonbundle.proc import free_port

    (tmp_path / "minilm_encoder" / "1").mkdir(parents=True)
    code = main(["release", "--url", f"127.0.0.1:{free_port()}", "--model", "minilm", "--version", "2",
                 "--repository", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and f"no folder {tmp_path / 'minilm_encoder' / '2'}" in err, err


def test_texts_are_compared_in_batches_the_models_take_and_one_differing_row_refuses() -> None:
    """Rows of mixed lengths in one call go through the padded (masked) path a single row never takes:
    a candidate wrong only there answers one row of a batch differently, and that row's cosine refuses it."""
    batch = np.ones((4, 4), np.float32)
    batch[2] = [1.0, -1.0, 1.0, -1.0]  # cosine 0 with the serving row
    release, server = _release(batch)
    verdict = release.run(list("abcdefgh"), rounds=2, batch=16)
    assert verdict.batch == 4, "capped at the encoder's max_batch_size (the tokenizer takes 8)"
    one_text, four = [("m_tokenizer", 1), ("m_encoder", 1), ("m_encoder", 1)], [("m_tokenizer", 4), ("m_encoder", 4), ("m_encoder", 4)]
    assert server.calls == one_text * 8 + four * 2 + one_text * 8, "batches in the first round only"
    assert not verdict.promoted and "answers differ: least cosine 0.000000" in verdict.reason


def test_a_pin_left_with_one_version_serving_is_cleared_by_releasing_that_version() -> None:
    """Stopped between "serves version 2 alone" and the unpin: rerunning the command unpins."""
    release, server = _release(np.ones((1, 4), np.float32), versions=(2,), pinned=2)
    with pytest.raises(ConfigError, match=r"already serves version 2 \(restored"):
        release.run(["a"], rounds=1)
    assert server.loads == [("m_encoder", [2]), ("m", -1)]


def test_a_candidate_load_the_server_refused_is_its_fault_a_timeout_is_not() -> None:
    from tritonclient.utils import InferenceServerException

    for error, at_fault in ((InferenceServerException("load failed for model 'm_encoder': version 2 is at "
                                                      "UNAVAILABLE state: Internal: onnx runtime error"), True),
                            (TimeoutError("timed out"), False)):
        release, server = _release(np.ones((1, 4), np.float32))
        server.load_error = error
        verdict = release.run(["a"], rounds=1)
        assert not verdict.promoted and "did not load" in verdict.reason and verdict.candidate_at_fault is at_fault
        assert server.loads[-2:] == RESTORED


def test_ctrl_c_during_a_load_restores_nothing_and_says_to_run_again() -> None:
    """The load goes on in the server (a restore would race it): the next release reads the pin."""
    release, server = _release(np.ones((1, 4), np.float32))
    server.load_error = KeyboardInterrupt()
    with pytest.raises(ReleaseInterrupted, match="interrupted after: pinned m to m_encoder version 1") as e:
        release.run(["a"], rounds=1)
    assert RUN_AGAIN in str(e.value) and e.value.exit_code == 130
    assert server.loads == [("m_encoder", [1]), ("m", 1), ("m_encoder", [1, 2])]


def test_models_without_a_batch_dimension_are_refused_before_any_load() -> None:
    release, server = _release(np.ones((1, 4), np.float32), batching=False)
    with pytest.raises(ConfigError, match="'m_tokenizer' has no batch dimension"):
        release.run(["a"], rounds=1)
    assert server.loads == []


class _Verdicts:
    """``Release`` as the CLI sees it: run() returns a refusal (the candidate's doing or not) and may leave
    versions a stopped release served."""

    def __init__(self, at_fault: bool, left_over: list[int]) -> None:
        self.at_fault, self.left_over = at_fault, left_over

    def __call__(self, url: str, model: str, candidate: int, **kwargs: Any) -> _Verdicts:
        self.candidate = candidate
        return self

    def run(self, texts: list[str], **kwargs: Any) -> Verdict:
        return Verdict("minilm", "minilm_encoder", 1, self.candidate, False, "refused", candidate_at_fault=self.at_fault)


@pytest.mark.parametrize("at_fault", [True, False])
def test_with_repository_only_a_refusal_of_the_candidates_doing_moves_it_out(
    at_fault: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from tritonbundle import release
    from tritonbundle.cli import main
    from tritonbundle.proc import free_port

    repo = tmp_path / "model_repository"
    for v in (1, 2, 3):
        (repo / "minilm_encoder" / str(v)).mkdir(parents=True)
    monkeypatch.setattr(release, "Release", _Verdicts(at_fault, left_over=[3]))
    code = main(["release", "--url", f"127.0.0.1:{free_port()}", "--model", "minilm", "--version", "2",
                 "--repository", str(repo), "--report", str(tmp_path / "verdict.json")])
    assert code == 1 and json.loads((tmp_path / "verdict.json").read_text())["candidate_at_fault"] is at_fault
    assert (repo / "minilm_encoder" / "2").is_dir() is not at_fault, capsys.readouterr()
    assert not (repo / "minilm_encoder" / "3").exists(), "the stopped release's version: never promoted"
    moved = sorted(p.name.split("-")[0] for p in (tmp_path / "model_repository.quarantine" / "minilm_encoder").iterdir())
    assert moved == (["2", "3"] if at_fault else ["3"])
