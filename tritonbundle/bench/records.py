"""What each system of the benchmark measured, as typed records: :class:`SystemResult` (a system that
failed or was skipped) and one subclass per measured system, with their parts (the answers check, the
bundle's breakdown, the ceiling's rows, the spread over rounds). The phases return them, :mod:`.repeats`
combines them, :mod:`.result` holds them per model, :mod:`.report` reads them.

``to_json()`` writes them as ``bench.json`` has always laid them out (same keys, same order; a key that a
record does not have is left out rather than written as null), and ``from_json()`` reads a written
report back, older ones included (a key they lack reads as absent).

Left as dicts, on purpose: payloads keyed by data rather than by a fixed set of names, or snapshots of
another component's own record, where a class would only restate them: Triton's per-model metric views,
CPU cores by process, the encoder's per-phase timings and call histograms, the engine's self-description,
the peer's settings, the encoder instances' start-up reports, the padding counters
(:func:`.accounting.tokens_ratio`) and each level's ``extra`` (:class:`~tritonbundle.measure.latency.StepResult`).
"""

from __future__ import annotations

import dataclasses
import traceback as traceback_mod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tritonbundle.measure.probes import GPU_KEYS
from tritonbundle.measure.search import Sweep

Json = dict[str, Any]


def drop_none(data: Json, *optional: str) -> Json:
    """``data`` without the ``optional`` keys whose value is None (keys a record may lack)."""
    return {k: v for k, v in data.items() if not (k in optional and v is None)}


@dataclass(frozen=True)
class Spread:
    """A figure measured over rounds: every round's value (None: that round failed), and when any was
    measured, their median, range and spread (range / median, in %)."""

    values: list[float | None]
    runs: int
    failed: int
    median: float | None = None
    min: float | None = None
    max: float | None = None
    spread_pct: float | None = None

    def to_json(self) -> Json:
        data: Json = {"values": list(self.values), "runs": self.runs, "failed": self.failed}
        if self.median is not None:
            data.update(median=self.median, min=self.min, max=self.max, spread_pct=self.spread_pct)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Spread:
        return cls(list(data["values"]), int(data["runs"]), int(data["failed"]), data.get("median"), data.get("min"),
                   data.get("max"), data.get("spread_pct"))


@dataclass(frozen=True)
class AnswersCheck:
    """A system's answers against the FP32 reference: how many, the worst cosine; for requests sent at
    once, by how many callers; for the bundle, the checks at once before and after its sweep."""

    texts: int
    min_cosine: float
    callers: int | None = None
    at_once: AnswersCheck | None = None
    after_sweep: AnswersCheck | None = None

    def to_json(self) -> Json:
        return drop_none({"texts": self.texts, "min_cosine": self.min_cosine, "callers": self.callers,
                           "at_once": self.at_once.to_json() if self.at_once else None,
                           "after_sweep": self.after_sweep.to_json() if self.after_sweep else None},
                          "callers", "at_once", "after_sweep")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AnswersCheck:
        at_once, after = data.get("at_once"), data.get("after_sweep")
        return cls(int(data["texts"]), float(data["min_cosine"]), data.get("callers"),
                   cls.from_json(at_once) if at_once else None, cls.from_json(after) if after else None)


@dataclass(frozen=True)
class Failure:
    """Why something did not run: the exception, and where it came from."""

    error: str
    traceback: str | None = None

    @classmethod
    def of(cls, e: BaseException) -> Failure:
        return cls(f"{type(e).__name__}: {e}"[:2000], "".join(traceback_mod.format_exception(e))[-4000:])

    def to_json(self) -> Json:
        return drop_none({"status": "failed", "error": self.error, "traceback": self.traceback}, "traceback")


