"""The benchmark's settings and the time they leave each step: one object from the command line."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tritonbundle.errors import ConfigError
from tritonbundle.measure.latency import FAILURE_BUDGET
from tritonbundle.measure.levels import Timing
from tritonbundle.recipes import BENCH_MODELS

SYSTEMS = ("naive", "peer", "bundle", "ceiling")


@dataclass
class BenchOptions:
    out: Path
    work: Path | None = None
    budget_s: float = 420.0
    models: tuple[str, ...] = ("minilm", "bert-base")
    systems: tuple[str, ...] = SYSTEMS
    device: str = "cuda"
    slo_ms: float = 50.0
    #: Failed requests a level may have and still meet the SLO.
    max_failure_ratio: float = FAILURE_BUDGET
    traffic: Path | None = None
    sequence_buckets: int = 16
    #: Up to 64: BERT-base's launch of 128 rows at 512 tokens takes 41 ms on the H200, over half the 50 ms SLO
    #: (the rule `tune` applies); capped at 64 its knee moved +42 % (docs/benchmarks.md, 2026-12-02).
    batch_buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    #: Encoder batcher's max queue delay (0: derived from the SLO, a twentieth of it).
    queue_delay_us: int = 0
    instances: int = 2
    #: The tokenizer is single-threaded Python: the first H200 runs showed one instance saturated.
    tokenizer_instances: int = 4
    #: The tokenizer tokenizes every request its batcher gathered in one call: wait this long for more.
    tokenizer_queue_delay_us: int = 200
    load_procs: int = 0
    ladder_start: float = 50.0
    #: Where the ladder starts for the systems named here (``--start-rate 6400,peer=200``), else ``ladder_start``.
    start_rates: dict[str, float] = field(default_factory=dict)
    ladder_factor: float = 4.0
    refine: int = 3
    max_rate: float = 60000.0
    ceiling_batches: tuple[int, ...] = (1, 8, 32, 64, 128, 256)
    #: Client deadline per request (0: 20 x the SLO, at least 1 s).
    timeout_s: float = 0.0
    seed: int = 0
    keep_work: bool = False
    #: Manifest settings from a tune run's winner (``--tuned tune.json``), over the hand-set ones above.
    tuned: dict[str, Any] = field(default_factory=dict)
    #: Share of each model's time for each system (unused time rolls over).
    shares: dict[str, float] = field(default_factory=lambda: {"naive": 0.15, "peer": 0.25, "bundle": 0.45, "ceiling": 0.15})
    #: Rounds: every system measured this many times, in turn (figures: the median, with the range).
    repeat: int = 1
    #: What the bundle's clients send: "text" (the ensemble tokenizes) or "tokens" (token rows straight to the
    #: encoder, tokenized on the client side; the peer, naive and ceiling phases are unchanged).
    input: str = "text"

    def __post_init__(self) -> None:
        unknown = [m for m in self.models if m not in BENCH_MODELS]
        if unknown:
            raise ConfigError(f"unknown model(s) {unknown}; known: {', '.join(BENCH_MODELS)}")
        bad = [s for s in self.systems if s not in SYSTEMS]
        if bad:
            raise ConfigError(f"unknown system(s) {bad}; known: {', '.join(SYSTEMS)}")
        if self.device not in ("cuda", "cpu"):
            raise ConfigError(f"--device must be cuda or cpu, not {self.device!r}")
        if self.budget_s < 30:
            raise ConfigError("--budget-s must be at least 30 seconds")
        if self.input not in ("text", "tokens"):
            raise ConfigError(f"--input must be text or tokens, not {self.input!r}")
        if self.repeat < 1:
            raise ConfigError("--repeat must be at least 1")
        if any(s not in SYSTEMS for s in self.start_rates) or any(r <= 0 for r in self.start_rates.values()):
            raise ConfigError(f"--start-rate: name systems of {', '.join(SYSTEMS)}, each with a rate > 0 "
                              f"(got {self.start_rates})")
        missing = [s for s in self.systems if not self.shares.get(s, 0) > 0]
        if missing:
            raise ConfigError(f"--shares: give each system a share > 0 (missing: {', '.join(missing)})")

    def start_rate(self, system: str) -> float:
        return self.start_rates.get(system, self.ladder_start)

    @property
    def encoder_queue_delay_us(self) -> int:
        """The encoder's ``max_queue_delay_us`` as served: a ``--tuned`` file's, else the one set, else long
        enough to gather a large batch and short against the SLO (a twentieth of it)."""
        tuned = self.tuned.get("max_queue_delay_us")
        return int(tuned) if tuned is not None else self.queue_delay_us or int(self.slo_ms * 1000 / 20)

    @property
    def target(self) -> str:
        return "gpu" if self.device == "cuda" else "cpu"

    @property
    def precision(self) -> str:
        return "fp16" if self.device == "cuda" else "fp32"


class Clock:
    def __init__(self, budget_s: float) -> None:
        self.start = time.monotonic()
        self.deadline = self.start + budget_s

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start


def step_timing(options: BenchOptions, phase_left: float, expected_steps: int) -> Timing:
    """Load levels whose window (1-5 s) is scaled to the time the phase has left."""
    grace = Timing.for_window(1.0, options.slo_ms).grace_s
    usable = max(0.0, phase_left) / max(1, expected_steps)
    return Timing.for_window(min(5.0, max(1.0, (usable - grace - 2.0) / 1.25)), options.slo_ms)


def client_timeout_s(options: BenchOptions) -> float:
    """The client's deadline per request (also Triton's queue timeout): explicit, else 20 x the SLO, at least 1 s.
    A request slower than that has failed the SLO anyway; a short deadline keeps an overloaded level
    from leaving a long backlog behind for the next one."""
    return options.timeout_s if options.timeout_s > 0 else max(1.0, 20 * options.slo_ms / 1000.0)


def setup_timeout_s(deadline: float) -> float:
    return min(120.0, max(20.0, deadline - time.monotonic()))


def expected_steps(options: BenchOptions, system: str) -> int:
    # The ladder's rungs up to --max-rate, the cap itself the last (measure.search.search_rate).
    rungs = math.log(options.max_rate / options.start_rate(system)) / math.log(options.ladder_factor)
    ladder = max(1, math.ceil(rungs - 1e-9) + 1)
    guess = 3 if system in ("naive", "peer") else 5
    return min(ladder, guess) + options.refine
