"""docs/benchmarks.md, "A twelfth H100: bigger MiniLM calls cost less GPU per row and knee lower": the
committed reports of the session-36 calls read back. Fourteen instances at a cap of 64 against a cap of 128
with seven instances (2.5 ms delay) and with fourteen (5 ms), interleaved: the bigger calls form only from
the queue delay, cost less GPU per row, and knee far lower."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench.reports import docs_said, settings_in
from tritonbundle.bench.compare import markdown, read_run

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "docs" / "benchmarks" / "h100-twelfth-host-minilm-b128"


def test_the_calls_read_as_the_docs_say() -> None:
    settings = settings_in(FOLDER / "runs")
    assert (FOLDER / "summary.md").read_text() == markdown(list(settings.values()))
    docs = docs_said()
    for name, rounds in (("inst14", [1, 2, 3, 4, 5, 6]), ("b128i7", [1, 2, 3]), ("b128d5", [4, 5, 6]),
                         ("ceiling", [1, 2, 3])):
        s = settings[name]
        assert [r.round for r in s.by_round] == rounds and not any(r.floor for r in s.runs), name
        rates = [r.rps or 0.0 for r in s.by_round]
        assert (f"| {' / '.join(f'{r:,.0f}' for r in rates)} | **{s.median:,.0f}** "
                f"[{min(rates):,.0f}-{max(rates):,.0f}]") in docs, name
    ceiling = settings["ceiling"].median
    assert round(settings["inst14"].median / ceiling, 2) == 0.52 >= 0.5, "the MiniLM target on this host"
    assert round(settings["b128i7"].median / ceiling, 2) == 0.29 and round(settings["b128d5"].median / ceiling, 2) == 0.24
    assert "**0.52 of the ceiling or more** |" in docs
    budget_ended = sorted(r.round for r in settings["inst14"].by_round
                          if json.loads((FOLDER / "runs" / f"inst14-{r.round}" / "bench.json").read_text())
                          ["models"]["minilm"]["systems"]["bundle"]["sweep"]["stopped"] == "time budget")
    assert budget_ended == [2, 3, 6] and "in rounds 2, 3 and 6 the budget" in docs


def test_every_round_the_bigger_calls_lost() -> None:
    settings = settings_in(FOLDER / "runs")
    inst14 = {r.round: r.rps or 0.0 for r in settings["inst14"].by_round}
    for name in ("b128i7", "b128d5"):
        for run in settings[name].by_round:
            assert (run.rps or 0.0) < 0.75 * inst14[run.round], (name, run.round)


def test_a_call_holds_the_rate_times_the_queue_delay_when_the_cap_is_not_reached() -> None:
    """Calls of the cap-128 settings hold about rate x max_queue_delay rows; the cap-64 ones fill the cap."""
    for name, cap, delay_ms in (("inst14", 64, 2.5), ("b128i7", 128, 2.5), ("b128d5", 128, 5.0)):
        for run in sorted((FOLDER / "runs").glob(f"{name}-*")):
            r = read_run(run)
            assert r.cycle is not None and r.rps is not None
            rows = r.cycle.requests_per_call
            if name == "inst14":
                assert rows >= 0.94 * cap, (run.name, rows)
            else:
                assert 0.85 < rows / (r.rps * delay_ms / 1000) < 1.35 and rows < 0.75 * cap, (run.name, rows)


def test_the_bigger_calls_cost_less_gpu_per_row_in_their_launches() -> None:
    """Round by round (4-6): the launches alone 11.5-15.6 % cheaper per row with ~90-row calls, the GPU's
    busy time per row only -1 to 7 %."""
    alone, busy = [], []
    for r in (4, 5, 6):
        small, big = read_run(FOLDER / "runs" / f"inst14-{r}"), read_run(FOLDER / "runs" / f"b128d5-{r}")
        alone.append(1 - (big.gpu_alone_per_row or 0.0) / (small.gpu_alone_per_row or 1.0))
        busy.append(1 - (big.gpu_busy_per_row or 0.0) / (small.gpu_busy_per_row or 1.0))
    docs = docs_said()
    assert min(alone) > 0.1 and max(busy) < min(alone)
    assert f"{' / '.join(f'{x:.1%}'[:-1] for x in alone)} % less than the 64-row calls of the same rounds" in docs
    assert f"busy time per row the gap was smaller, {' / '.join(f'{x:.1%}'[:-1] for x in busy)} %" in docs


def test_the_settings_are_the_files_the_docs_name() -> None:
    tuned = ROOT / "docs" / "tuning" / "h200-handpicked"
    for name, file, instances, delay, cap in (
            ("inst14", "minilm-tokens-inst14-buckets18.json", 14, 2500, 64),
            ("b128i7", "minilm-tokens-inst7-buckets22-b128.json", 7, 2500, 128),
            ("b128d5", "minilm-tokens-inst14-buckets22-b128-d5.json", 14, 5000, 128)):
        config = json.loads((tuned / file).read_text())["winner"]["config"]
        assert (config["instances"], config["max_queue_delay_us"], max(config["batch_buckets"])) == (instances, delay, cap)
        assert file in docs_said()
        for run in sorted((FOLDER / "runs").glob(f"{name}-*")):
            assert json.loads((run / "bench.json").read_text())["options"]["tuned"] == config, run.name


def test_the_bench_reads_calls_the_delay_sent_as_such() -> None:
    """Each run's knee read again with its own settings: the cap-128 runs' calls are what one queue delay
    brings (the hint says so and why a cap alone makes no bigger calls); the cap-64 runs' full calls are not."""
    from tritonbundle.bench.breakdown import hints
    from tritonbundle.bench.options import BenchOptions
    from tritonbundle.bench.records import Breakdown

    for run in sorted((FOLDER / "runs").glob("[bi]*-*")):
        data = json.loads((run / "bench.json").read_text())
        b = Breakdown.from_json(data["models"]["minilm"]["systems"]["bundle"]["breakdown"])
        options = BenchOptions(out=Path("."), tuned=data["options"]["tuned"])
        said = [h for h in hints(b, options) if h.startswith("the queue delay sends the encoder's calls")]
        assert bool(said) == run.name.startswith("b128"), (run.name, said)
    b = Breakdown.from_json(json.loads((FOLDER / "runs" / "b128d5-4" / "bench.json").read_text())
                            ["models"]["minilm"]["systems"]["bundle"]["breakdown"])
    (said,) = [h for h in hints(b, BenchOptions(out=Path("."), tuned={"max_queue_delay_us": 5000}))
               if "queue delay sends" in h]
    assert "93.5 requests a call of the cap's 128 is what arrives in its 5 ms (85.9)" in said, said
    assert not [h for h in hints(b, BenchOptions(out=Path("."), tuned={"max_queue_delay_us": 2500}))
                if "queue delay sends" in h]  # 43 in 2.5 ms: the calls are not the delay's


def test_the_delay_reading_stays_quiet_where_busy_instances_or_empty_calls_explain_the_calls() -> None:
    """Calls short of the cap while every instance is busy grow while they wait: not the delay's; a cycle
    with no rows counted reads nothing (no division by zero)."""
    from tritonbundle.bench.breakdown import _gathered_in_the_delay
    from tritonbundle.bench.records import InstanceCycle

    idle = InstanceCycle(instances=14, requests_per_call=93.5, batch_cap=128, cycle_ms=76.17, busy_ms=14.75)
    assert _gathered_in_the_delay(idle, 5000) == pytest.approx(85.9, abs=0.1)
    busy = InstanceCycle(instances=8, requests_per_call=40.0, batch_cap=64, cycle_ms=20.0, busy_ms=19.0)
    assert _gathered_in_the_delay(busy, 2500) is None  # 8 x 40 / 20 ms x 2.5 ms = 40, but no instance idles
    assert _gathered_in_the_delay(InstanceCycle(instances=8, requests_per_call=0.0, batch_cap=64, cycle_ms=20.0,
                                                busy_ms=1.0), 2500) is None
