"""What a tune run is asked to do: one object from the command line, whose defaults the flags show."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tritonbundle.errors import ConfigError
from tritonbundle.measure.latency import FAILURE_BUDGET
from tritonbundle.tune.space import ORDER


@dataclass
class TuneOptions:
    out: Path
    manifest: Path
    artifacts: Path
    slo_ms: float = 50.0
    budget_s: float = 300.0
    model: str | None = None
    traffic: Path | None = None
    #: Applied to every candidate (``--target``, ``--runtime``, ``--precision``).
    overrides: dict[str, Any] = field(default_factory=dict)
    #: Where the search starts (tunables); empty: the manifest's own values.
    start: dict[str, Any] = field(default_factory=dict)
    knobs: tuple[str, ...] = ORDER
    window_s: float = 3.0
    load_procs: int = 1
    start_rate: float = 4.0
    rate_factor: float = 2.0
    refine: int = 2
    max_rate: float = 100_000.0
    #: The best two configurations are measured this many times in all, in turns, and the winner is
    #: named by median (1: the best single measurement wins). The bench's ``--repeat``, for finalists.
    repeat: int = 3
    #: Failed requests a level may have and still meet the SLO.
    max_failure_ratio: float = FAILURE_BUDGET
    work: Path | None = None
    #: Where the manifest with the winner written in goes (None: only ``winner.yaml`` in ``out``).
    tuned_manifest: Path | None = None
    extra_server_args: tuple[str, ...] = ()
    #: An earlier run's ``tune.json`` (same model, SLO, overrides and GPU sharing): every configuration it
    #: measured is taken from it instead of measured again, so a search its budget cut short goes on.
    resume: Path | None = None
    #: Settings to measure beside the search (a ``tune.json``, or ``{"winner": {"config": {...}}}`` written by
    #: hand): measured after the defaults, then the search's winner's other finalist, in turns.
    versus: Path | None = None

    def __post_init__(self) -> None:
        if self.budget_s < 20:
            raise ConfigError("--budget-s must be at least 20 seconds (a few load levels of one configuration)")
        if self.repeat < 1:
            raise ConfigError("--repeat must be at least 1")
        if self.slo_ms <= 0:
            raise ConfigError("--slo-p99-ms must be > 0")
