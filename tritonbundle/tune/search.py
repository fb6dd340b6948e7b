"""Coordinate descent over the tuner's knobs: from a start, try each knob's neighbouring values, move
to the best, knob after knob, until a full round improves nothing or the budget runs out. Every
measured point is kept (the report shows them all), and a point is never measured twice."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tritonbundle.tune.space import Config, Space, describe, key


@dataclass
class Point:
    """One configuration and what it did: its rate at the SLO (None: failed to load or to pass), and
    ``detail``, what its measurement observed (:mod:`.result` says why that stays a dict)."""

    label: str
    config: Config
    rate: float | None
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def score(self) -> float:
        return self.rate or 0.0

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "config": self.config, "rate": self.rate, "detail": self.detail}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Point:
        return cls(data["label"], dict(data["config"]), data.get("rate"), dict(data.get("detail") or {}))


@dataclass
class Result:
    points: list[Point]
    best: Point | None
    #: Accepted moves: (knob, from, to, rate before, rate after).
    moves: list[tuple[str, Any, Any, float, float]]
    stopped: str


def coordinate_descent(
    measure: Callable[[str, Config], Point], start: Config, space: Space, *, can_continue: Callable[[], bool],
    min_gain: float = 0.03, rounds: int = 3,
) -> Result:
    """``measure(label, config)`` returns the point; a move needs ``min_gain`` (relative) to count, so
    noise does not walk the search around."""
    points: list[Point] = []
    seen: dict[Any, Point] = {}

    def visit(label: str, config: Config) -> Point:
        k = key(config)
        if k not in seen:
            seen[k] = measure(label, dict(config))
            points.append(seen[k])
        return seen[k]

    current = visit("start", start)
    moves: list[tuple[str, Any, Any, float, float]] = []
    stopped = "converged"
    for round_ in range(rounds):
        improved = False
        for knob in space.knobs:
            for value in knob.neighbours(current.config.get(knob.name)):
                if not can_continue():
                    return Result(points, _best(points), moves, "time budget")
                candidate = visit(f"round {round_ + 1}: {describe({knob.name: value})}", {**current.config, knob.name: value})
                if candidate.score > current.score * (1 + min_gain):
                    moves.append((knob.name, current.config.get(knob.name), value, current.score, candidate.score))
                    current = candidate
                    improved = True
        if not improved:
            break
    else:
        stopped = f"{rounds} rounds"
    return Result(points, _best(points), moves, stopped)


def _best(points: list[Point]) -> Point | None:
    passing = [p for p in points if p.rate]
    return max(passing, key=lambda p: p.score) if passing else None


def reason(result: Result, baseline: Point | None) -> str:
    """Why the winner won, in plain words, from the moves the search made."""
    best = result.best
    if best is None:
        return "no configuration met the SLO at any rate tried"
    lines = [f"the winner ({describe(best.config)}) sustains {best.score:,.1f} req/s within the SLO"]
    if baseline is best:
        lines.append("it is the manifest's own setting")
    elif baseline is not None and baseline.score:
        gain = (best.score / baseline.score - 1) * 100
        lines.append(f"the manifest's settings sustain {baseline.score:,.1f} req/s: the winner is "
                     f"{'+' if gain >= 0 else ''}{gain:.0f}% on the same measurement")
    elif baseline is not None:
        lines.append("the manifest's settings met the SLO at no rate tried")
    for knob, old, new, before, after in result.moves:
        lines.append(f"{knob} {old} -> {new}: {before:,.1f} -> {after:,.1f} req/s")
    tried = [p for p in result.points if p.label != "start"]
    if not result.moves:
        if tried:
            lines.append(f"none of the {len(tried)} other configuration(s) measured beat it by more than the noise "
                         "margin (3 %)")
        else:
            lines.append(f"nothing was compared: only {len(result.points)} configuration was measured before the "
                         f"search stopped ({result.stopped}); give it a larger --budget-s")
    return "; ".join(lines)
