"""The benchmark's report (tables, ratios last, plot) from a synthetic result; its options and the CLI."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tritonbundle.bench import options as bench_options
from tritonbundle.bench import report, workspace
from tritonbundle.bench.records import (
    AnswersCheck,
    Breakdown,
    BundleResult,
    Failure,
    InstanceCycle,
    NaiveResult,
    Restart,
    SystemResult,
)
from tritonbundle.bench.repeats import combine, ratios
from tritonbundle.bench.result import BenchResult, BuildResult, ModelResult
from tritonbundle.files import write_json
from tritonbundle.measure import latency as st
from tritonbundle.measure.latency import Slo
from tritonbundle.measure.search import Sweep


def _sweep(rates: list[float], limit: float) -> Sweep:
    steps = []
    for r in rates:
        s = st.judge(st.step_result(r, 1.0, [10.0 if r <= limit else 80.0] * max(1, int(r)), 0), Slo(p99_ms=50))
        s.extra = {"gpu_util_mean": 40.0}
        steps.append(s)
    best = max((s for s in steps if s.passed), key=lambda s: s.achieved_rps)
    return Sweep(steps, best, "bracketed")


def _result() -> BenchResult:
    check = AnswersCheck(texts=8, min_cosine=0.9999)
    entry = ModelResult("d", "minilm", random_weights=False, build=BuildResult(
        "ok", padding_targets=[32, 512], batch_buckets=[1, 8], plan_computed_per_useful=1.1))
    entry.systems = {
        "naive": NaiveResult(status="ok", sweep=_sweep([50, 200, 800], 300), best_rps=200.0, load_processes=1,
                             correctness=check, protocol="http", precision="fp32", padding="none"),
        "bundle": BundleResult(
            status="ok", sweep=_sweep([50, 200, 800, 3200], 3000), best_rps=800.0, load_processes=1, startup_s=2.0,
            correctness=check, protocol="grpc", precision="fp16", encoder_instances=[], padding={},
            computed_per_useful=1.2, seq_padded_per_useful=None,
            breakdown=Breakdown(at_offered_rps=800, achieved_rps=800, client_mean_ms=5.0, client_p99_ms=9.0,
                                client_lag_mean_ms=None, ensemble_request_ms=None, hints=["a reading"],
                                encoder_cycle=InstanceCycle(instances=8, requests_per_call=61.13, batch_cap=64,
                                                            cycle_ms=14.61, busy_ms=12.06, staging_ms=1.21,
                                                            responding_ms=1.75),
                                encoder_execute_ms={"read": 0.63, "execute": 8.5}),
            went_down=[Restart(offered_rps=25600.0, why="Signal (11) received.", restart_s=27.3)]),
        "ceiling": SystemResult.failed(Failure("RuntimeError: boom")),
    }
    entry.ratios = ratios([entry.systems], entry.systems["bundle"])
    return BenchResult(command="tritonbundle bench gpu", options={"slo_ms": 50, "device": "cuda"},
                       environment={"date": "2026-01-01", "gpu": {"name": "G"}}, models={"minilm": entry}, status="done",
                       traffic={"source": "s", "requests": 10})


def test_ratios_and_targets() -> None:
    r = _result().models["minilm"].ratios
    assert r is not None
    assert r.bundle_over_naive == pytest.approx(4.0)
    assert r.bundle_over_ceiling is None  # the ceiling failed: no ratio, not a crash
    assert r.targets["bundle_over_naive >= 8"] is False
    assert r.targets["computed_per_useful <= 1.15"] is False


def test_repeated_rounds_report_the_median_and_its_spread() -> None:
    def run(rps: float | None) -> SystemResult:
        # seconds tags each round's own record
        return SystemResult(status="ok", best_rps=rps, seconds=rps) if rps else SystemResult(status="failed", error="x")

    rounds = [{"bundle": run(7000.0), "peer": run(900.0)}, {"bundle": run(6000.0), "peer": run(500.0)},
              {"bundle": run(8000.0), "peer": run(None)}]
    bundle = combine("bundle", [r["bundle"] for r in rounds])
    assert bundle.best_rps == 7000.0 and bundle.seconds == 7000.0  # the median round's own record
    assert bundle.repeats is not None and bundle.repeats.min == 6000.0 and bundle.repeats.max == 8000.0
    assert bundle.repeats.spread_pct == pytest.approx(2000 / 7000 * 100)
    peer = combine("peer", [r["peer"] for r in rounds])
    assert peer.repeats is not None and peer.repeats.failed == 1 and peer.best_rps == 700.0  # median of the two that ran
    r = ratios(rounds, bundle)
    # Ratios pair the systems of one round: 7000/900 and 6000/500; round 3's peer failed.
    assert r.bundle_over_peer == pytest.approx((7000 / 900 + 6000 / 500) / 2)
    assert r.ranges is not None and r.ranges["bundle_over_peer"] == pytest.approx([7000 / 900, 12.0])
    assert r.targets["bundle_over_peer >= 10"] is False
    assert combine("bundle", [rounds[0]["bundle"]]) is rounds[0]["bundle"]  # one round: unchanged


def test_a_failed_bundle_round_counts_as_zero_and_a_failed_reference_round_is_left_out() -> None:
    """A bundle that crashed or met the SLO at no rate served nothing at it: its round pulls the median and the
    ratios down. A reference that failed says nothing about the bundle: its round is left out of both."""
    failed = SystemResult(status="failed", error="tritonserver died")
    no_rate = SystemResult(status="ok", best_rps=None)
    rounds = [{"bundle": SystemResult(status="ok", best_rps=9000.0), "ceiling": SystemResult(status="ok", best_rps=10000.0)},
              {"bundle": failed, "ceiling": SystemResult(status="ok", best_rps=10000.0)},
              {"bundle": no_rate, "ceiling": failed}]
    bundle = combine("bundle", [r["bundle"] for r in rounds])
    # The median is a failure: the record is a failed round's, its status saying so; its repeats the rates.
    assert bundle.status == "failed" and bundle.error == "tritonserver died" and bundle.repeats is not None
    assert bundle.repeats.median == 0.0 and bundle.repeats.values == [9000.0, 0.0, 0.0] and bundle.repeats.failed == 2
    ceiling = combine("ceiling", [r["ceiling"] for r in rounds])
    assert ceiling.best_rps == 10000.0 and ceiling.repeats is not None and ceiling.repeats.values == [10000.0, 10000.0, None]
    r = ratios(rounds, bundle)
    assert r.bundle_over_ceiling == pytest.approx(0.45) and r.ranges is not None  # 0.9 and 0; round 3 has no ceiling
    assert r.ranges["bundle_over_ceiling"] == pytest.approx([0.0, 0.9])
    skipped = combine("bundle", [SystemResult(status="skipped", error="out of time budget")] * 2).repeats
    assert skipped is not None and skipped.values == [None, None] and skipped.failed == 0
    # Otherwise the record is the round nearest the median, with the median's rate.
    five = [SystemResult(status="ok", best_rps=rate, seconds=rate) for rate in (800.0, 1000.0, 1200.0)] + [failed, failed]
    nearest = combine("bundle", five)
    assert nearest.best_rps == 800.0 and nearest.seconds == 800.0 and nearest.repeats is not None
    assert nearest.repeats.failed == 2


def test_report_files_and_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = _result()
    work = tmp_path / "work"
    (work / "logs").mkdir(parents=True)
    (work / "logs" / "x.log").write_text("hello")
    (work / "big.safetensors").write_bytes(b"0" * 100)
    files = report.write_all(result, tmp_path / "out", work)
    assert sorted(p.name for p in files) == ["bench.json", "bench.md", "bench.png", "logs.tar.gz"]
    data = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert data["models"]["minilm"]["systems"]["ceiling"]["status"] == "failed"
    assert BenchResult.from_json(data).to_json() == data  # restarts, breakdown and failure read back whole
    md = (tmp_path / "out" / "bench.md").read_text()
    assert "| minilm | bundle | 800.0 |" in md and "failed: RuntimeError: boom" in md and "reading: a reading" in md
    assert "tritonserver went down at 25,600 req/s offered (Signal (11) received.); restarted in 27.3 s" in md
    assert ("- encoder instances: 8, each taking a call every 14.61 ms (Triton's time for a call out of the queue: "
            "12.06 ms, the stub's execute() 8.50 of it, staging 1.21 and responses 1.75); 61.1 requests per call, the cap 64: at most 35,044 req/s at this cycle") in md
    import tarfile

    with tarfile.open(tmp_path / "out" / "logs.tar.gz") as tar:
        assert tar.getnames() == ["logs/x.log"]  # logs yes, weights no
    report.print_summary(result)
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("minilm: bundle/naive = 4.00") and "bundle/ceiling = -" in out[-1]


def test_json_has_no_infinities(tmp_path: Path) -> None:
    step = st.step_result(10, 1.0, [], failed=10)
    text = write_json(step.to_json(), tmp_path / "step.json").read_text()
    assert "Infinity" not in text and '"inf"' in text


def test_bench_help_is_quick_and_imports_no_torch() -> None:
    code = ("import sys; from tritonbundle.cli import main\ntry: main(['bench', 'gpu', '--help'])\nexcept SystemExit: pass\n"
            "print(sorted(m for m in ('torch', 'transformers', 'tritonclient') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "--budget-s" in out and out.strip().endswith("[]")


def test_options_are_checked() -> None:
    from tritonbundle.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown model"):
        bench_options.BenchOptions(out=Path("x"), models=("gpt",))
    with pytest.raises(ConfigError, match="budget"):
        bench_options.BenchOptions(out=Path("x"), budget_s=5)


def test_step_timing_scales_with_the_time_left() -> None:
    o = bench_options.BenchOptions(out=Path("x"))
    assert bench_options.step_timing(o, 200, 8).window_s == 5.0  # plenty of time: 5 s windows
    assert bench_options.step_timing(o, 20, 8).window_s == 1.0  # little: the shortest window
    assert bench_options.client_timeout_s(o) == 1.0


def test_the_manifest_the_bench_builds_is_valid(tmp_path: Path) -> None:
    from tritonbundle import manifest

    o = bench_options.BenchOptions(out=tmp_path, device="cuda")
    from tritonbundle.recipes import BENCH_MODELS

    raw = workspace.manifest_for(BENCH_MODELS["bert-base"], o, tmp_path / "t.jsonl", tmp_path / "tok.json")
    spec = manifest.from_dict(raw, path=tmp_path / "m.yaml").models[0]
    assert (spec.runtime, spec.target, spec.precision, spec.sequence_buckets) == ("pytorch", "gpu", "fp16", 16)
    assert spec.recipe == "bert-base-random" and spec.outputs[0].dims == (768,)


def test_the_plan_with_16_buckets_meets_the_padding_target_on_the_chat_sample() -> None:
    from tritonbundle import plan as planner
    from tritonbundle import traffic
    from tritonbundle.bench.accounting import padding_accounting

    rows = traffic.synthetic("chat", n=10_000, seed=0).clipped(512).row_lengths()
    edges = planner.choose_edges(rows, 16, 512)
    assert padding_accounting(rows, edges)["computed_per_useful"] <= 1.15
    edges4 = planner.choose_edges(rows, 4, 512)
    assert padding_accounting(rows, edges4)["computed_per_useful"] > 1.4


def test_a_stub_role_is_saturated_per_instance_not_in_sum() -> None:
    """The H200 run's 4 tokenizer instances used 2.86 cores together (72 % each): not one saturated stub."""
    from tritonbundle.bench.breakdown import hints

    options = bench_options.BenchOptions(out=Path("."))
    four = _cores({"server:stub[t]": 2.86}, {"server:stub[t]": 4})
    assert not [h for h in hints(four, options) if "stub[t]" in h]
    busy = _cores({"server:stub[t]": 3.7}, {"server:stub[t]": 4})
    assert any("4 instances used 3.70 cores, 92% of one core each" in h for h in hints(busy, options))
    one = _cores({"server:stub[e]": 0.95}, None)  # a record without process counts: one process
    assert any("stub[e]: used 95% of one core" in h for h in hints(one, options))