@dataclass(frozen=True, kw_only=True)
class SystemResult:
    """One system in one round, or its rounds combined (:func:`.repeats.combine`). As such (this class,
    not a subclass): a system that failed or was skipped (``status``, ``error``). ``best_rps`` and
    ``computed_per_useful`` are written by the systems that measure them."""

    status: str
    best_rps: float | None = None
    computed_per_useful: float | None = None
    error: str | None = None
    traceback: str | None = None
    #: The phase's wall time.
    seconds: float | None = None
    #: What every round measured, when there were several.
    repeats: Spread | None = None

    @classmethod
    def failed(cls, failure: Failure) -> SystemResult:
        return cls(status="failed", error=failure.error, traceback=failure.traceback)

    def to_json(self) -> Json:
        return self._with_tail(drop_none(
            {"status": self.status, "best_rps": self.best_rps, "computed_per_useful": self.computed_per_useful,
             "error": self.error, "traceback": self.traceback}, "best_rps", "computed_per_useful", "error", "traceback"))

    def _with_tail(self, data: Json) -> Json:
        return drop_none({**data, "seconds": self.seconds, "repeats": self.repeats.to_json() if self.repeats else None},
                          "seconds", "repeats")

    @staticmethod
    def _common(data: Mapping[str, Any]) -> Json:
        repeats = data.get("repeats")
        return {"status": data["status"], "best_rps": data.get("best_rps"), "error": data.get("error"),
                "traceback": data.get("traceback"), "seconds": data.get("seconds"),
                "repeats": Spread.from_json(repeats) if repeats else None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SystemResult:
        return SystemResult(computed_per_useful=data.get("computed_per_useful"), **SystemResult._common(data))


@dataclass(frozen=True, kw_only=True)
class ServedResult(SystemResult):
    """A system behind a server, measured by the rate search: its levels, the load generator processes,
    its answers check and how it was reached."""

    sweep: Sweep
    load_processes: int
    correctness: AnswersCheck
    protocol: str
    precision: str

    @staticmethod
    def _served(data: Mapping[str, Any]) -> Json:
        return {**SystemResult._common(data), "sweep": Sweep.from_json(data["sweep"]),
                "load_processes": data["load_processes"], "correctness": AnswersCheck.from_json(data["correctness"]),
                "protocol": data["protocol"], "precision": data["precision"]}


@dataclass(frozen=True, kw_only=True)
class NaiveResult(ServedResult):
    """The naive server: one request at a time, each at its own length."""

    padding: str
    computed_per_useful: float | None = 1.0

    def to_json(self) -> Json:
        return self._with_tail({
            "status": self.status, "sweep": self.sweep.to_json(), "best_rps": self.best_rps,
            "load_processes": self.load_processes, "correctness": self.correctness.to_json(), "protocol": self.protocol,
            "precision": self.precision, "padding": self.padding, "computed_per_useful": self.computed_per_useful})

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NaiveResult:
        return cls(padding=data["padding"], computed_per_useful=data.get("computed_per_useful"), **cls._served(data))


@dataclass(frozen=True, kw_only=True)
class PeerResult(ServedResult):
    """The peer (LitServe): which one, its settings and what was changed from its defaults."""

    system: str
    settings: dict[str, Any]
    padding: str
    changed: list[str]

    def to_json(self) -> Json:
        return self._with_tail({
            "status": self.status, "sweep": self.sweep.to_json(), "best_rps": self.best_rps,
            "load_processes": self.load_processes, "correctness": self.correctness.to_json(), "protocol": self.protocol,
            "system": self.system, "settings": self.settings, "precision": self.precision, "padding": self.padding,
            "changed": self.changed})

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PeerResult:
        return cls(system=data["system"], settings=dict(data["settings"]), padding=data["padding"],
                   changed=list(data["changed"]), **cls._served(data))


@dataclass(frozen=True)
class Restart:
    """A level during which tritonserver went down (restarted; the level counts as failed)."""

    offered_rps: float
    why: str
    restart_s: float | None

    def to_json(self) -> Json:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class InstanceCycle:
    """How often each instance of a model took a batch at one level, against its batch cap
    (:func:`.breakdown.instance_cycle`).

    The Python backend serves a call on the instance's own thread in tritonserver from start to end
    (python_backend r24.10 ``src/python_be.cc``, ``ProcessRequests``: the requests written to shared
    memory, the stub's answer awaited, each response sent), and Triton hands the instance its next batch
    only once that returns: each instance is a serial pipeline. With its calls full and its pipeline
    busy, a model answers at most ``instances x batch_cap`` requests per ``cycle_ms``, whatever the CPUs
    or the GPU have left."""

    instances: int
    #: Requests per call (Triton's average batch) and the model's ``max_batch_size`` (None: not known).
    requests_per_call: float
    batch_cap: int | None
    #: One instance's period from a call to its next: instances / the calls Triton counted per second.
    cycle_ms: float
    #: Triton's time for a call once it left the queue (request time less queue time; each request counts
    #: its call's), ms: the rest of the cycle is the hand-over between calls, or idling for want of requests.
    busy_ms: float | None = None
    #: Its parts before and after the backend's compute (Triton's compute_input and compute_output): for
    #: the Python backend the requests staged in shared memory, and each response created, copied out and
    #: sent (:mod:`tritonbundle.measure.triton_metrics`). None in reports before 2026-12-05.
    staging_ms: float | None = None
    responding_ms: float | None = None

    def handover_ms(self, execute_ms: float | None) -> float | None:
        """Triton's time for a call less the stub's ``execute_ms``: the Python backend's hand-over. None
        where either is missing, or where execute() outlives the call (batches in flight: a lane answers
        after Triton's call has ended, so execute() is not a part of it)."""
        if self.busy_ms is None or not execute_ms or execute_ms > self.busy_ms:
            return None
        return self.busy_ms - execute_ms

    @property
    def fill(self) -> float | None:
        """The calls' share of the batch cap."""
        return self.requests_per_call / self.batch_cap if self.batch_cap else None

    @property
    def busy_share(self) -> float | None:
        return self.busy_ms / self.cycle_ms if self.busy_ms is not None and self.cycle_ms > 0 else None

    @property
    def bound_rps(self) -> float | None:
        """The most the instances answer at this cycle with every call full."""
        return 1000.0 * self.instances * self.batch_cap / self.cycle_ms if self.batch_cap and self.cycle_ms > 0 else None

    def to_json(self) -> Json:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> InstanceCycle:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})


