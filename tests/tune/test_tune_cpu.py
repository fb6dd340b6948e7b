"""``tritonbundle tune`` on the CPU tier, on the real tritonserver: from a deliberately bad start (a
140 ms batcher delay, 93 % of the test's 150 ms SLO, and one instance) the search must find a configuration
that sustains more load within the SLO, measure the shipped defaults on the same footing, and write
the report, the winner and a manifest with the winner that the build stage accepts.

On this 2-core machine the shipped defaults (2 ms, one instance) and "queue delay 0" are within the
measurement noise of each other (p99 over a few seconds at 10-20 req/s), and a 20 ms start was too:
from a clean clone with other work beside it the winner equalled the start (1.67 req/s both). So the
start is one whose cost is larger than any noise: below the batch-filling rates this tier reaches,
every request waits most of the delay, and p99 misses the SLO at every rate. The SLO is 150 ms, not
the manifest's 50: here a request takes 30-50 ms at p50 with nothing queued, and with 50 ms a clean-clone
CI run at a38646a found no rate at which even the defaults met it (p99 67 ms at 1 req/s; 45-48 ms on
the idle machine right after).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import yaml

from tests.conftest import ARTIFACTS, MANIFEST
from tritonbundle import traffic
from tritonbundle.build.stage import BuildOptions, load_manifest
from tritonbundle.cli import main

pytestmark = pytest.mark.slow

#: The bad start's batcher delay: most of the SLO, so every request it serves below the batch-filling rates misses.
BAD_DELAY_US = 140_000


def test_tune_beats_a_bad_start_and_reports_the_defaults(exported_minilm: Path, tmp_path: Path) -> None:
    # Short requests: more of them per window, so each level's p99 rests on more samples.
    sample = traffic.dump(traffic.synthetic("chat", n=2000, max_tokens=128, seed=1), tmp_path / "short.jsonl")
    manifest = tmp_path / "models.yaml"
    manifest.write_text(MANIFEST.read_text().replace("traffic: traffic/chat.jsonl", f"traffic: {sample}"))
    out = tmp_path / "tune"
    code = main(["tune", "--manifest", str(manifest), "--artifacts", str(ARTIFACTS), "--budget-s", "125",
                 "--slo-p99-ms", "150", "--window-s", "3", "--refine", "1", "--start-rate", "8", "--repeat", "2",
                 "--start", f"instances=1,max_queue_delay_us={BAD_DELAY_US}",
                 "--knobs", "max_queue_delay_us,instances", "--out", str(out)])
    result = json.loads((out / "tune.json").read_text())
    print(f"\ntune (CPU tier): {result['reason']}")
    for p in result["points"]:
        print(f"  {p['label']}: {p['config']} -> {p['rate']}")
    assert code == 0, result.get("reason")
    assert result["status"] == "done"

    start = result["points"][0]
    assert start["config"] == {"instances": 1, "max_queue_delay_us": BAD_DELAY_US}
    baseline, winner = result["baseline"], result["winner"]
    assert baseline["config"] == {"instances": 1, "max_queue_delay_us": 2000}, "the shipped defaults are measured"
    assert winner["rate"] > (start["rate"] or 0.0), "the search found a better point than the bad start"
    assert winner["rate"] >= (baseline["rate"] or 0.0), "the winner is at least the defaults on the same measurement"
    # The finalists measured again, in turns, the winner named by the median of its readings. The budget
    # may end after the first re-measurement (points take 22-27 s here, the finals' reserve is a third of
    # the 125 s): then the other finalist keeps one reading, and may still win by it. A round in which the
    # budget cut a re-measurement's search (a floor: 4.0 req/s against 10.7 in one CI run) is left out
    # for both finalists.
    again = [p for p in result["points"] if p["label"].startswith("again 1: ")]
    assert again, "no finalist was measured again"
    cut = any(p["detail"].get("stopped") == "time budget" for p in again)
    readings = winner.get("rates") or [winner["rate"]]
    assert len(readings) == 1 + (0 if cut else sum(p["config"] == winner["config"] for p in again))
    assert winner["rate"] == pytest.approx(statistics.median(readings))
    assert winner["config"]["max_queue_delay_us"] < BAD_DELAY_US

    assert {"tune.json", "tune.md", "tune.png", "winner.yaml"} <= {f.name for f in out.iterdir()}
    assert yaml.safe_load((out / "winner.yaml").read_text()) == winner["config"]
    table = (out / "tune.md").read_text()
    assert "(winner)" in table and "the manifest's defaults" in table

    tuned = manifest.with_name("models.tuned.yaml")
    spec = load_manifest(BuildOptions(manifest=tuned, artifacts=ARTIFACTS)).models[0]
    assert (spec.instances, spec.max_queue_delay_us) == (winner["config"]["instances"], winner["config"]["max_queue_delay_us"])

    # Going on from this run (--resume): its points are taken over, none of its configurations measured again
    # (only a finalist's re-measurement may repeat one), whatever the short budget leaves time for. Against
    # settings in a file (--versus): measured before the search, on the real server, whatever the budget.
    versus = tmp_path / "handpicked.json"
    versus.write_text(json.dumps({"winner": {"config": {"instances": 2, "max_queue_delay_us": 0}}}))
    resumed_out = tmp_path / "tune-resumed"
    code = main(["tune", "--manifest", str(manifest), "--artifacts", str(ARTIFACTS), "--budget-s", "30",
                 "--slo-p99-ms", "150", "--window-s", "3", "--refine", "1", "--start-rate", "8", "--repeat", "2",
                 "--start", f"instances=1,max_queue_delay_us={BAD_DELAY_US}", "--knobs", "max_queue_delay_us,instances",
                 "--resume", str(out / "tune.json"), "--versus", str(versus), "--out", str(resumed_out)])
    resumed = json.loads((resumed_out / "tune.json").read_text())
    assert code == 0 and resumed["resumed_from"] == str(out / "tune.json")
    reference = resumed["reference"]
    print(f"  reference: {reference['config']} -> {reference['rate']} ({reference.get('rates')})")
    assert reference["config"] == {"instances": 2, "max_queue_delay_us": 0}
    assert reference["rate"], "the reference settings sustained no rate within the SLO on the real server"
    assert any(p["config"] == reference["config"] for p in resumed["points"]), "the reference was measured"
    assert "reference settings (--versus)" in resumed["reason"]
    # A point whose rate search the budget cut is a floor: it is not taken over, and is measured again.
    kept = [p for p in result["points"] if p["detail"].get("stopped") != "time budget"]
    assert kept, "the first run measured no point to the end: nothing to take over"
    assert resumed["points"][: len(kept)] == kept
    measured_before = {json.dumps(p["config"], sort_keys=True) for p in kept}
    new = resumed["points"][len(kept) :]
    print(f"  resumed: {len(new)} new point(s): {[p['label'] for p in new]}")
    assert all(p["label"].startswith("again") or json.dumps(p["config"], sort_keys=True) not in measured_before
               for p in new)


def test_tune_refuses_a_start_that_is_not_a_manifest_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["tune", "--start", "threads=4", "--out", str(tmp_path)])
    assert "--start" in capsys.readouterr().err
