"""``bench gpu --repeat N``: every system measured once per round, in turn, and the model's figures
are the medians with their range. The phases here are stand-ins that return what a phase records
(the real ones are measured by tests/bench/test_bench_smoke.py and on the GPU machine)."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tritonbundle.bench import report, run
from tritonbundle.bench.options import BenchOptions, Clock
from tritonbundle.bench.phase import Context
from tritonbundle.bench.records import SystemResult
from tritonbundle.bench.result import BenchResult, ModelResult
from tritonbundle.recipes import BENCH_MODELS
from tritonbundle.traffic import synthetic


def test_rounds_interleave_the_systems_and_report_medians(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    measured: list[str] = []
    figures = {"peer": iter([900.0, 700.0, 1000.0]), "bundle": iter([7000.0, 8200.0, 6500.0]),
               "ceiling": iter([20000.0, 21000.0, 19000.0])}

    def phase(system: str) -> Any:
        def measure(ctx: Context, built: Any, recipe: Any, deadline: float) -> SystemResult:
            measured.append(system)
            assert deadline > time.monotonic()
            rps = next(figures[system])
            if system == "bundle" and len(measured) == 5:
                raise RuntimeError("tritonserver exited with code -11")  # round 2's bundle fails
            return SystemResult(status="ok", best_rps=rps, computed_per_useful=1.1)
        return measure

    monkeypatch.setattr(run, "PHASES", {s: phase(s) for s in ("peer", "bundle", "ceiling")})
    plan = SimpleNamespace(padding_targets=(32,), batch_buckets=(), waste=None)
    monkeypatch.setattr(run, "build_repository", lambda *a: SimpleNamespace(plan=plan, repository=tmp_path))
    monkeypatch.setattr(run, "references", lambda *a: None)
    options = BenchOptions(out=tmp_path, systems=("peer", "bundle", "ceiling"), repeat=3, budget_s=600)
    ctx = Context(options, Clock(600), tmp_path, tmp_path, tmp_path / "t.jsonl", synthetic("chat", n=10),
                  tmp_path / "tok.json", None, lambda: None)
    recipe = BENCH_MODELS["bert-base"]
    entry = ModelResult(recipe.description, recipe.name, recipe.random_weights)
    run.run_model(ctx, recipe, time.monotonic() + 500, entry)

    assert measured == ["peer", "bundle", "ceiling"] * 3
    bundle = entry.systems["bundle"]
    # Round 2's crash counts as 0 (a bundle that died served nothing at the SLO): the median is round 3's.
    assert bundle.status == "ok" and bundle.best_rps == 6500.0
    assert bundle.repeats is not None and bundle.repeats.failed == 1 and bundle.repeats.values == [7000.0, 0.0, 6500.0]
    assert entry.systems["peer"].best_rps == 900.0
    assert entry.rounds is not None and entry.rounds[1] == {"peer": 700.0, "bundle": 0.0, "ceiling": 21000.0}
    ratios = entry.ratios
    assert ratios is not None and ratios.rounds == 3
    # Each ratio pairs the systems of one round: 7000/900, 0/700 and 6500/1000.
    assert ratios.bundle_over_peer == pytest.approx(6500 / 1000)
    assert ratios.ranges is not None
    assert ratios.ranges["bundle_over_ceiling"] == pytest.approx([0.0, 7000 / 20000])
    result = BenchResult(command="", options={"slo_ms": 50}, environment={}, models={"bert-base": entry})
    lines = report.ratio_lines(result)
    assert "medians of 3 rounds" in lines[0] and "bundle/peer = 6.50 [0.00-7.78]" in lines[0]
    table = report.console_table(result)
    assert "0-7,000 (3 runs, 1 failed, spread 108 %)" in table


def test_a_failed_phase_shows_the_end_of_the_server_log_it_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """The console travels back from the GPU machine where the logs may not: a failed phase prints the
    end of the server log written during it (a stalled lane's stacks included), not an older one's."""
    old = tmp_path / "tritonserver-old.log"
    old.write_text("from an earlier phase\n")
    import os

    os.utime(old, (time.time() - 3600, time.time() - 3600))

    def bundle(ctx: Context, built: Any, recipe: Any, deadline: float) -> SystemResult:
        lines = [f"line {i}" for i in range(run.FAILED_LOG_LINES + 40)] + ["bert_base: no lane has come back in 30 s; threads:"]
        (ctx.logs / "tritonserver-bert_base.log").write_text("\n".join(lines) + "\n")
        raise RuntimeError("model 'bert_base' over grpc: Deadline Exceeded")

    monkeypatch.setattr(run, "PHASES", {"bundle": bundle})
    options = BenchOptions(out=tmp_path, systems=("bundle",), budget_s=600)
    ctx = Context(options, Clock(600), tmp_path, tmp_path, tmp_path / "t.jsonl", synthetic("chat", n=10),
                  tmp_path / "tok.json", None, lambda: None)
    with caplog.at_level("WARNING", logger="tritonbundle"):
        record = run._phase(ctx, None, BENCH_MODELS["bert-base"], "bundle", time.monotonic() + 60)  # type: ignore[arg-type]
    assert record.status == "failed" and "Deadline Exceeded" in (record.error or "")
    shown = caplog.text
    first = 41  # FAILED_LOG_LINES + 41 lines written: the last FAILED_LOG_LINES are shown
    assert "no lane has come back" in shown and f"line {run.FAILED_LOG_LINES + 39}" in shown and f"line {first}\n" in shown
    assert f"line {first - 1}\n" not in shown and "from an earlier phase" not in shown


def test_the_ceiling_target_is_the_models() -> None:
    """The issue's bars: bundle/ceiling >= 0.75 for BERT-base, >= 0.5 for MiniLM; 0.6 meets only MiniLM's."""
    from tritonbundle.bench import repeats
    from tritonbundle.bench.result import Ratios

    def rounds_at(share: float) -> list[dict[str, SystemResult]]:
        return [{"bundle": SystemResult(status="ok", best_rps=600.0 * share / 0.6),
                 "ceiling": SystemResult(status="ok", best_rps=1000.0)}]

    for key, met in (("bert-base", False), ("minilm", True)):
        recipe = BENCH_MODELS[key]
        ratios = repeats.ratios(rounds_at(0.6), None, ceiling_target=recipe.ceiling_target)
        label = f"bundle_over_ceiling >= {recipe.ceiling_target:g}"
        assert ratios.targets[label] is met, (key, ratios.targets)
        entry = ModelResult(recipe.description, recipe.name, recipe.random_weights, ratios=ratios)
        lines = report.ratio_lines(BenchResult(command="", options={}, environment={}, models={key: entry}))
        assert f"bundle/ceiling = 0.60 (target >= {recipe.ceiling_target:g})" in lines[0]
        assert Ratios.from_json(ratios.to_json()).ceiling_target == recipe.ceiling_target


def test_first_answers_that_never_come_fail_the_phase_in_its_time_with_the_stubs_stacks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On the H200 a folded model with two lanes never answered its first request: the 60 s deadline
    outlived the phase and the run was killed from outside before it wrote anything. The first answers'
    deadline is now bounded by the phase, and the stubs write their stacks before the phase fails. (The
    client is a stand-in that times out; the stacks' writing is tested on the real server in
    tests/measure/test_served.py.)"""
    import tritonbundle.clients
    from tritonbundle.bench import bundle
    from tritonbundle.clients import DeadlineExceededError
    from tritonbundle.errors import ServerError

    deadlines: list[float] = []

    class Silent:
        def __init__(self, url: str, *, model: str, timeout_s: float) -> None:
            deadlines.append(timeout_s)

        def __enter__(self) -> Silent:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def embed(self, texts: list[str]) -> Any:
            raise DeadlineExceededError("model 'bert_base' over grpc: Deadline Exceeded")

    asked: list[str] = []
    served = SimpleNamespace(grpc_url="127.0.0.1:1", write_stacks=lambda: asked.append("stacks") or
                             "7 Python stub(s) wrote every thread's stack to tritonserver-bert_base.log")
    monkeypatch.setattr(tritonbundle.clients, "GrpcClient", Silent)
    for left_s, bound in ((12.0, 30.0), (45.0, 35.0), (600.0, bundle.FIRST_ANSWER_S)):
        with pytest.raises(ServerError) as failed:
            bundle.first_answers(served, "bert_base", ["a"], None, time.monotonic() + left_s)  # type: ignore[arg-type]
        assert deadlines[-1] == pytest.approx(bound, abs=0.5), (left_s, deadlines)
        assert "Deadline Exceeded" in str(failed.value) and "wrote every thread's stack" in str(failed.value)
    assert asked == ["stacks"] * 3
