"""Autoscaling from measured capacity: what one replica serves at the SLO (a tune run's winner) turned
into the chart's autoscaling target, and a replay of load steps against the autoscaler's rule.

:func:`autoscaling_values` writes the Helm values (``autoscaling.target: requestsPerSecond`` and the
per-replica target, ``headroom`` times the capacity, so pods are added while each still meets the SLO).
:func:`replay` plays offered load over time against Kubernetes' HPA algorithm as the chart configures it
(autoscaling/v2: desired = ceil(load / target per pod), the scale-up stabilization window taking the lowest
recommendation in it, at most ``pods_per_period`` added per period, new pods serving only after
``ready_s``) and says, second by second, how many pods serve and whether any of them is past its capacity:
the test of a rule before a cluster sees it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tritonbundle.tune.result import TuneResult
from tritonbundle.tune.space import FOLD

#: Each replica's target as a share of its capacity at the SLO: room for the time new pods take.
DEFAULT_HEADROOM = 0.7
#: Seconds from a scale-out decision to a new pod answering: the H200 bench's tritonserver start (102 starts
#: of docs/benchmarks/h200-*: 11.2-29.2 s, median 21.2 s, CUDA graphs captured, weights from disk) plus
#: scheduling and an image already on the node; an engine build or an image pull adds minutes.
DEFAULT_READY_S = 60.0


def capacity_of(tune_result: TuneResult) -> float:
    """Requests/s one replica served at the SLO: the tune run's winner."""
    rate = tune_result.winner.rate if tune_result.winner else None
    if not isinstance(rate, (int, float)) or rate <= 0:
        raise ValueError("the tune run has no winner with a rate at the SLO: nothing to scale on")
    return float(rate)


def counted_model(tune_result: TuneResult) -> str:
    """The model whose requests the chart counts (``autoscaling.models``): the encoder behind a text ensemble
    (one encoder request per user request, and its queue and compute time are the ratio's); the model itself
    for a tensor model, a winner that folds the tokenizer into it (no encoder is called), or a report that
    did not record its encoder (the ensemble's requests are the users' too). The chart's default counted
    minilm_encoder, whatever model was tuned: another model's pods never scaled."""
    winner = tune_result.winner
    folded = bool(winner is not None and winner.config.get(FOLD))
    return tune_result.encoder if tune_result.encoder and not folded else tune_result.model


def autoscaling_values(tune_result: TuneResult, *, headroom: float = DEFAULT_HEADROOM) -> dict[str, Any]:
    """Helm values that scale on requests per second per pod, from a tune run (``tune.json``)."""
    if not 0 < headroom <= 1:
        raise ValueError(f"headroom must be in (0, 1], not {headroom}")
    capacity = capacity_of(tune_result)
    return {"autoscaling": {
        "enabled": True, "target": "requestsPerSecond",
        "requestsPerSecond": max(1, math.floor(capacity * headroom)), "models": counted_model(tune_result),
        "measured": {"model": tune_result.model, "capacityPerReplica": round(capacity, 1),
                     "sloP99Ms": tune_result.slo_p99_ms, "headroom": headroom},
    }}


@dataclass(frozen=True)
class Rule:
    """The chart's HPA as it scales up (values.yaml ``autoscaling``: behavior.scaleUp)."""

    target_per_pod: float
    min_replicas: int = 1
    max_replicas: int = 4
    #: The HPA's sync period.
    period_s: float = 15.0
    stabilization_s: float = 60.0
    pods_per_period: int = 2
    policy_period_s: float = 60.0
    ready_s: float = DEFAULT_READY_S


@dataclass(frozen=True)
class Moment:
    t: float
    offered: float
    serving: int
    desired: int
    #: Offered load per serving pod, and whether it is past one pod's capacity at the SLO.
    per_pod: float
    over: bool


def replay(load: Sequence[tuple[float, float]], rule: Rule, capacity: float, *, until_s: float | None = None,
           step_s: float = 1.0) -> list[Moment]:
    """``load``: (from this second, offered requests/s) steps, in time order. One :class:`Moment` per
    ``step_s``; pods start at ``min_replicas``, all ready."""
    if not load:
        return []
    end = until_s if until_s is not None else load[-1][0] + 600
    serving = rule.min_replicas
    starting: list[float] = []  # ready times of pods being started
    recommendations: list[tuple[float, int]] = []
    added: list[tuple[float, int]] = []
    desired = serving
    moments = []
    next_sync = 0.0
    t = 0.0
    while t <= end:
        offered = next((rate for since, rate in reversed(load) if t >= since), 0.0)
        ready = [r for r in starting if r <= t]
        serving += len(ready)
        starting = [r for r in starting if r > t]
        if t >= next_sync:
            next_sync += rule.period_s
            raw = min(rule.max_replicas, max(rule.min_replicas, math.ceil(offered / rule.target_per_pod)))
            recommendations = [(s, r) for s, r in recommendations if s > t - rule.stabilization_s] + [(t, raw)]
            stable = min(r for _, r in recommendations)  # scale-up: the lowest recommendation in the window
            current = serving + len(starting)
            recent = sum(n for s, n in added if s > t - rule.policy_period_s)
            if stable > current:
                grow = min(stable - current, max(0, rule.pods_per_period - recent))
                if grow:
                    starting += [t + rule.ready_s] * grow
                    added.append((t, grow))
            desired = serving + len(starting)
        per_pod = offered / serving
        moments.append(Moment(t, offered, serving, desired, per_pod, per_pod > capacity))
        t += step_s
    return moments


def summary(moments: Sequence[Moment], rule: Rule) -> dict[str, Any]:
    """When the rule first asked for more pods, when a pod first ran past its capacity, the pods at the end."""
    first_up = next((m.t for m in moments if m.desired > rule.min_replicas), None)
    first_over = next((m.t for m in moments if m.over), None)
    return {"first_scale_out_s": first_up, "first_over_capacity_s": first_over,
            "seconds_over_capacity": sum(1 for m in moments if m.over), "pods_at_end": moments[-1].serving if moments else 0}