@dataclass(frozen=True)
class Breakdown:
    """Where the bundle's time goes at one level (:func:`.breakdown.breakdown`). A key the run could
    not observe (no tokenizer model, no encoder statistics) is absent."""

    at_offered_rps: float
    achieved_rps: float
    client_mean_ms: float
    client_p99_ms: float
    client_lag_mean_ms: float | None
    ensemble_request_ms: float | None
    client_grpc_ms: float | None = None
    #: The load generators' sends, late at p99, and their event loops' timer wake-ups, late at p99 (the
    #: worst process's; ms); None in reports from before they were measured.
    client_lag_p99_ms: float | None = None
    client_loop_lag_p99_ms: float | None = None
    #: The answers' p99 from each request's send rather than its schedule (ms; reports from 2026-12-05 on):
    #: with the SLO met from the send and missed from the schedule, the load generators made the tail.
    client_p99_from_send_ms: float | None = None
    #: Triton's view of the tokenizer and the encoder models (queue, compute, batch size...).
    tokenizer: dict[str, Any] | None = None
    encoder: dict[str, Any] | None = None
    #: The encoder's execute() per call by phase (read, plan, fill, launch, wait, respond...), ms.
    encoder_execute_ms: dict[str, float] | None = None
    encoder_rows_per_execute: float | None = None
    encoder_launches_per_execute: float | None = None
    encoder_execute_ms_per_request: float | None = None
    #: Per-call histogram quantiles: name -> {"p50": ms, "p99": ms}.
    encoder_call_ms: dict[str, dict[str, float | None]] | None = None
    #: The tokenizer model's execute() per call by phase (read, tokenize, respond, execute), ms; its texts
    #: per call; its per-call histogram's quantiles (texts in only).
    tokenizer_execute_ms: dict[str, float] | None = None
    tokenizer_texts_per_execute: float | None = None
    tokenizer_call_ms: dict[str, dict[str, float | None]] | None = None
    #: Triton's tokenizer compute per request minus the model's execute() per request (each request
    #: counting its call's time, as Triton does): the Python backend stub's work around the call, ms.
    tokenizer_outside_ms: float | None = None
    #: The encoder's instances: how often each took a call, how full the calls were (None in reports
    #: from before 2026-12-05, where :func:`.breakdown.instance_cycle` can still read it).
    encoder_cycle: InstanceCycle | None = None
    padding: dict[str, float | None] = field(default_factory=dict)
    #: CPU cores busy, and processes counted, by process role ("server:stub[...]", "load0"...).
    cpu_cores: dict[str, float] = field(default_factory=dict)
    cpu_processes: dict[str, int] | None = None
    #: Per process role, its busiest threads as (thread name, share of one core); None in reports from
    #: before threads were sampled.
    cpu_threads: dict[str, list[tuple[str, float]]] | None = None
    gpu_util_mean: float | None = None
    #: The GPU's SM clock (mean, min, MHz), power (mean, W) and share of samples it had slowed its clocks
    #: in (power cap, heat) over the level: ``gpu_sm_mhz_mean``, ``gpu_sm_mhz_min``, ``gpu_power_w_mean``,
    #: ``gpu_slowed_share``; None in reports from before they were sampled.
    gpu_clocks: dict[str, float | None] | None = None
    #: The GPU's busy time per row the encoder ran (utilisation over the span the level sent in), and
    #: what the same launches take alone (each launch's shape as the engine timed it at start-up), ms;
    #: busy past alone is the instances sharing the GPU. None in reports from before 2026-12-06, or on the CPU.
    gpu_busy_ms_per_row: float | None = None
    gpu_alone_ms_per_row: float | None = None
    hints: list[str] = field(default_factory=list)

    OPTIONAL = ("client_grpc_ms", "client_lag_p99_ms", "client_loop_lag_p99_ms", "client_p99_from_send_ms",
                "tokenizer", "encoder", "encoder_execute_ms", "encoder_rows_per_execute", "encoder_launches_per_execute",
                "encoder_execute_ms_per_request", "encoder_call_ms", "tokenizer_execute_ms",
                "tokenizer_texts_per_execute", "tokenizer_call_ms", "tokenizer_outside_ms", "encoder_cycle", "cpu_processes",
                "cpu_threads", "gpu_clocks", "gpu_busy_ms_per_row", "gpu_alone_ms_per_row")

    def to_json(self) -> Json:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["encoder_cycle"] = self.encoder_cycle.to_json() if self.encoder_cycle else None
        return drop_none(data, *self.OPTIONAL)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Breakdown:
        names = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in data.items() if k in names}
        if fields.get("encoder_cycle"):
            fields["encoder_cycle"] = InstanceCycle.from_json(fields["encoder_cycle"])
        if fields.get("cpu_threads"):  # JSON's lists back to the (name, cores) pairs a level records
            fields["cpu_threads"] = {role: [(str(n), float(c)) for n, c in top]
                                     for role, top in fields["cpu_threads"].items()}
        return cls(**fields)


