"""Autoscaling from measured capacity: a tune report's winner becomes the chart's target, and a replay of
load steps against the HPA rule shows pods added before any pod runs past its capacity (on a ramp), and
how long a sudden step leaves them past it (the time a new pod takes)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helm.test_chart import helm  # noqa: F401 - the fixture: helm fetched once, under the lock
from tritonbundle.tune.capacity import (
    DEFAULT_READY_S,
    Rule,
    autoscaling_values,
    counted_model,
    replay,
    summary,
)
from tritonbundle.tune.report import write
from tritonbundle.tune.result import TuneResult

ROOT = Path(__file__).resolve().parents[2]
#: A real tune run on the H200 (docs/tuning.md): BERT-base, p99 <= 50 ms, winner 8,042.4 req/s.
TUNE_JSON = ROOT / "docs" / "tuning" / "h200-bert-base-packed" / "tune.json"


def test_the_target_is_the_tune_winners_capacity_times_the_headroom() -> None:
    result = TuneResult.from_json(json.loads(TUNE_JSON.read_text()))
    values = autoscaling_values(result)["autoscaling"]
    assert values["target"] == "requestsPerSecond" and values["requestsPerSecond"] == 5629  # floor(8042.4 x 0.7)
    assert values["measured"] == {"model": "bert_base", "capacityPerReplica": 8042.4, "sloP99Ms": 50.0, "headroom": 0.7}
    assert values["models"] == "bert_base"  # recorded before the encoder was: the ensemble's requests
    encoder = dataclasses.replace(result, encoder="bert_base_encoder")
    assert autoscaling_values(encoder)["autoscaling"]["models"] == "bert_base_encoder"
    assert result.winner is not None
    folded = dataclasses.replace(result.winner, config={**result.winner.config, "tokenize_in_encoder": True})
    assert counted_model(dataclasses.replace(encoder, verdict=dataclasses.replace(result.verdict, winner=folded))) == "bert_base"
    assert TuneResult.from_json(encoder.to_json()).encoder == "bert_base_encoder"
    with pytest.raises(ValueError, match="no winner"):
        autoscaling_values(dataclasses.replace(result, verdict=None))
    with pytest.raises(ValueError, match="headroom"):
        autoscaling_values(result, headroom=1.5)


def test_tune_writes_autoscaling_values_that_the_chart_turns_into_the_hpa_target(tmp_path: Path, helm: Path) -> None:  # noqa: F811
    write(TuneResult.from_json(json.loads(TUNE_JSON.read_text())), tmp_path)
    values = tmp_path / "autoscaling-values.yaml"
    assert yaml.safe_load(values.read_text())["autoscaling"]["requestsPerSecond"] == 5629
    chart = ROOT / "helm" / "tritonbundle"
    done = subprocess.run([str(helm), "template", "t", str(chart), "-f", str(chart / "ci" / "autoscaling-monitoring-values.yaml"),
                           "-f", str(values)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    (hpa,) = [d for d in yaml.safe_load_all(done.stdout) if d and d["kind"] == "HorizontalPodAutoscaler"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == "tritonbundle_requests_per_second"
    assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "5629"}


CAPACITY, TARGET = 8042.4, 5629.0
#: The chart's scale-up behaviour (values.yaml autoscaling.behavior.scaleUp) and replica bounds.
RULE = Rule(target_per_pod=TARGET, min_replicas=1, max_replicas=4, stabilization_s=60, pods_per_period=2,
            policy_period_s=60, ready_s=DEFAULT_READY_S)


def test_on_a_ramp_pods_are_added_before_any_pod_runs_past_its_capacity() -> None:
    # 2,000 req/s, then +1,500 every 2 minutes up to 14,000: a day's morning ramp, compressed.
    ramp = [(i * 120.0, 2000.0 + 1500.0 * i) for i in range(9)]
    moments = replay(ramp, RULE, CAPACITY)
    got = summary(moments, RULE)
    assert got["first_scale_out_s"] is not None and got["first_over_capacity_s"] is None
    assert got["seconds_over_capacity"] == 0 and got["pods_at_end"] == 3
    assert max(m.per_pod for m in moments) <= CAPACITY


def test_a_sudden_step_is_past_capacity_for_about_the_time_a_pod_takes() -> None:
    step = [(0.0, 3000.0), (300.0, 15000.0)]  # a 5x burst: no headroom holds it
    got = summary(replay(step, RULE, CAPACITY), RULE)
    assert got["first_over_capacity_s"] == 300.0
    # The stabilization window (60 s) and the pod's start (60 s): about two minutes over, then 2 pods added.
    assert 100 <= got["seconds_over_capacity"] <= 140 and got["pods_at_end"] == 3
    faster = summary(replay(step, Rule(**{**RULE.__dict__, "stabilization_s": 0, "ready_s": 25}), CAPACITY), RULE)
    assert faster["seconds_over_capacity"] < got["seconds_over_capacity"]
