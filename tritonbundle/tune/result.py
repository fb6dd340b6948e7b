"""A tune run's record, written as ``tune.json`` after every point and read back by ``bench --tuned``
(:func:`tritonbundle.tune.run.winner_overrides`) and the autoscaling tools (:mod:`.capacity`).

:class:`TuneResult` is the run (what was asked, every point, how it ended) and :class:`Verdict` the
search's conclusion (the winner, the manifest's defaults, the moves and why). ``to_json()`` writes the
keys and their order as they have always been, ``from_json()`` reads a written report back.

Left as dicts, on purpose: a configuration (:data:`.space.Config`, manifest keys to values, as the build
stage takes them as overrides) and the run's ``overrides``. Each point's ``detail`` (what its
measurement observed: status, start-up, launch timings, the sweep as written, CPU by process, Triton's
metric views) is a dict on disk and a :class:`.search.PointDetail` in code, whose keys mypy checks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tritonbundle.errors import ConfigError
from tritonbundle.tune.search import Point, cut_short
from tritonbundle.tune.space import UPWARD_FIRST, Config, Knob, Space, config_from_json

Json = dict[str, Any]


@dataclass(frozen=True)
class PointSummary:
    """A point as the verdict names it: its configuration, rate at the SLO and latencies there."""

    label: str
    config: Config
    rate: float | None
    p50_ms: float | None
    p99_ms: float | None
    #: Every measurement of a configuration measured more than once (``rate`` is then their median).
    rates: tuple[float, ...] = ()

    @classmethod
    def of(cls, point: Point) -> PointSummary:
        return cls(point.label, point.config, point.rate, point.detail.get("p50_ms"), point.detail.get("p99_ms"),
                   tuple(point.detail.get("rates") or ()))

    def to_json(self) -> Json:
        data = {"label": self.label, "config": self.config, "rate": self.rate, "p50_ms": self.p50_ms,
                "p99_ms": self.p99_ms}
        return {**data, "rates": list(self.rates)} if self.rates else data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PointSummary:
        return cls(data["label"], config_from_json(data["config"]), data.get("rate"), data.get("p50_ms"), data.get("p99_ms"),
                   tuple(data.get("rates") or ()))


@dataclass(frozen=True)
class Move:
    """A step the search took: one knob from one value to another, and the rates before and after."""

    knob: str
    before: Any
    after: Any
    rate_before: float
    rate_after: float

    def to_json(self) -> Json:
        return {"knob": self.knob, "from": self.before, "to": self.after, "rate_before": self.rate_before,
                "rate_after": self.rate_after}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Move:
        return cls(data["knob"], data["from"], data["to"], data["rate_before"], data["rate_after"])


@dataclass(frozen=True)
class Verdict:
    """The search's conclusion: the winner (None: nothing met the SLO), the shipped defaults' point, why
    the search stopped, the moves it made and the reason in plain words."""

    winner: PointSummary | None
    baseline: PointSummary | None
    search_stopped: str
    moves: list[Move]
    reason: str
    #: The settings ``tune --versus`` named, as measured (the median when re-measured); None without it.
    reference: PointSummary | None = None

    def to_json(self) -> Json:
        data: Json = {"winner": self.winner.to_json() if self.winner else None,
                      "baseline": self.baseline.to_json() if self.baseline else None}
        if self.reference is not None:
            data["reference"] = self.reference.to_json()
        return {**data, "search_stopped": self.search_stopped, "moves": [m.to_json() for m in self.moves],
                "reason": self.reason}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Verdict:
        winner, baseline, reference = data.get("winner"), data.get("baseline"), data.get("reference")
        return cls(PointSummary.from_json(winner) if winner else None,
                   PointSummary.from_json(baseline) if baseline else None, data.get("search_stopped", ""),
                   [Move.from_json(m) for m in data.get("moves") or []], data.get("reason", ""),
                   PointSummary.from_json(reference) if reference else None)


def space_json(space: Space) -> Json:
    return {"knobs": {k.name: list(k.values) for k in space.knobs}, "notes": list(space.notes)}


def space_from_json(data: Mapping[str, Any]) -> Space:
    return Space(tuple(Knob(name, tuple(values), upward_first=name in UPWARD_FIRST)
                       for name, values in data.get("knobs", {}).items()),
                 tuple(data.get("notes", [])))


@dataclass
class TuneResult:
    """A tune run: the command, the model and its SLO, where the search started, every point measured
    so far, and, once the search ends, the space it searched and its verdict."""

    command: str
    model: str
    slo_p99_ms: float
    budget_s: float
    manifest: str
    overrides: dict[str, Any]
    #: The manifest's own values of the knobs, and the search's start (the defaults with ``--start``).
    defaults: Config
    start: Config
    points: list[Point] = field(default_factory=list)
    #: running, done or interrupted
    status: str = "running"
    space: Space | None = None
    verdict: Verdict | None = None
    #: How the instances shared the GPU (``TRITONBUNDLE_GPU_SHARING``; None on the CPU): a winner holds
    #: for that mode only.
    gpu_sharing: str | None = None
    #: The earlier run's report this one went on from (``--resume``); its points come first.
    resumed_from: str | None = None
    #: How the load generators sent their requests (``TRITONBUNDLE_LOAD_SENDER``); None in reports written
    #: before it was recorded, which sent through the client.
    load_sender: str | None = None
    #: The model that runs the network (``<model>_encoder`` behind a text ensemble, else the model); None in
    #: reports written before it was recorded.
    encoder: str | None = None

    @property
    def winner(self) -> PointSummary | None:
        return self.verdict.winner if self.verdict else None

    def to_json(self) -> Json:
        data: Json = {
            "command": self.command, "model": self.model, "slo_p99_ms": self.slo_p99_ms, "budget_s": self.budget_s,
            "manifest": self.manifest, "overrides": self.overrides, "defaults": self.defaults, "start": self.start,
            "points": [p.to_json() for p in self.points], "status": self.status,
        }
        if self.gpu_sharing is not None:
            data["gpu_sharing"] = self.gpu_sharing
        if self.resumed_from is not None:
            data["resumed_from"] = self.resumed_from
        if self.load_sender is not None:
            data["load_sender"] = self.load_sender
        if self.encoder is not None:
            data["encoder"] = self.encoder
        if self.space is not None:
            data["space"] = space_json(self.space)
        if self.verdict is not None:
            data.update(self.verdict.to_json())
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TuneResult:
        space = data.get("space")
        return cls(data.get("command", ""), data.get("model", ""), data.get("slo_p99_ms", 0.0), data.get("budget_s", 0.0),
                   data.get("manifest", ""), dict(data.get("overrides") or {}), dict(data.get("defaults") or {}),
                   dict(data.get("start") or {}), [Point.from_json(p) for p in data.get("points") or []],
                   data.get("status", ""), space_from_json(space) if space is not None else None,
                   Verdict.from_json(data) if "winner" in data else None, data.get("gpu_sharing"),
                   data.get("resumed_from"), data.get("load_sender"), data.get("encoder"))


def resumed_points(path: Path, run: TuneResult) -> list[Point]:
    """The points of the earlier run in ``path`` (its ``tune.json``), which ``run`` goes on from: refused,
    naming the difference, when it tuned another model, under another SLO, with other overrides, another
    GPU sharing or another load sender (its rates would not compare with this run's). A point whose
    rate search the budget cut is left out (its rate is a floor): this run measures it again."""
    try:
        earlier = TuneResult.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"--resume {path}: not a tune report ({type(e).__name__}: {e})") from None
    for what, was, now in (("model", earlier.model, run.model), ("p99 SLO (ms)", earlier.slo_p99_ms, run.slo_p99_ms),
                           ("overrides", earlier.overrides, run.overrides),
                           ("GPU sharing", earlier.gpu_sharing, run.gpu_sharing),
                           ("load sender", earlier.load_sender or "client", run.load_sender or "client")):
        if was != now:
            raise ConfigError(f"--resume {path}: that run's {what} was {was!r}, this run's is {now!r}: its rates "
                              "do not compare; start a new run instead")
    return [p for p in earlier.points if not cut_short(p)]