@dataclass(frozen=True, kw_only=True)
class BundleResult(ServedResult):
    """The bundle: tritonserver, its start-up, its encoder instances, its padding and where its time goes."""

    startup_s: float
    input: str | None = None
    encoder_instances: list[dict[str, Any]]
    padding: dict[str, float | None]
    seq_padded_per_useful: float | None
    breakdown: Breakdown | None
    went_down: list[Restart] | None = None
    #: With ``TRITONBUNDLE_GPU_SHARING=mps``: the MPS servers' process ids once the models loaded
    #: (empty: the instances reached no MPS server and time-sliced the GPU); None without MPS.
    mps_servers: list[int] | None = None

    def to_json(self) -> Json:
        return self._with_tail(drop_none({
            "status": self.status, "sweep": self.sweep.to_json(), "best_rps": self.best_rps,
            "load_processes": self.load_processes, "startup_s": self.startup_s, "correctness": self.correctness.to_json(),
            "protocol": self.protocol, "input": self.input, "precision": self.precision,
            "encoder_instances": self.encoder_instances, "padding": self.padding,
            "computed_per_useful": self.computed_per_useful, "seq_padded_per_useful": self.seq_padded_per_useful,
            "breakdown": self.breakdown.to_json() if self.breakdown else None,
            "went_down": None if self.went_down is None else [d.to_json() for d in self.went_down],
            "mps_servers": self.mps_servers},
            "input", "went_down", "mps_servers"))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BundleResult:
        b, down = data.get("breakdown"), data.get("went_down")
        return cls(startup_s=data["startup_s"], input=data.get("input"), encoder_instances=list(data["encoder_instances"]),
                   padding=dict(data["padding"]), computed_per_useful=data.get("computed_per_useful"),
                   seq_padded_per_useful=data.get("seq_padded_per_useful"),
                   breakdown=Breakdown.from_json(b) if b else None,
                   went_down=None if down is None else [Restart(**d) for d in down], mps_servers=data.get("mps_servers"),
                   **cls._served(data))


