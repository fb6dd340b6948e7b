"""``tritonbundle tune``, the I/O: each candidate configuration is written by the build stage (the
manifest plus overrides, the same code path as ``tritonbundle build``), served and measured
by :class:`tritonbundle.served.ServedRepository` (the bench's bundle phase measures the same way): the
open-model load generator on the traffic sample, the rate search, the one SLO. Results are written after every point, so
an interrupted run keeps what it measured; a configuration that fails to load is recorded and skipped.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tritonbundle import proc
from tritonbundle.build.stage import BuildOptions, build, check, load_manifest
from tritonbundle.errors import ConfigError, TritonBundleError
from tritonbundle.gpu_sharing import sharing_from_env
from tritonbundle.log import LOG, step
from tritonbundle.manifest import ModelSpec
from tritonbundle.measure.host import python_ms
from tritonbundle.measure.latency import Slo
from tritonbundle.measure.levels import Ladder, Sampler, Timing
from tritonbundle.measure.loadgen import LoadError, LoadPool
from tritonbundle.measure.probes import GpuSampler
from tritonbundle.measure.search import MISSED
from tritonbundle.measure.stalls import StallProbe
from tritonbundle.measure.wire import sender
from tritonbundle.served import ServedRepository
from tritonbundle.tune import report
from tritonbundle.tune.options import TuneOptions
from tritonbundle.tune.result import TuneResult, resumed_points
from tritonbundle.tune.search import (
    Point,
    PointDetail,
    Result,
    by_configuration,
    confirm,
    confirmed,
    coordinate_descent,
    run_of,
)
from tritonbundle.tune.space import Config, Space, config_from_json, describe, key, offered, space


class _Clock:
    def __init__(self, budget_s: float) -> None:
        self.deadline = time.monotonic() + budget_s

    def left(self) -> float:
        return self.deadline - time.monotonic()


def run_tune(options: TuneOptions) -> TuneResult:
    clock = _Clock(options.budget_s)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
    options.out.mkdir(parents=True, exist_ok=True)
    work = options.work or Path(tempfile.mkdtemp(prefix="tritonbundle-tune-"))
    base = BuildOptions(manifest=options.manifest, artifacts=options.artifacts, traffic=options.traffic,
                        overrides=dict(options.overrides), models=(options.model,) if options.model else ())
    spec = _spec(base, options.model)
    traffic_path = options.traffic or spec.traffic
    if traffic_path is None:
        if spec.text:
            raise ConfigError(f"model {spec.name}: tuning draws texts from a traffic sample: set 'traffic' or --traffic")
        # A tensor model without one: batch-1 requests at the plan's typical sizes (payloads.for_model).
        from tritonbundle import traffic as traffic_mod

        traffic_path = traffic_mod.dump(traffic_mod.synthetic("fixed", n=100, fixed_tokens=1), work / "traffic.jsonl")
    # Only the knobs this model has are shown and searched (space.offered decides for both).
    fold = can_fold(spec)
    defaults: Config = {k: getattr(spec, k) for k in options.knobs
                        if hasattr(spec, k) and offered(k, text=spec.text, fold=fold)}
    start = {**defaults, **options.start}
    # The settings to beat (--versus): their point's label and configuration, checked before anything runs.
    versus = ((f"the reference ({options.versus.name})", reference_config(options.versus, defaults))
              if options.versus is not None else None)
    result = TuneResult(command="tritonbundle " + " ".join(sys.argv[1:]), model=spec.name, slo_p99_ms=options.slo_ms,
                        budget_s=options.budget_s, manifest=str(options.manifest), overrides=options.overrides,
                        defaults=defaults, start=start, gpu_sharing=sharing_from_env() if spec.target == "gpu" else None,
                        load_sender=sender(), encoder=spec.encoder_name)
    points = result.points
    run_name = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} pid {os.getpid()}"
    # --resume: the earlier run's points join this one's, and each configuration it measured is taken
    # from it (its first measurement) instead of measured again; the descent replays to where it stopped.
    if options.resume is not None:
        points.extend(resumed_points(options.resume, result))
        result.resumed_from = str(options.resume)
    pool = LoadPool(options.load_procs, work / "logs", "tune").start()
    # after the pool (its start may fail), stopped in the search's ``finally`` before it
    gpu = GpuSampler().start() if spec.target == "gpu" else None
    stalls = StallProbe().start()
    samplers = tuple(s for s in (gpu, stalls) if s is not None)

    def save() -> None:
        report.write(result, options.out)

    def measure(label: str, config: Config) -> Point:
        t0 = time.monotonic()
        # A point is measured around the rate it is compared with: its own earlier one when it is
        # measured again (search.confirm), else the best any point sustained (ladder_for).
        own = [p.score for p in points if key(p.config) == key(config) and p.score]
        centre = max(own) if own else max((p.score for p in points), default=0.0)
        point = _measure(label, config, options, base, spec, Path(traffic_path), work, pool, samplers, clock, len(points),
                         centre)
        point.detail["seconds"] = round(time.monotonic() - t0, 1)
        point.detail["run"] = run_name  # search.compare: a resumed run's points are compared within a run
        # The host's speed right after the point (measure/host.py): a point read low on a slow spell says so.
        point.detail["host_python_ms"] = python_ms(repeat=3)[0]
        points.append(point)
        LOG.info("    %s: %s -> %s (host workload %.1f ms)", label, describe(config),
                 f"{point.rate:,.1f} req/s at the SLO" if point.rate else point.detail.get("status", "missed"),
                 point.detail["host_python_ms"])
        save()
        return point

    def measure_nth(label: str, config: Config, n: int = 0) -> Point:
        """The configuration's measurement number ``n`` (0 the first; this run's or one taken over), else a
        new measurement."""
        same = [p for p in points if key(p.config) == key(config)]
        return same[n] if len(same) > n else measure(label, config)

    try:
        step(f"tune {spec.name}: p99 <= {options.slo_ms:g} ms, {options.budget_s:.0f} s")
        if points:
            LOG.info("    %d point(s) taken over from %s", len(points), options.resume)
        first = measure_nth("start", start)
        # The shipped defaults are always measured (second, so an early stop still reports them):
        # the winner must beat them on the same measurement.
        baseline = first if start == defaults else measure_nth("the manifest's defaults", defaults)
        # The settings to beat, measured before the search so that an early stop still reports them.
        reference = measure_nth(*versus) if versus is not None else None
        launch_ms = {_shape(text): float(ms) for text, ms in (first.detail.get("launch_ms_by_shape") or {}).items()}
        searched = space(slo_ms=options.slo_ms, cores=len(proc.usable_cpus()), text=spec.text,
                         gpu=spec.target == "gpu", launch_ms=launch_ms or None, knobs=options.knobs,
                         include=(start, defaults), fold=fold)
        result.space = searched
        # The descent steps from the better of the start and the defaults.
        found = _search(measure_nth, points, max(first, baseline, key=lambda p: p.score).config, searched, clock,
                        reserve_points=2 * (options.repeat - 1), reserve_cap_s=options.budget_s / 3)
        # The winner is where the descent ended, as its median when it was measured more than once.
        measured = by_configuration(points)
        if found.best is not None:
            found.best = _as_measured(found.best, measured)
        baseline = _as_measured(baseline, measured)
        if reference is not None:
            reference = _as_measured(reference, measured)
        # The winner's other finalist: the settings it was asked to beat, else the manifest's defaults.
        # Side by side means on this machine: a finalist's readings taken over (--resume) stay out.
        confirm(measure, found, measured, rounds=options.repeat - 1, versus=reference or baseline,
                weighed=reference is None, can_continue=lambda: _time_for_a_point(points, clock),
                readings=lambda p: [q.score for q in points if key(q.config) == key(p.config) and run_of(q) == run_name])
        result.verdict = report.summary(found, confirmed(found, baseline), searched, confirmed(found, reference))
        result.status = "done"
    except (KeyboardInterrupt, SystemExit):
        result.status = "interrupted"
        raise
    finally:
        if gpu is not None:
            gpu.stop()
        stalls.stop()
        pool.stop()
        save()
        winner = result.winner
        if winner and options.tuned_manifest is not None:
            report.tuned_manifest(options.manifest, spec.name, winner.config, options.tuned_manifest)
        if options.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return result


def _terminate(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _spec(base: BuildOptions, model: str | None) -> ModelSpec:
    """The model to tune: ``model``, else the manifest's first (the load generator sends each model the
    requests of its task: tritonbundle.payloads.for_model)."""
    specs = list(load_manifest(base).models)
    if model is not None:
        named = [s for s in specs if s.name == model]
        if not named:
            raise ConfigError(f"--model {model}: the manifest has {', '.join(s.name for s in specs)}")
        specs = named
    return specs[0]


def can_fold(spec: ModelSpec) -> bool:
    """Whether the model's runtime and task accept ``tokenize_in_encoder`` (a text-embedding model on the
    pytorch runtime, today): only then is it a knob."""
    if not spec.text:
        return False
    try:
        check(dataclasses.replace(spec, tokenize_in_encoder=True))
    except ConfigError:
        return False
    return True


def _search(measure: Callable[[str, Config, int], Point], points: list[Point], start: Config, searched: Space,
            clock: _Clock, *, reserve_points: int = 0, reserve_cap_s: float = 0.0) -> Result:
    """The descent from ``start`` (``measure`` reuses what ``points`` already hold, its tie-breaks
    included), leaving time for ``reserve_points`` more points after it (the finalists'
    re-measurements), ``reserve_cap_s`` at most."""
    return coordinate_descent(lambda label, config: measure(label, config, 0), start, searched, again=measure,
                              can_continue=lambda: _time_for_a_point(points, clock, reserve_points, reserve_cap_s))


def _time_for_a_point(points: list[Point], clock: _Clock, reserve_points: int = 0, reserve_cap_s: float = 0.0) -> bool:
    """Time for another point like the ones so far (a point cut short says nothing), keeping time for
    ``reserve_points`` more (``reserve_cap_s`` at most) after it."""
    durations = [float(p.detail.get("seconds", 0.0)) for p in points]
    mean = sum(durations) / max(1, len(durations))
    return clock.left() > max(15.0, 0.8 * mean) + min(reserve_points * mean, reserve_cap_s)


def _measure(label: str, config: Config, options: TuneOptions, base: BuildOptions, spec: ModelSpec, traffic_path: Path,
             work: Path, pool: LoadPool, samplers: Sequence[Sampler], clock: _Clock, index: int, centre: float) -> Point:
    folder = work / f"point-{index}"
    detail: PointDetail = {"status": "ok"}
    try:
        build(dataclasses.replace(base, repository=folder / "model_repository", overrides={**base.overrides, **config}))
    except TritonBundleError as e:
        return Point(label, config, None, {"status": f"build failed: {e}"})
    slo = Slo(p99_ms=options.slo_ms, max_failure_ratio=options.max_failure_ratio)
    timing = Timing.for_window(options.window_s, options.slo_ms)
    with ServedRepository(folder / "model_repository", folder, extra_args=options.extra_server_args) as served:
        try:
            detail["startup_s"] = round(served.start(timeout_s=min(300.0, max(20.0, clock.left() - 10))), 1)
            detail["launch_ms_by_shape"] = served.launch_ms()
            engines = launches_at_once(spec.target, int(config.get("instances", spec.instances)))
            estimate = capacity_estimate(detail["launch_ms_by_shape"], engines, options.slo_ms)
            if estimate:
                detail["capacity_estimate_rps"] = round(estimate, 1)
            ladder = ladder_for(options, centre, estimate)
            served.connect(pool, model=spec.name, traffic=traffic_path, seed=index,
                           timeout_s=max(1.0, 20 * options.slo_ms / 1000), ready_timeout_s=60)
            # Unmeasured traffic first: the first requests after a start pay for lazy initialisation
            # (sessions, shapes, stubs), which would otherwise land in the first level's p99.
            pool.step(ladder.start, warmup_s=max(1.0, options.window_s / 2), window_s=0.5, grace_s=1.0, seed=index)
            sweep = served.measure(system=label, slo=slo, timing=timing, samplers=samplers, seed=index * 1000,
                                   deadline=clock.deadline - 5.0, ladder=ladder)
        except (TritonBundleError, LoadError) as e:
            detail["status"] = f"failed: {(str(e).splitlines() or [type(e).__name__])[0]}"
            return Point(label, config, None, detail)
    best = sweep.best
    detail.update({"sweep": sweep.to_json(), "stopped": sweep.stopped})
    if best is not None:
        cores = best.extra.get("cpu_cores") or {}
        detail.update({"p50_ms": best.p50_ms, "p99_ms": best.p99_ms, "cpu_cores_by_process": cores,
                       "server_cores": round(sum(v for k, v in cores.items() if k.startswith("server:")), 2),
                       "gpu_util_mean": best.extra.get("gpu_util_mean"), "triton": best.extra.get("triton")})
    elif centre and sweep.steps and sweep.stopped == MISSED:
        lowest = min(step.offered_rps for step in sweep.steps)
        detail["status"] = (f"no rate met the SLO down to {lowest:,.1f} req/s, {lowest / centre:.2f} of the rate it "
                            f"was compared with ({centre:,.1f}): not searched lower")
    else:
        detail["status"] = f"no rate met the SLO ({sweep.stopped})"
    return Point(label, config, sweep.best_rps, detail)


#: A point compared with a known rate starts its ladder this far under it.
CENTRE_START = 0.7


def ladder_for(options: TuneOptions, centre: float, estimate: float | None) -> Ladder:
    """One point's rate search. The first point (``centre`` 0) climbs from ``--start-rate``, or from an
    eighth of the engine's own estimate (:func:`capacity_estimate`), by ``--rate-factor``. A later point is
    compared with ``centre`` (the best rate so far, or its own earlier measurement): it starts at
    :data:`CENTRE_START` of it and climbs by the square root of the factor, so its bisections end within
    2**(1/8) = 9 % (x2, two bisections) instead of 19 %, in about as many levels (five for a point near
    the best, where climbing from a quarter of it took six): two points the descent must tell apart by
    3 % are less often left in one step of the ladder (on the H200, 2026-12-03: the defaults passed
    5,861 and failed 6,970 req/s). A point that misses down to a quarter of ``centre`` is not searched
    lower (``search_rate``'s three steps down)."""
    if centre <= 0:
        start = max(options.start_rate, estimate / 8) if estimate else options.start_rate
        return Ladder(start=start, factor=options.rate_factor, refine=options.refine, max_rate=options.max_rate)
    return Ladder(start=max(options.start_rate, CENTRE_START * centre), factor=math.sqrt(options.rate_factor),
                  refine=options.refine, max_rate=options.max_rate)


def launches_at_once(target: str, instances: int) -> int:
    """How many of the encoder's launches run at once: each instance's on CPU, one on the one GPU."""
    return 1 if target == "gpu" else instances


def capacity_estimate(launch_ms: dict[str, float] | None, engines: int, slo_ms: float) -> float | None:
    """Rows per second the encoder could run from its own launch timings ("<batch>x<length>" -> ms): per
    padded length, the best rows/ms of a batch whose launch fits in half the SLO, averaged over lengths,
    times ``engines``, the launches that run at once: the instances on CPU, 1 on a GPU, which the
    instances share (on the H200, eight folded instances times their launches made 157,481 req/s; the
    first level, an eighth of it, failed 61 % of its requests and the point read 4,074 req/s where the
    bench reads 8,190-10,201: docs/tuning.md). An upper bound (no tokenizer, no queueing): the ladder
    starts at an eighth of it."""
    if not launch_ms:
        return None
    best: dict[int, float] = {}
    for shape, ms in launch_ms.items():
        batch, length = _shape(shape)
        if 0 < ms <= slo_ms / 2:
            best[length] = max(best.get(length, 0.0), batch / ms * 1000.0)
    return engines * sum(best.values()) / len(best) if best else None


def _shape(text: str) -> tuple[int, int]:
    batch, _, length = text.partition("x")
    return int(batch), int(length)


def _as_measured(point: Point, measured: list[Point]) -> Point:
    """``point``'s configuration as :func:`.search.by_configuration` gave it (its median when measured
    more than once)."""
    return next(p for p in measured if key(p.config) == key(point.config))


def reference_config(path: Path, defaults: Config) -> Config:
    """``tune --versus``: the settings in ``path`` (:func:`winner_overrides`) over the manifest's defaults,
    refused when they set a knob this model's tune does not offer (the comparison would not be the one asked)."""
    settings = winner_overrides(path)
    foreign = sorted(set(settings) - set(defaults))
    if foreign:
        raise ConfigError(f"--versus {path}: {', '.join(foreign)} not among this model's knobs "
                          f"({', '.join(defaults)})")
    return {**defaults, **settings}


def winner_overrides(path: Path) -> dict[str, Any]:
    """The winning configuration of a tune run (``tune.json``), to apply as manifest overrides. Only
    ``winner.config`` is read: a settings file written by hand (``{"winner": {"config": {...}}}``, as
    docs/tuning/h200-handpicked/ holds) is one too."""
    try:
        winner = json.loads(path.read_text()).get("winner")
    except (OSError, ValueError, AttributeError) as e:
        raise ConfigError(f"{path}: not a readable tune result ({e}): give a tune.json or a settings file "
                          "holding {\"winner\": {\"config\": {...}}}") from e
    if not winner:
        raise ConfigError(f"{path}: the tune run found no configuration that met the SLO")
    if not isinstance(winner.get("config"), dict):
        raise ConfigError(f"{path}: the winner has no config (expected {{\"winner\": {{\"config\": {{...}}}}}})")
    return config_from_json(winner["config"])