def _cores(cores: dict[str, float], processes: dict[str, int] | None) -> Breakdown:
    return Breakdown(at_offered_rps=1.0, achieved_rps=1.0, client_mean_ms=1.0, client_p99_ms=1.0,
                     client_lag_mean_ms=None, ensemble_request_ms=None, cpu_cores=cores, cpu_processes=processes)


def test_the_tokenizer_calls_and_the_time_around_them_are_read() -> None:
    """The H200's texts-in knee (2026-12-02): Triton counted 2.35 ms of tokenizer compute per request at
    3.9 texts per call. The tokenizer model's own counters split its execute(); the rest is the Python
    backend's work around the call, and the reading says so when it outweighs the call."""
    from tritonbundle.bench.breakdown import breakdown
    from tritonbundle.recipes import BENCH_MODELS
    from tritonbundle.runtimes.stats import new_stats, observe

    tok = new_stats("tokenizer")
    # 1000 calls of 3.9 requests, 1 ms each: Triton counts each request its call's time, as the model's
    # t_execute_by_request_s does (3.9 s), so 1.35 of Triton's 2.35 ms per request lie around the call.
    tok.update(executes=1000, requests=3900, texts=3900, t_read_s=0.3, t_tokenize_s=0.5, t_respond_s=0.2, t_execute_s=1.0,
               t_execute_by_request_s=3.9)
    for ms in [0.9] * 980 + [6.0] * 20:  # 2 % of the calls take 6 ms: the p99 is in the (5, 7.5] bucket
        observe(tok, "execute_ms", ms)
    recipe = BENCH_MODELS["minilm"]
    views = {f"{recipe.model_name}_tokenizer": {"queue_ms_per_request": 0.35, "compute_ms_per_request": 2.35,
                                                "request_ms_per_request": 2.8, "avg_batch_size": 3.9, "executions": 1000}}
    step = st.step_result(6000, 5.0, [10.0] * 100, 0, extra={"triton": views, "tokenizer": tok})
    b = breakdown(recipe, step, bench_options.BenchOptions(out=Path(".")))
    assert b.tokenizer_execute_ms == pytest.approx({"read": 0.3, "tokenize": 0.5, "respond": 0.2, "execute": 1.0})
    assert b.tokenizer_texts_per_execute == 3.9
    assert b.tokenizer_call_ms == {"execute_ms": {"p50": 1.0, "p99": 7.5}}
    assert b.tokenizer_outside_ms == pytest.approx(1.35)
    assert any("Triton counts 1.35 ms per tokenizer request around its execute() (a call takes 1.00)" in h
               for h in b.hints)
    without = breakdown(recipe, st.step_result(6000, 5.0, [10.0] * 100, 0, extra={"triton": views}),
                        bench_options.BenchOptions(out=Path(".")))
    assert without.tokenizer_execute_ms is None and "tokenizer_execute_ms" not in without.to_json()