@dataclass(frozen=True)
class CeilingRow:
    """The engine's ceiling at one batch size (:func:`.accounting.ceiling`)."""

    batch: int
    requests_per_s: float
    useful_tokens_per_s: float
    computed_tokens_per_s: float
    worst_batch_ms: float
    feasible: bool

    def to_json(self) -> Json:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class FixedShape:
    """One (batch, length) launch timed on its own."""

    batch: int
    length: int
    ms: float
    tokens_per_s: float

    def to_json(self) -> Json:
        return dataclasses.asdict(self)


@dataclass(frozen=True, kw_only=True)
class CeilingResult(SystemResult):
    """The engine in-process, no server: each (batch, padding target) launch timed, and what that allows."""

    best: CeilingRow | None
    per_batch: list[CeilingRow]
    mean_tokens: float
    #: Padding target (as text) -> share of rows; "<batch>x<target>" -> ms per launch.
    shares: dict[str, float]
    timings_ms: dict[str, float]
    engine: dict[str, Any]
    mode: str
    #: The GPU sampler's window over the timings (``tritonbundle.measure.probes.GPU_KEYS``).
    gpu: dict[str, float | None] = field(default_factory=dict)
    fixed_shape: FixedShape | None = None

    GPU_KEYS = GPU_KEYS

    def to_json(self) -> Json:
        data: Json = {
            "status": self.status, "best_rps": self.best_rps, "best": self.best.to_json() if self.best else None,
            "per_batch": [r.to_json() for r in self.per_batch], "mean_tokens": self.mean_tokens, "shares": self.shares,
            "timings_ms": self.timings_ms, "computed_per_useful": self.computed_per_useful, "engine": self.engine,
            "mode": self.mode, "seconds": self.seconds, **self.gpu,
        }
        if self.fixed_shape:
            data["fixed_shape"] = self.fixed_shape.to_json()
        if self.repeats:
            data["repeats"] = self.repeats.to_json()
        return drop_none(data, "seconds")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CeilingResult:
        best, fixed = data.get("best"), data.get("fixed_shape")
        return cls(best=CeilingRow(**best) if best else None, per_batch=[CeilingRow(**r) for r in data["per_batch"]],
                   mean_tokens=data["mean_tokens"], shares=dict(data["shares"]), timings_ms=dict(data["timings_ms"]),
                   computed_per_useful=data.get("computed_per_useful"), engine=dict(data["engine"]), mode=data["mode"],
                   gpu={k: data[k] for k in cls.GPU_KEYS if k in data},
                   fixed_shape=FixedShape(**fixed) if fixed else None, **SystemResult._common(data))

    @property
    def gpu_util_mean(self) -> float | None:
        return self.gpu.get("gpu_util_mean")


#: system name -> its record when it was measured, and a key only that record has
MEASURED: dict[str, tuple[type[SystemResult], str]] = {
    "naive": (NaiveResult, "sweep"), "peer": (PeerResult, "sweep"), "bundle": (BundleResult, "sweep"),
    "ceiling": (CeilingResult, "per_batch"),
}


def system_from_json(system: str, data: Mapping[str, Any]) -> SystemResult:
    """A system's record as written: its own class when it was measured, else :class:`SystemResult`."""
    kind, key = MEASURED.get(system, (SystemResult, "status"))
    return kind.from_json(data) if data.get("status") == "ok" and key in data else SystemResult.from_json(data)
