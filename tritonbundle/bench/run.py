"""``tritonbundle bench gpu``: the systems, one GPU, the same traffic, measured in turn.

For each model (all-MiniLM-L6-v2 with its real weights, a BERT-base-sized encoder with random
weights): the build stage writes the repository, then each system runs inside its share of
``--budget-s`` (:mod:`.naive`, :mod:`.bundle`, :mod:`.ceiling`). Naive and bundle get the same
open-model rate search (:func:`tritonbundle.measure.search.search_rate`) on the same request stream.
A phase that fails is recorded as failed and the run goes on; all processes are stopped at the end,
whatever happened; results are written after every phase.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tritonbundle import proc
from tritonbundle import traffic as traffic_mod
from tritonbundle.bench import repeats, report
from tritonbundle.bench.answers import references
from tritonbundle.bench.bundle import run_bundle
from tritonbundle.bench.ceiling import run_ceiling
from tritonbundle.bench.naive import run_naive
from tritonbundle.bench.options import BenchOptions, Clock
from tritonbundle.bench.peer import run_peer
from tritonbundle.bench.phase import Context
from tritonbundle.bench.records import Failure, SystemResult
from tritonbundle.bench.result import BenchResult, BuildResult, ModelResult
from tritonbundle.bench.workspace import Built, build_repository, prepare_process_env, tokenizer_file
from tritonbundle.files import write_json
from tritonbundle.log import LOG, step
from tritonbundle.measure import probes
from tritonbundle.measure.host import HostWatch
from tritonbundle.measure.stalls import StallProbe
from tritonbundle.recipes import BENCH_MODELS, Recipe

PHASES: dict[str, Callable[[Context, Built, Recipe, float], SystemResult]] = {
    "naive": run_naive, "peer": run_peer, "bundle": run_bundle, "ceiling": run_ceiling,
}


def run_bench(options: BenchOptions) -> BenchResult:
    clock = Clock(options.budget_s)
    prepare_process_env()
    if threading.current_thread() is threading.main_thread():
        # SIGTERM (a timeout, the device tool) ends the run through the finally blocks: servers stopped,
        # report written.
        signal.signal(signal.SIGTERM, _terminate)
    options.out.mkdir(parents=True, exist_ok=True)
    work = options.work or Path(tempfile.mkdtemp(prefix="tritonbundle-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    result = BenchResult(command="tritonbundle " + " ".join(sys.argv[1:]), options=_options_json(options),
                         environment=probes.environment(options.device))
    watch = HostWatch()

    def save() -> None:
        """After every phase: what is known so far survives a run cut short."""
        result.elapsed_s = round(clock.elapsed(), 1)
        write_json(result.to_json(), options.out / "bench.json")
        with contextlib.suppress(Exception):
            (options.out / "bench.md").write_text(report.markdown(result))

    gpu = probes.GpuSampler().start() if options.device == "cuda" else None
    if gpu is not None:
        result.environment["gpu_sampler"] = gpu.source
    stalls = StallProbe().start()  # after HostWatch's capacity reading: it would take a little of it
    try:
        step("traffic")
        if options.traffic:
            sample = traffic_mod.load(options.traffic)
        else:
            sample = traffic_mod.synthetic("chat", n=10_000, seed=options.seed)
        traffic_path = traffic_mod.dump(sample, work / "traffic.jsonl")
        result.traffic = {"source": sample.source, **sample.clipped(512).summary()}
        ctx = Context(options, clock, work, logs, traffic_path, sample, tokenizer_file(), gpu, save, stalls)
        save()
        for index, key in enumerate(options.models):
            model_deadline = time.monotonic() + max(10.0, (clock.left() - 15.0) / (len(options.models) - index))
            recipe = BENCH_MODELS[key]
            entry = ModelResult(recipe.description, recipe.name, recipe.random_weights)
            result.models[recipe.model_name] = entry
            run_model(ctx, recipe, model_deadline, entry)
            save()
        result.status = "done"
    except Exception as e:  # noqa: BLE001 - still write what was measured
        result.status = "failed"
        result.error = Failure.of(e)
    finally:
        if gpu is not None:
            gpu.stop()
        stalls.stop()
        if stalls.error:  # the report says the probe did not run, rather than look like one from before it
            result.environment["stall_probe_error"] = stalls.error
        if result.status == "running":  # SIGTERM or Ctrl-C: what was measured is still written
            result.status = "interrupted"
        result.environment["host_speed"] = watch.finish().to_json()
        result.elapsed_s = round(clock.elapsed(), 1)
        try:
            report.write_all(result, options.out, work)
        finally:
            if not options.keep_work and options.work is None:
                shutil.rmtree(work, ignore_errors=True)
    return result


def run_model(ctx: Context, recipe: Recipe, model_deadline: float, entry: ModelResult) -> None:
    """One model, recorded into ``entry`` as it goes: build its repository, then each system within
    its share of the model's time."""
    options = ctx.options
    step(f"{recipe.model_name}: build the repository ({options.target}, pytorch, {options.precision})")
    try:
        t0 = time.monotonic()
        built = build_repository(recipe, options, ctx.work, ctx.traffic_path, ctx.tokenizer)
        if {"naive", "peer", "bundle"} & set(options.systems):
            references(ctx, built)  # the FP32 answers both servers are checked against
        entry.build = BuildResult(
            "ok", seconds=round(time.monotonic() - t0, 1), repository=str(built.repository),
            padding_targets=list(built.plan.padding_targets), batch_buckets=[b.max for b in built.plan.batch_buckets],
            plan_computed_per_useful=built.plan.waste.bucketed if built.plan.waste else None,
        )
    except Exception as e:  # noqa: BLE001 - recorded; the other model still runs
        entry.build = BuildResult("failed", failure=Failure.of(e))
        for system in options.systems:
            entry.systems[system] = SystemResult(status="failed", error="the repository could not be built")
        return
    ctx.save()
    # Rounds: every system once per round, in turn; each phase gets its share of the model's time.
    phases = [(r, system) for r in range(options.repeat) for system in options.systems]
    rounds: list[dict[str, SystemResult]] = [{} for _ in range(options.repeat)]
    for position, (r, system) in enumerate(phases):
        left_share = sum(options.shares[s] for _, s in phases[position:])
        phase_s = max(5.0, (model_deadline - time.monotonic()) * options.shares[system] / left_share)
        phase_deadline = min(time.monotonic() + phase_s, ctx.clock.deadline - 5.0)
        label = system if options.repeat == 1 else f"{system} (round {r + 1} of {options.repeat})"
        step(f"{recipe.model_name}: {label} ({phase_s:.0f} s)")
        rounds[r][system] = _phase(ctx, built, recipe, system, phase_deadline)
        entry.systems[system] = repeats.combine(system, [done[system] for done in rounds if system in done])
        ctx.save()
    if options.repeat > 1:
        entry.rounds = [{system: repeats.counted_rps(system, record) for system, record in done.items()} for done in rounds]
    entry.ratios = repeats.ratios(rounds, entry.systems.get("bundle"), ceiling_target=recipe.ceiling_target)