def test_instances_whose_calls_are_full_and_busy_are_read_as_the_limit() -> None:
    """MiniLM's knee on the H200 (h200-buckets/minilm-fine-1): 1,229 calls of 61.1 requests in 2.245 s from
    8 folded instances, 12.06 ms of Triton's time per call out of the queue: each instance took a call every
    14.6 ms and was busy 83 % of it, its calls 96 % of the cap of 64. BERT-base's knee (bert-base-fine-1):
    calls as full, instances busy 55 %: the GPU's, not the instances', limit."""
    from tritonbundle.bench.breakdown import breakdown
    from tritonbundle.recipes import BENCH_MODELS

    recipe, options = BENCH_MODELS["minilm"], bench_options.BenchOptions(out=Path("."))
    name = recipe.model_name  # folded: no tokenizer model, the text model encodes

    def level(executions: int, per_call: float, request_ms: float, queue_ms: float, wall_s: float,
              stubs: int | None) -> st.StepResult:
        view = {"executions": executions, "avg_batch_size": per_call, "request_ms_per_request": request_ms,
                "queue_ms_per_request": queue_ms, "compute_ms_per_request": request_ms - queue_ms}
        extra = {"triton": {name: view}, "step_wall_s": wall_s,
                 "cpu_processes": {f"server:stub[{name}]": stubs} if stubs else {}}
        return st.step_result(34787, 1.6, [14.0] * 100, 0, extra=extra)

    minilm = breakdown(recipe, level(1229, 61.13, 14.64, 2.58, 2.245, 8), options, {name: 64})
    c = minilm.encoder_cycle
    assert c is not None and c.instances == 8 and c.batch_cap == 64
    assert c.cycle_ms == pytest.approx(14.61, abs=0.01) and c.busy_ms == pytest.approx(12.06)
    assert c.fill == pytest.approx(0.955, abs=0.001) and c.busy_share == pytest.approx(0.825, abs=0.001)
    assert c.bound_rps == pytest.approx(35036, abs=2)
    assert any("calls are full (61.1 requests of its batch cap of 64) and each of its 8 instances is busy 83% of its "
               "14.6-ms cycle" in h and "at most ~35,036 req/s" in h for h in minilm.hints), minilm.hints
    assert Breakdown.from_json(minilm.to_json()) == minilm
    bert = breakdown(recipe, level(373, 63.66, 20.65, 2.05, 1.578, 8), options, {name: 64})
    assert bert.encoder_cycle is not None and bert.encoder_cycle.busy_share == pytest.approx(0.55, abs=0.005)
    assert not [h for h in bert.hints if "calls are full" in h]
    uncapped = breakdown(recipe, level(1229, 61.13, 14.64, 2.58, 2.245, 8), options)
    assert uncapped.encoder_cycle is not None and uncapped.encoder_cycle.fill is None
    assert not [h for h in uncapped.hints if "calls are full" in h]
    no_stubs = breakdown(recipe, level(1229, 61.13, 14.64, 2.58, 2.245, None), options, {name: 64})
    assert no_stubs.encoder_cycle is None and "encoder_cycle" not in no_stubs.to_json()


