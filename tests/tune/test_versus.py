"""``tune --versus``: the settings to beat are measured beside the search, and the winner's other
finalist is them, not the manifest's defaults. The search's own flow runs as is; only the measurement of a
point (serving a repository, the load generators) is replaced by a response surface, as in
test_search.py (the real server is measured in test_tune_cpu.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ARTIFACTS, MANIFEST
from tritonbundle.errors import ConfigError
from tritonbundle.tune import run as tune_run
from tritonbundle.tune.options import TuneOptions
from tritonbundle.tune.search import Point

#: The hand-picked settings: 3 instances, a 5 ms delay. The search from one instance and no delay reaches
#: 3 instances but only steps the delay down from 2.5 ms before its budget ends (the H100 run of
#: docs/tuning.md, "The winner on another H100"), so the reference stays ahead.
HANDPICKED = {"instances": 3, "max_queue_delay_us": 5000}


def surface(config: dict[str, Any]) -> float:
    return 100.0 * min(config["instances"], 3) + config["max_queue_delay_us"] / 50


class _Pool:
    def __init__(self, *_args: Any) -> None:
        pass

    def start(self) -> _Pool:
        return self

    def stop(self) -> None:
        pass


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    calls: list[tuple[str, dict[str, Any]]] = []

    def measure(label: str, config: dict[str, Any], *_args: Any) -> Point:
        calls.append((label, dict(config)))
        # a re-measurement reads 2 % lower: the finalists' medians are what the verdict compares
        again = sum(1 for _, c in calls[:-1] if c == config)
        return Point(label, dict(config), surface(config) * (1 - 0.02 * again), {"p50_ms": 5.0, "p99_ms": 20.0})

    monkeypatch.setattr(tune_run, "_measure", measure)
    monkeypatch.setattr(tune_run, "LoadPool", _Pool)
    monkeypatch.setattr(tune_run, "python_ms", lambda repeat: [50.0])
    return calls


def _options(tmp_path: Path, versus: Path | None) -> TuneOptions:
    return TuneOptions(out=tmp_path / "tune", manifest=MANIFEST, artifacts=ARTIFACTS, budget_s=60, repeat=3,
                       start={"instances": 1, "max_queue_delay_us": 0}, knobs=("instances", "max_queue_delay_us"),
                       versus=versus, work=tmp_path / "work")


def test_the_reference_is_measured_third_and_is_the_winners_other_finalist(
        tmp_path: Path, measured: list[tuple[str, dict[str, Any]]], monkeypatch: pytest.MonkeyPatch) -> None:
    settings = tmp_path / "handpicked.json"
    settings.write_text(json.dumps({"winner": {"config": HANDPICKED}}))
    # the budget: the start, the defaults, the reference, five search points, then the finals
    monkeypatch.setattr(tune_run, "_time_for_a_point", lambda points, clock, *reserve: len(points) < 8 + 4 * bool(not reserve))
    result = tune_run.run_tune(_options(tmp_path, settings))
    labels = [label for label, _ in measured]
    assert labels[:3] == ["start", "the manifest's defaults", "the reference (handpicked.json)"]
    assert measured[2][1] == {**result.defaults, **HANDPICKED}
    assert result.verdict is not None and result.verdict.reference is not None
    # the finals, in turns: the search's pick (2 instances at 5 ms, where its budget ended) and the reference
    finals = [config for label, config in measured if label.startswith("again")]
    assert finals == [{"instances": 2, "max_queue_delay_us": 5000}, measured[2][1]] * 2, finals
    assert result.winner is not None and result.winner.config == measured[2][1]  # the better median
    assert "it is the reference settings (--versus)" in result.verdict.reason
    assert result.verdict.baseline is not None and result.verdict.baseline.rates == ()  # the defaults: once
    assert len(result.verdict.reference.rates) >= 2  # the reference: again, in turns with the winner
    written = json.loads((tmp_path / "tune" / "tune.json").read_text())
    assert written["reference"]["config"] == {**result.defaults, **HANDPICKED}
    assert "the reference (handpicked.json)" in (tmp_path / "tune" / "tune.md").read_text()


def test_a_reference_with_a_knob_the_model_does_not_offer_is_refused_before_anything_runs(
        tmp_path: Path, measured: list[tuple[str, dict[str, Any]]]) -> None:
    settings = tmp_path / "other.json"
    settings.write_text(json.dumps({"winner": {"config": {"instances": 2, "warp_drive": 9}}}))
    with pytest.raises(ConfigError, match="warp_drive not among this model's knobs"):
        tune_run.run_tune(_options(tmp_path, settings))
    assert measured == []