def _phase(ctx: Context, built: Built, recipe: Recipe, system: str, phase_deadline: float) -> SystemResult:
    if time.monotonic() + 5.0 > phase_deadline:
        return SystemResult(status="skipped", error="out of time budget")
    t0, started = time.monotonic(), time.time()
    try:
        record = PHASES[system](ctx, built, recipe, phase_deadline)
    except Exception as e:  # noqa: BLE001 - recorded as failed; the run goes on
        LOG.warning("    %s %s failed: %s", recipe.model_name, system, e)
        _show_server_logs(ctx.logs, started)
        record = SystemResult.failed(Failure.of(e))
    return dataclasses.replace(record, seconds=round(time.monotonic() - t0, 1))


#: Lines of a failed phase's server log shown on the console: enough for the stacks a stalled model
#: logs (runtimes/pytorch/model.py, LANE_REPORT_S) and a crash's last words.
FAILED_LOG_LINES = 120


def _show_server_logs(logs: Path, since: float) -> None:
    """The end of each server log written since ``since``, on the console: the console and the report
    travel back from a GPU machine where ``logs.tar.gz`` may not (a failed phase on the H200 left only
    "Deadline Exceeded" to read)."""
    for path in sorted(logs.glob("tritonserver-*.log")):
        if path.stat().st_mtime >= since:
            LOG.warning("    the end of %s:\n%s", path.name, proc.tail(path, FAILED_LOG_LINES))


def _terminate(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _options_json(options: BenchOptions) -> dict[str, Any]:
    data = dataclasses.asdict(options)
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in data.items()}
