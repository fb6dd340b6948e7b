"""What every measured system of the bench shares: the run's context and its rate search (the levels
themselves are :mod:`tritonbundle.measure.levels`, the same as ``tune``'s)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tritonbundle import traffic as traffic_mod
from tritonbundle.bench.options import BenchOptions, Clock, expected_steps, step_timing
from tritonbundle.errors import TritonBundleError
from tritonbundle.log import LOG
from tritonbundle.measure.latency import Slo
from tritonbundle.measure.levels import Ladder, Probes, Sampler, measure_rates
from tritonbundle.measure.loadgen import LoadPool
from tritonbundle.measure.probes import GpuSampler
from tritonbundle.measure.search import MAX_RATE, TIME_BUDGET, Sweep
from tritonbundle.measure.stalls import StallProbe


@dataclass
class Context:
    options: BenchOptions
    clock: Clock
    work: Path
    logs: Path
    traffic_path: Path
    sample: traffic_mod.TrafficSample
    tokenizer: Path
    gpu: GpuSampler | None
    save: Callable[[], None]
    stalls: StallProbe | None = None
    #: model name -> (texts, FP32 reference embeddings)
    references: dict[str, tuple[list[str], Any]] = field(default_factory=dict)

    @property
    def samplers(self) -> tuple[Sampler, ...]:
        """What every level records over its window: the GPU's use (on a GPU) and the host's stalls."""
        return tuple(s for s in (self.gpu, self.stalls) if s is not None)

    @property
    def slo(self) -> Slo:
        """The benchmark's objective: p99 within ``--slo-p99-ms``, at most 1 % of requests failed."""
        return Slo(p99_ms=self.options.slo_ms, max_failure_ratio=self.options.max_failure_ratio)


def sweep(ctx: Context, pool: LoadPool, phase_deadline: float, system: str, probes: Probes) -> Sweep:
    """Rate search on one system within its phase: levels sized to the time the phase has left
    (:func:`.options.step_timing`), the ladder and SLO of ``--start-rate``/``--slo-p99-ms``."""
    o = ctx.options
    timing = step_timing(o, phase_deadline - time.monotonic(), expected_steps(o, system))
    LOG.info("    %s: levels of %.1f s (+%.1f s warm-up), p99 SLO %g ms", system, timing.window_s, timing.warmup_s,
             o.slo_ms)
    ladder = Ladder(start=o.start_rate(system), factor=o.ladder_factor, refine=o.refine, max_rate=o.max_rate)
    left_s = phase_deadline - time.monotonic()
    result = measure_rates(pool, system=system, slo=ctx.slo, timing=timing, ladder=ladder, probes=probes,
                           deadline=phase_deadline, seed=o.seed * 100, samplers=ctx.samplers)
    if not result.steps:  # a phase that measured nothing has no rate to report: it failed, and says why
        if result.stopped == TIME_BUDGET:
            why = (f"{max(0.0, left_s):.0f} s of the phase were left after the system started, and one level takes "
                   f"{timing.cost_s:.1f} s; give the run more --budget-s")
        elif result.stopped == MAX_RATE:
            why = f"the first rate, {ladder.start:g} req/s, is above --max-rate {ladder.max_rate:g}"
        else:
            why = f"the search stopped: {result.stopped}"
        raise NoRate(f"{system}: no load level was measured: {why}", result)
    if result.best is None:  # levels measured, none met the SLO: no rate to report, and the phase failed
        lowest = min(result.steps, key=lambda s: s.offered_rps)
        raise NoRate(f"{system}: no rate met the SLO ({result.stopped}); the lowest level, "
                     f"{lowest.offered_rps:,.0f} req/s: {lowest.reason}", result)
    return result


class NoRate(TritonBundleError):
    """The phase found no rate: it measured no load level (its time ran out during start-up, or the
    ladder had no rate to try), or none met the SLO; ``sweep`` is the search, for a system that still
    reports what it measured."""

    def __init__(self, message: str, sweep: Sweep) -> None:
        super().__init__(message)
        self.sweep = sweep
