"""The open-model rate search: the highest throughput whose p99 meets the SLO."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tritonbundle.measure.latency import Slo, StepResult, judge

#: Why a rate search ended when its time ran out: its best rate is a floor of the knee, not the knee.
TIME_BUDGET = "time budget"
#: Why a search ended when the level above its best was client-bound (the load generators fell behind):
#: that level measured the clients, not the system, so the best rate is a floor too.
CLIENT_BOUND = "client-bound"
#: Why a search ended when not even its lowest rate met the SLO.
MISSED = "missed at the lowest rate"
#: Why a search ended when its ladder reached ``max_rate`` with every level passing (a floor).
MAX_RATE = "max rate"


@dataclass
class Sweep:
    steps: list[StepResult]
    best: StepResult | None
    #: Why the search ended ("bracketed", "max rate", "time budget", "missed at the lowest rate"...).
    stopped: str

    @property
    def best_rps(self) -> float | None:
        return self.best.achieved_rps if self.best is not None else None

    @property
    def is_floor(self) -> bool:
        """Whether the best rate is only a floor of the knee: no level above it missed (the search ended
        at ``max_rate`` or on its time budget before one did), or only client-bound ones did."""
        return self.best is not None and not any(
            not s.passed and not s.extra.get("client_bound_only") and s.offered_rps > self.best.offered_rps
            for s in self.steps)

    def to_json(self) -> dict[str, Any]:
        return {"steps": [s.to_json() for s in self.steps], "best": self.best.to_json() if self.best else None,
                "best_rps": self.best_rps, "stopped": self.stopped}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Sweep:
        """A sweep as :meth:`to_json` wrote it (``best_rps`` follows from ``best``)."""
        best = data.get("best")
        return cls([StepResult.from_json(s) for s in data.get("steps", [])],
                   StepResult.from_json(best) if best else None, str(data.get("stopped", "")))


def search_rate(
    measure: Callable[[float], StepResult], *, slo: Slo, start: float, factor: float = 4.0,
    refine: int = 3, max_rate: float = math.inf, can_continue: Callable[[], bool] | None = None, max_down: int = 3,
) -> Sweep:
    """Highest throughput that meets ``slo``: a geometric ladder up from ``start`` (x ``factor``)
    until a level fails (when the first one fails: down by ``factor``, at most ``max_down`` times,
    until one passes), then ``refine`` bisections (geometric midpoints) between the last level that
    passed and the first that failed; ``max_rate`` is the last rung. At most
    ``log(max/start)/log(factor) + 2 + refine`` levels.
    ``can_continue()`` is asked before every level (the time budget). A level whose only problem was
    its load generators falling behind (``extra["client_bound_only"]``, :func:`.latency.judge`) measured
    the clients: it ends the climb, and no bisection is made against it (:data:`CLIENT_BOUND`: the best
    rate is a floor).
    """
    if start <= 0 or factor <= 1:
        raise ValueError("start must be > 0 and factor > 1")
    steps: list[StepResult] = []
    ok = can_continue or (lambda: True)

    def run(rate: float) -> StepResult:
        step = judge(measure(rate), slo)
        steps.append(step)
        return step

    lo: float | None = None
    hi: float | None = None
    rate = start
    stopped = MAX_RATE
    while rate <= max_rate * (1 + 1e-9):
        if not ok():
            stopped = TIME_BUDGET
            break
        step = run(rate)
        if step.passed:
            lo = rate
            # The cap itself is the ladder's last rung when the next would pass it: a cap between two
            # rungs otherwise leaves the knee up to ``factor`` x above the best rate, unmeasured.
            rate = max_rate if rate * (1 + 1e-9) < max_rate < rate * factor else rate * factor
        else:
            hi = None if step.extra.get("client_bound_only") else rate
            if lo is None:
                # Missed at the start: step down (bounded) until a level passes, then refine above it.
                for _ in range(max_down):
                    if not ok():
                        stopped = TIME_BUDGET
                        break
                    rate /= factor
                    step = run(rate)
                    if step.passed:
                        lo = rate
                        break
                    hi = hi if step.extra.get("client_bound_only") else rate
            if stopped != TIME_BUDGET or lo is not None:
                stopped = "bracketed" if lo is not None and hi is not None else CLIENT_BOUND if hi is None else MISSED
            break
    if lo is not None and hi is not None:
        for _ in range(refine):
            if not ok():
                stopped = TIME_BUDGET
                break
            mid = math.sqrt(lo * hi)
            step = run(mid)
            if step.passed:
                lo = mid
            elif step.extra.get("client_bound_only"):  # the clients, not the system: no bound on the knee
                stopped = CLIENT_BOUND
                break
            else:
                hi = mid
    passing = [s for s in steps if s.passed]
    best = max(passing, key=lambda s: s.achieved_rps) if passing else None
    return Sweep(steps, best, stopped)