@pytest.mark.parametrize("alone_s, reading", [
    (1.80, "the GPU is 95 % busy and its 0.0642 ms per row is what the launches cost alone (0.0608): the launch mix"),
    (1.30, "the GPU is 95 % busy, 0.0642 ms per row, where the same launches take 0.0439 alone: 32% of its time is "
           "the instances sharing it"),
])
def test_the_gpus_time_per_row_is_read_against_what_the_launches_take_alone(tmp_path: Path, alone_s: float,
                                                                            reading: str) -> None:
    """A level like the fifth H100's BERT-base knee (texts-3: 14,786 answered/s, GPU 95 % busy): 29,600 rows
    sent in 2 s (warm-up and window) is 0.0642 ms of busy GPU per row. Launches that take 1.80 s alone are all of it; 1.30 s leaves a
    third to the instances sharing the GPU. A report from before the engine counted it reads as it did."""
    from tritonbundle.bench.breakdown import breakdown
    from tritonbundle.recipes import BENCH_MODELS
    from tritonbundle.runtimes.stats import new_stats

    recipe, options = BENCH_MODELS["bert-base"], bench_options.BenchOptions(out=Path("."))

    def level(util: float, **counters: float) -> st.StepResult:
        enc = {**new_stats(), "executes": 470, "requests": 29600, "rows": 29600, **counters}
        # The rows were sent over the 2.0 s of warm-up and window; the level's wall, 2.9 s, adds the
        # grace for late answers and the generators' set-up, when the GPU is idle.
        return st.step_result(15000, 1.6, [30.0] * 100, 0, extra={"encoder": enc, "gpu_util_mean": util,
                                                                   "sending_s": 2.0, "step_wall_s": 2.9})

    b = breakdown(recipe, level(95.0, gpu_alone_s=alone_s), options)
    assert b.gpu_busy_ms_per_row == pytest.approx(0.06419, abs=1e-5)
    assert b.gpu_alone_ms_per_row == pytest.approx(1000 * alone_s / 29600)
    assert [h for h in b.hints if h.startswith("the GPU is 95 % busy")] == [next(h for h in b.hints if reading in h)]
    assert Breakdown.from_json(b.to_json()) == b
    result = _result()
    bundle = result.models["minilm"].systems["bundle"]
    assert isinstance(bundle, BundleResult) and bundle.breakdown is not None
    result.models["minilm"].systems["bundle"] = dataclasses.replace(bundle, breakdown=b)
    assert "; busy 0.0642 ms per row, the same launches alone 0.0" in report.markdown(result)
    idle = breakdown(recipe, level(40.0, gpu_alone_s=alone_s), options)
    assert not [h for h in idle.hints if "ms per row" in h]  # a GPU 40 % busy holds nothing
    old = breakdown(recipe, level(95.0, gpu_alone_s=0.0), options)
    assert old.gpu_alone_ms_per_row is None and "gpu_alone_ms_per_row" not in old.to_json()
    assert not [h for h in old.hints if "ms per row" in h]


