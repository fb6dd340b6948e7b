"""The benchmark run's record: each model (its repository, its systems over the rounds, the ratios) and
the run around them (:class:`BenchResult`, written as ``bench.json`` after every phase). The systems'
own records are :mod:`.records`; the same rules hold here (same keys and order as always, absent keys
left out, older reports read back).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tritonbundle.bench.records import Failure, Json, SystemResult, drop_none, system_from_json
from tritonbundle.recipes import CEILING_TARGET

SystemT = TypeVar("SystemT", bound=SystemResult)


@dataclass(frozen=True)
class BuildResult:
    """The model's repository, as the build stage wrote it for the bench (or why it could not)."""

    status: str
    seconds: float | None = None
    repository: str | None = None
    padding_targets: list[int] = field(default_factory=list)
    batch_buckets: list[int] = field(default_factory=list)
    plan_computed_per_useful: float | None = None
    failure: Failure | None = None

    def to_json(self) -> Json:
        if self.failure is not None:
            return self.failure.to_json()
        return {"status": self.status, "seconds": self.seconds, "repository": self.repository,
                "padding_targets": self.padding_targets, "batch_buckets": self.batch_buckets,
                "plan_computed_per_useful": self.plan_computed_per_useful}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BuildResult:
        if data.get("status") != "ok":
            return cls(str(data.get("status")), failure=Failure(str(data.get("error")), data.get("traceback")))
        return cls("ok", data.get("seconds"), data.get("repository"), list(data.get("padding_targets") or []),
                   list(data.get("batch_buckets") or []), data.get("plan_computed_per_useful"))


@dataclass(frozen=True)
class Ratios:
    """The bundle's ratios to the other systems (medians over rounds of the ratio within each round, with
    their ranges when there were several), its padding figures, and whether each target is met."""

    #: Rounds the ratios are medians of (absent from reports older than ``--repeat``).
    rounds: int | None = None
    bundle_over_naive: float | None = None
    bundle_over_peer: float | None = None
    bundle_over_ceiling: float | None = None
    computed_per_useful: float | None = None
    seq_padded_per_useful: float | None = None
    #: ratio name -> [lowest, highest] over rounds
    ranges: dict[str, list[float]] | None = None
    #: target ("bundle_over_naive >= 8"...) -> met (None: not measured)
    targets: dict[str, bool | None] = field(default_factory=dict)
    #: The model's target for bundle/ceiling (:attr:`tritonbundle.recipes.Recipe.ceiling_target`; None in
    #: reports written before it was recorded, which all used the usual one: :attr:`ceiling_bar`).
    ceiling_target: float | None = None

    @property
    def ceiling_bar(self) -> float:
        return CEILING_TARGET if self.ceiling_target is None else self.ceiling_target

    def value(self, name: str) -> float | None:
        """A figure by its name in :data:`.repeats.RATIOS` and :func:`.repeats.targets`."""
        found: float | None = getattr(self, name)
        return found

    def to_json(self) -> Json:
        return drop_none(dataclasses.asdict(self), "rounds", "ranges", "ceiling_target")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Ratios:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class ModelResult:
    """One model: its repository, each system (its rounds combined), each round's figures and the ratios.
    Filled in as the run goes (the report is written after every phase)."""

    description: str
    recipe: str
    random_weights: bool
    systems: dict[str, SystemResult] = field(default_factory=dict)
    build: BuildResult | None = None
    #: With ``--repeat`` > 1: each round's rate at the SLO per system (None: failed).
    rounds: list[dict[str, float | None]] | None = None
    ratios: Ratios | None = None

    def system(self, name: str, kind: type[SystemT]) -> SystemT | None:
        """The system ``name`` when it was measured as ``kind`` (else None: absent, failed, skipped)."""
        found = self.systems.get(name)
        return found if isinstance(found, kind) else None

    def to_json(self) -> Json:
        return drop_none({
            "description": self.description, "recipe": self.recipe, "random_weights": self.random_weights,
            "systems": {name: s.to_json() for name, s in self.systems.items()},
            "build": self.build.to_json() if self.build else None, "rounds": self.rounds,
            "ratios": self.ratios.to_json() if self.ratios else None}, "build", "rounds", "ratios")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelResult:
        build, ratios = data.get("build"), data.get("ratios")
        return cls(data.get("description", ""), data.get("recipe", ""), bool(data.get("random_weights", False)),
                   {name: system_from_json(name, s) for name, s in (data.get("systems") or {}).items()},
                   BuildResult.from_json(build) if build else None, data.get("rounds"),
                   Ratios.from_json(ratios) if ratios else None)


@dataclass
class BenchResult:
    """A whole run: the command, its options and environment, the traffic, every model, how it ended.

    ``options`` (the :class:`.options.BenchOptions` as given, paths as text), ``environment``
    (:func:`tritonbundle.measure.probes.environment`) and ``traffic`` (the sample's summary) stay the
    dicts they are written as: snapshots that a reader of an older report must get back whole, whatever
    today's options or probes are."""

    command: str
    options: dict[str, Any]
    environment: dict[str, Any]
    models: dict[str, ModelResult] = field(default_factory=dict)
    #: running, done, failed or interrupted
    status: str = "running"
    traffic: dict[str, Any] | None = None
    elapsed_s: float | None = None
    error: Failure | None = None
    #: Outputs that could not be written (the plot, the logs).
    report_errors: list[str] = field(default_factory=list)

    def to_json(self) -> Json:
        return drop_none({
            "command": self.command, "options": self.options, "environment": self.environment,
            "models": {name: m.to_json() for name, m in self.models.items()}, "status": self.status,
            "traffic": self.traffic, "elapsed_s": self.elapsed_s, "error": self.error.to_json() if self.error else None,
            "report_errors": self.report_errors or None}, "traffic", "elapsed_s", "error", "report_errors")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BenchResult:
        error = data.get("error")
        return cls(data.get("command", ""), dict(data.get("options") or {}), dict(data.get("environment") or {}),
                   {name: ModelResult.from_json(m) for name, m in (data.get("models") or {}).items()},
                   data.get("status", ""), data.get("traffic"), data.get("elapsed_s"),
                   Failure(error.get("error", ""), error.get("traceback")) if isinstance(error, Mapping) else None,
                   list(data.get("report_errors") or []))