def test_the_report_says_how_each_instance_timed_its_launch_costs_and_how_far_they_disagree(tmp_path: Path) -> None:
    def instance(name: str, ms: float, **timing: object) -> dict[str, object]:
        return {"instance": name, "device": "cuda:0", "precision": "fp16", "cuda_graphs": True, "graphs": 2,
                "prepare_s": 6.0, "graph_error": "", "timings_ms": {"1x32": 0.7, "64x512": ms}, **timing}

    result = _result()
    bundle = result.models["minilm"].systems["bundle"]
    assert isinstance(bundle, BundleResult)
    result.models["minilm"].systems["bundle"] = dataclasses.replace(bundle, encoder_instances=[
        instance("e_0", 21.2, shape_timing="alone", timing_wait_s=0.0, timing_turn_held=True),
        instance("e_1", 21.6, shape_timing="alone", timing_wait_s=3.14, timing_turn_held=False),
        instance("e_2", 42.4, shape_timing="concurrent", timing_wait_s=0.0, timing_turn_held=False),
        instance("e_3", 21.3, shape_timing="alone", timing_wait_s=0.0, timing_turn_held=True),
        instance("e_4", 90.0),  # a report from before the timing was recorded
        instance("e_5", 21.3, shape_timing="alone", timing_wait_s=0.0, timing_turn_held=False,
                 timing_turn_error="/tmp/tritonbundle-gpu-G.lock: Permission denied"),
        instance("e_6", 21.2, shape_timing="alone", timing_wait_s=2.5, timing_turn_held=True, timings_shared=True),
    ])
    report.write_all(result, tmp_path / "out", tmp_path)
    md = (tmp_path / "out" / "bench.md").read_text()
    assert "e_0: cuda:0, fp16, CUDA graphs True (2 captured in 6.0 s); launch costs timed alone after 0.0 s waiting\n" in md
    assert "e_1: cuda:0, fp16, CUDA graphs True (2 captured in 6.0 s); launch costs timed alone after 3.1 s waiting, " \
           "the turn timed out\n" in md
    assert "e_2: cuda:0, fp16, CUDA graphs True (2 captured in 6.0 s); launch costs timed concurrently (mean of replays)" in md
    assert "e_4: cuda:0, fp16, CUDA graphs True (2 captured in 6.0 s)\n" in md
    assert "e_5: cuda:0, fp16, CUDA graphs True (2 captured in 6.0 s); launch costs timed without the GPU's turn " \
           "(/tmp/tritonbundle-gpu-G.lock: Permission denied)" in md
    assert "e_6: cuda:0, fp16, CUDA graphs True (2 captured in 6.0 s); launch costs another instance timed alone, " \
           "read after 2.5 s waiting\n" in md
    assert "launch costs:" not in md  # not every instance said how it timed (an old report): as it was
    bundle = result.models["minilm"].systems["bundle"]
    assert isinstance(bundle, BundleResult) and bundle.encoder_instances
    result.models["minilm"].systems["bundle"] = dataclasses.replace(bundle, encoder_instances=bundle.encoder_instances[:4])
    report.write_all(result, tmp_path / "out", tmp_path)
    md = (tmp_path / "out" / "bench.md").read_text()
    assert "launch costs: 64x512 took 21.20-42.40 ms by the 4 instances' timings (spread 100 %)" in md


def test_a_level_past_the_knee_that_missed_on_a_full_queue_says_so() -> None:
    """The H200's MiniLM runs of the tenth session: in 10 of 16 the first level past the knee missed on
    requests Triton refused for a full queue (1.5-6.9 % of them), which the latency table alone shows only
    as p99 inf; where under 1 % were refused, the p99 of the answered ones decided."""
    docs = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"

    def markdown_of(run: str) -> str:
        return report.markdown(BenchResult.from_json(json.loads((docs / run / "bench.json").read_text())))

    queue = markdown_of("h200-buckets/minilm-fine-1")
    assert ("- bundle at 36,596 req/s offered: 3,357 of 60,291 (5.6 %): 3,357 WireError: UNAVAILABLE: Exceeds "
            "maximum queue size\n") in queue
    assert "bundle: the first level past its rate at the SLO (36,596 req/s) missed on refusals: the server " \
           "refused 5.6 % of its requests for a full queue" in queue
    latency = markdown_of("h200-buckets/minilm-fine-2")
    assert "- bundle at 29,880 req/s offered: 997 of 55,364 (1.8 %)" in latency
    assert "the first level past its rate" not in latency  # 28,404 missed on its p99 (59.0 ms), nothing refused
    few = markdown_of("h200-sender/minilm-wire-2")
    assert "- bundle at 29,880 req/s offered: 217 of 54,978 (0.4 %)" in few  # 0.4 % refused, p99 59.5 ms: latency decided
    assert "the first level past its rate" not in few


@pytest.mark.parametrize("bound", [2048, 4096])
def test_a_settings_file_sets_the_queue_bound_the_model_is_served_with(tmp_path: Path, bound: int) -> None:
    """The MiniLM queue-bound settings (docs/benchmarks.md, "the peer in the same call"): the auto bound
    is 2 x 64 rows x 8 instances = 1,024; the files raise it for the A/B the next device session runs."""
    from tritonbundle import manifest
    from tritonbundle.recipes import BENCH_MODELS
    from tritonbundle.runtimes.base import queue_size
    from tritonbundle.tune.run import winner_overrides

    handpicked = Path(__file__).resolve().parents[2] / "docs" / "tuning" / "h200-handpicked"
    for name, expected in (("minilm-fused8-t4-buckets18.json", 1024), (f"minilm-fused8-t4-buckets18-q{bound}.json", bound)):
        o = bench_options.BenchOptions(out=tmp_path, device="cuda", tuned=winner_overrides(handpicked / name))
        raw = workspace.manifest_for(BENCH_MODELS["minilm"], o, tmp_path / "t.jsonl", tmp_path / "tok.json")
        spec = manifest.from_dict(raw, path=tmp_path / "m.yaml").models[0]
        assert queue_size(spec, spec.instances) == expected


@pytest.mark.parametrize(("name", "instances", "cap", "lanes"), [("minilm-fused12-t4-buckets18.json", 12, 64, 1),
                                                                 ("minilm-fused8-t4-buckets22-b128.json", 8, 128, 1),
                                                                 ("minilm-fused8-lanes2-t4-buckets18.json", 8, 64, 2)])
def test_the_settings_for_minilms_instances_ab_serve_more_fuller_or_overlapped_calls(
        tmp_path: Path, name: str, instances: int, cap: int, lanes: int) -> None:
    """docs/benchmarks.md ("MiniLM's knee is its eight instances' calls"): the next device calls set more
    instances, a larger batch cap, or two batches in flight per instance, against the hand-picked 8 x 64,
    all else the same."""
    from tritonbundle import manifest
    from tritonbundle.recipes import BENCH_MODELS
    from tritonbundle.tune.run import winner_overrides

    handpicked = Path(__file__).resolve().parents[2] / "docs" / "tuning" / "h200-handpicked"
    specs = {}
    for file in ("minilm-fused8-t4-buckets18.json", name):
        o = bench_options.BenchOptions(out=tmp_path, device="cuda", tuned=winner_overrides(handpicked / file))
        raw = workspace.manifest_for(BENCH_MODELS["minilm"], o, tmp_path / "t.jsonl", tmp_path / "tok.json")
        specs[file] = manifest.from_dict(raw, path=tmp_path / "m.yaml").models[0]
    base, other = specs["minilm-fused8-t4-buckets18.json"], specs[name]
    assert (base.instances, base.max_batch_size) == (8, 64) and (other.instances, other.max_batch_size) == (instances, cap)
    assert (base.batches_in_flight, other.batches_in_flight) == (1, lanes)
    assert other.batch_buckets[: len(base.batch_buckets)] == base.batch_buckets
    assert (other.max_queue_delay_us, other.tokenize_in_encoder) == (base.max_queue_delay_us, base.tokenize_in_encoder)


def test_with_batches_in_flight_the_instances_line_says_the_stubs_execute_outlives_the_call() -> None:
    """Two batches in flight: a lane answers after Triton's call has ended, so the stub's execute() is
    longer than the call (the H100's lanes2 runs: 21.2 ms against 5.6) and is not part of it."""
    result = _result()
    bundle = result.models["minilm"].systems["bundle"]
    assert isinstance(bundle, BundleResult) and bundle.breakdown is not None
    lanes = dataclasses.replace(bundle, breakdown=dataclasses.replace(
        bundle.breakdown, encoder_cycle=InstanceCycle(instances=8, requests_per_call=48.3, batch_cap=64, cycle_ms=22.83,
                                                      busy_ms=5.61, staging_ms=0.80, responding_ms=0.02),
        encoder_execute_ms={"read": 0.77, "execute": 21.17}))
    result.models["minilm"].systems["bundle"] = lanes
    assert ("(Triton's time for a call out of the queue: 5.61 ms, the stub's execute() 21.17, past it: batches in "
            "flight, staging 0.80 and responses 0.02)") in report.markdown(result)


def test_the_per_call_line_names_each_phase_a_call_ran_and_skips_those_none_did() -> None:
    """The encoder's histograms per execute() phase (runtimes/stats.py PHASES): a phase no call ran
    (tokenize, with token rows in) is left out rather than printed as '- / -'."""
    from tritonbundle.bench.breakdown import call_quantiles
    from tritonbundle.runtimes.stats import new_stats, observe

    stats = new_stats()
    for ms in (4.0, 4.5, 40.0):
        observe(stats, "execute_ms", ms)
        observe(stats, "read_ms", 0.4)
        observe(stats, "launch_ms", ms - 3.0)
    result = _result()
    bundle = result.models["minilm"].systems["bundle"]
    assert isinstance(bundle, BundleResult) and bundle.breakdown is not None
    calls = call_quantiles(stats)
    result.models["minilm"].systems["bundle"] = dataclasses.replace(
        bundle, breakdown=dataclasses.replace(bundle.breakdown, encoder_call_ms=calls))
    line = next(x for x in report.markdown(result).splitlines() if x.startswith("- encoder per call"))
    assert "execute 5 / 50" in line and "read 0.5 / 0.5" in line and "launch 2 / 50" in line, line
    assert "tokenize" not in line and "gpu" not in line and "- / -" not in line, line


def test_levels_the_host_stalled_are_marked_and_counted_either_side_of_the_knee() -> None:
    """The H100 A/B of the 27th session: the same settings' knee moved from 8,479 to 14,806 req/s between
    rounds while p50 barely moved; a level's record says whether a bystander process was stalled in it."""
    result = _result()
    bundle = result.models["minilm"].systems["bundle"]
    assert isinstance(bundle, BundleResult) and bundle.sweep is not None
    quiet = {"host_stalls": 1, "host_long_stalls": 0, "host_stall_max_ms": 2.4, "host_stalled_ms": 2.4, "host_probe_s": 4.0}
    for step in bundle.sweep.steps:  # 50, 200 and 800 passed, 3200 missed (best 800)
        step.extra.update(quiet)
    bundle.sweep.steps[1].extra.update(host_stalls=9, host_long_stalls=4, host_stall_max_ms=11.6)
    bundle.sweep.steps[3].extra.update(host_stalls=30, host_long_stalls=12, host_stall_max_ms=38.2)
    md = report.markdown(result)
    assert "| 200 | 10.0 / 10.0; 200.0 | - | 10.0 / 10.0; 200.0; host 4x, 12 ms |" in md
    assert "| 3200 | - | - | 80.0 / 80.0; 3200.0 (missed); host 12x, 38 ms |" in md
    assert "| 50 | 10.0 / 10.0; 50.0 | - | 10.0 / 10.0; 50.0 |" in md  # stalls under 5 ms are not marked
    assert ("- bundle: 1 of the 3 passing levels up to its rate at the SLO (the longest 12 ms); 1 of the 1 missed "
            "levels past it (the longest 38 ms)") in md
    # the knee's level counts among the passing ones whatever its answered rate (here below the offered)
    bundle.sweep.steps[2].achieved_rps = 799.0  # the knee, offered 800
    assert "1 of the 3 passing levels" in report.markdown(result)
    assert "- naive:" not in md.split("Host stalls")[1]  # the probe did not watch naive's levels: no line
    assert "the host-stall probe did not run" not in md
    result.environment["stall_probe_error"] = "ModuleNotFoundError: No module named 'tritonbundle'"
    assert "- the host-stall probe did not run: ModuleNotFoundError: No module named 'tritonbundle'\n" in \
        report.markdown(result)
    # the kernel's CPU pressure beside it: a missed level whose tasks waited for cores is this machine's
    # own crowding; marked from 5 %, and its range given either side of the knee
    for step, wait in zip(bundle.sweep.steps, (0.004, 0.01, 0.03, 0.41)):
        step.extra["host_cpu_wait"] = wait
    md = report.markdown(result)
    assert "| 3200 | - | - | 80.0 / 80.0; 3200.0 (missed); host 12x, 38 ms; CPU wait 41 % |" in md
    assert "| 800 | 80.0 / 80.0; 800.0 (missed) | - | 10.0 / 10.0; 799.0 |" in md  # 3 %: not marked
    assert ("(the longest 12 ms), CPU wait 0-3 % of the time; 1 of the 1 missed levels past it (the longest 38 ms), "
            "CPU wait 41-41 % of the time") in md
