"""Interleaved A/B runs, summed up: the bench reports of one device call's rounds (``scripts/device_ab.sh``
writes ``runs/<setting>-<round>/bench.json``), grouped by setting, as the median and range of each
setting's knee with what explains it at the knee: reading and tokenizing per row, the Python stubs'
CPU time per answered request, the cores busy at the knee in all (against what the host did with all its
CPUs busy, where the run measured it), the busiest single thread there (a thread near a whole core is a
serial limit the total hides), the GPU's busy time per row against what the launches take alone (the gap:
the instances sharing the GPU), computed/useful tokens, and the host's speed (``measure/host.py``) and the
server's start-up time beside each run, and how often the host stalled a bystander process 5+ ms at the
knee and past it (``measure/stalls.py``). Reference runs in the same rounds (``device_ab.sh --reference
ceiling``/``peer``: ``runs/ceiling-<round>``) get a row too, and each setting's median over theirs.

On the H200 the knee moves 15-35 % from one run to the next (docs/benchmarks.md), so a setting is
judged by the median of interleaved rounds; the per-row and per-request figures say whether a
difference comes from the setting (the stage it changes got cheaper) or from the run (everything,
the load generators too, got slower).

    python -m tritonbundle.bench.compare docs/benchmarks/h200-plain-text
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from tritonbundle.bench.breakdown import encoder_model, gpu_per_row, instance_cycle
from tritonbundle.bench.records import BundleResult, InstanceCycle, ServedResult, Spread
from tritonbundle.bench.repeats import counted_rps, spread
from tritonbundle.bench.result import BenchResult
from tritonbundle.measure import host
from tritonbundle.measure.latency import StepResult
from tritonbundle.measure.levels import sending_s
from tritonbundle.measure.search import Sweep

_RUN = re.compile(r"^(?P<setting>.+)-(?P<round>\d+)$")
#: The systems a run is read for, the first present: the bundle, else a reference (``device_ab.sh --reference``).
SYSTEMS = ("bundle", "ceiling", "peer")
#: The probe's reading of one level: long stalls, the longest (ms), the CPU wait in % (None: not read).
Stalls = tuple[int, float, float | None]


@dataclass
class Run:
    """One bench run of one setting: its knee and what was measured there."""

    round: int
    rps: float | None
    #: The system measured: ``bundle``, or a reference run beside the settings (``ceiling``, ``peer``).
    system: str = "bundle"
    #: Whether ``rps`` is only a floor of the knee: no level above it missed (the ladder reached
    #: --max-rate, or the budget ended first). The table marks it ``+``.
    floor: bool = False
    #: ms per row at the knee: reading the requests (with their tokenizing in reports before 2026-12-04)
    #: and tokenizing (None when not counted apart).
    read_per_row: float | None = None
    tokenize_per_row: float | None = None
    #: CPU time of the Python-backend stubs and of the load generators per answered request, ms.
    stub_ms_per_request: float | None = None
    load_ms_per_request: float | None = None
    #: The host workload's median time before the run, ms (None in reports before 2026-12-04).
    host_ms: float | None = None
    #: Every measured process's CPU at the knee, in cores; the host's cores' worth of work with all its
    #: CPUs busy, before the run (``measure.host.capacity``; None in reports before 2026-12-05).
    cores_busy: float | None = None
    host_capacity: float | None = None
    #: The busiest thread at the knee: its share of one core and its process's role (reports from
    #: 2026-12-04 on record each level's busiest threads).
    busiest_thread: float | None = None
    busiest_role: str = ""
    #: The encoder's instances at the knee: how full their calls were and how busy (reports before
    #: 2026-12-05: read again from Triton's view, the stubs counted and the instances' batch buckets).
    cycle: InstanceCycle | None = None
    #: Triton's time for a call out of the queue less the stub's execute(), per request of the call, ms:
    #: the Python backend's hand-over (requests staged in shared memory and loaded by the stub, outputs
    #: saved there, each response created, copied out and sent: python_backend r24.10 src/python_be.cc).
    handover_ms_per_request: float | None = None
    #: Its three parts, per request of the call, ms (reports from 2026-12-05 on): Triton staging the
    #: requests (compute_input), the stub's side of its round trip outside execute() (the rest), Triton
    #: creating and sending the responses (compute_output).
    handover_parts: tuple[float, float, float] | None = None
    #: The GPU's busy time per row at the knee, and what the same launches take alone, ms (reports from
    #: 2026-12-06 on): their gap is the encoder instances sharing the GPU.
    gpu_busy_per_row: float | None = None
    gpu_alone_per_row: float | None = None
    #: The host-stall probe's wake-ups 5+ ms late (how many, the longest, ms) at the knee and at the first
    #: level past it (reports from 2026-12-06 on; ``measure/stalls.py``).
    stalls_at_knee: Stalls | None = None
    stalls_past_it: Stalls | None = None
    #: Tokens computed per useful token over the run, and the server's start-up, s.
    computed_per_useful: float | None = None
    startup_s: float | None = None


@dataclass
class Setting:
    name: str
    runs: list[Run] = field(default_factory=list)

    @property
    def system(self) -> str:
        """What its runs measured: ``bundle`` for a setting, ``ceiling`` or ``peer`` for a reference."""
        return self.runs[0].system if self.runs else "bundle"

    @property
    def by_round(self) -> list[Run]:
        return sorted(self.runs, key=lambda r: r.round)

    @property
    def rates(self) -> list[float | None]:
        """Its rounds' rates as every median over rounds counts them (:func:`.repeats.counted_rps`): a bundle
        round that failed is a 0, a reference's is None (left out)."""
        return [r.rps for r in self.by_round]

    @property
    def spread(self) -> Spread:
        return spread(self.rates)

    @property
    def median(self) -> float:
        return self.spread.median or 0.0


def read_run(path: Path) -> Run:
    """The run in ``path`` (a folder with ``bench.json``, named ``<setting>-<round>``); its model's bundle."""
    result = BenchResult.from_json(json.loads((path / "bench.json").read_text()))
    match = _RUN.match(path.name)
    system, name, bundle = next(((s, n, m.systems[s]) for s in SYSTEMS for n, m in result.models.items()
                                 if s in m.systems), ("bundle", "", None))
    speed = host.HostSpeed.from_json(result.environment.get("host_speed"))
    run = Run(int(match["round"]) if match else 0, counted_rps(system, bundle), system,
              host_ms=speed.median_ms_before, host_capacity=speed.capacity_cores())
    if bundle is not None:
        run.computed_per_useful = bundle.computed_per_useful
    if isinstance(bundle, ServedResult):
        run.floor = bundle.sweep.is_floor
        run.stalls_at_knee, run.stalls_past_it = _stalls(bundle.sweep)
    if isinstance(bundle, BundleResult):
        run.startup_s = bundle.startup_s
    if not isinstance(bundle, BundleResult) or bundle.breakdown is None:
        return run
    b = bundle.breakdown
    phases, rows = b.encoder_execute_ms or {}, b.encoder_rows_per_execute
    if rows:
        run.read_per_row = phases["read"] / rows if "read" in phases else None
        run.tokenize_per_row = phases["tokenize"] / rows if "tokenize" in phases else None
    if b.cpu_cores:
        run.cores_busy = sum(b.cpu_cores.values())
    best = bundle.sweep.best if bundle.sweep is not None else None
    if best is not None:  # read at the knee, as the breakdown does: reports from before it kept them too
        run.gpu_busy_per_row, run.gpu_alone_per_row = gpu_per_row(
            best.extra.get("encoder") or {}, best.extra.get("gpu_util_mean"), sending_s(best))
    run.cycle = c = b.encoder_cycle or _cycle_again(name, bundle)
    handover = c.handover_ms(phases.get("execute")) if c is not None else None
    if c is not None and handover is not None and c.requests_per_call:
        run.handover_ms_per_request = handover / c.requests_per_call
        if c.staging_ms is not None and c.responding_ms is not None:
            stub_side = handover - c.staging_ms - c.responding_ms
            run.handover_parts = (c.staging_ms / c.requests_per_call, stub_side / c.requests_per_call,
                                  c.responding_ms / c.requests_per_call)
    threads = [(cores, role) for role, top in (b.cpu_threads or {}).items() for _, cores in top]
    if threads:
        run.busiest_thread, run.busiest_role = max(threads)
    if b.achieved_rps:
        run.stub_ms_per_request = 1000.0 * sum(v for k, v in b.cpu_cores.items() if "stub[" in k) / b.achieved_rps
        run.load_ms_per_request = 1000.0 * sum(v for k, v in b.cpu_cores.items() if k.startswith("load")) / b.achieved_rps
    return run


def _cycle_again(name: str, bundle: BundleResult) -> InstanceCycle | None:
    """The encoder's cycle at the knee of a report that did not record it: the encoder is ``name`` itself
    when no tokenizer model served (it tokenizes), and its cap its instances' largest batch bucket."""
    b = bundle.breakdown
    if b is None:
        return None
    encoder = encoder_model(name, tokenizer_served=b.tokenizer is not None)
    buckets = [max(i["batch_buckets"]) for i in bundle.encoder_instances or []
               if i.get("model") == encoder and i.get("batch_buckets")]
    best = bundle.sweep.best if bundle.sweep is not None else None
    return instance_cycle(b.encoder, (b.cpu_processes or {}).get(f"server:stub[{encoder}]"),
                          max(buckets) if buckets else None,
                          wall_s=best.extra.get("step_wall_s") if best is not None else None, achieved_rps=b.achieved_rps)


def _stalls(sweep: Sweep) -> tuple[Stalls | None, Stalls | None]:
    """The probe's long stalls and CPU wait at the knee and at the lowest missed level past it (None where
    unwatched)."""
    knee = sweep.best.offered_rps if sweep.best is not None else 0.0
    past = sorted((s for s in sweep.steps if not s.passed and s.offered_rps > knee), key=lambda s: s.offered_rps)

    def of(step: StepResult | None) -> Stalls | None:
        if step is None or step.extra.get("host_probe_s") is None:
            return None
        wait = step.extra.get("host_cpu_wait")
        return (int(step.extra.get("host_long_stalls") or 0), float(step.extra.get("host_stall_max_ms") or 0.0),
                None if wait is None else 100 * float(wait))

    return of(sweep.best), of(past[0] if past else None)


def _stall_cells(runs: list[Run]) -> str:
    """Over the runs: the long stalls at the knee / past it, and the longest of them."""
    knee = [r.stalls_at_knee for r in runs if r.stalls_at_knee is not None]
    past = [r.stalls_past_it for r in runs if r.stalls_past_it is not None]
    if not knee and not past:
        return "-"
    longest = max((ms for n, ms, _ in knee + past if n), default=None)  # the longest of the 5+ ms ones
    waits = (_span([w for *_, w in knee], 0), _span([w for *_, w in past], 0))
    return (f"{_span([n for n, *_ in knee], 0)} / {_span([n for n, *_ in past], 0)}"
            + (f" (longest {longest:.0f} ms)" if longest is not None else "")
            + (f"; CPU wait {waits[0]} / {waits[1]} %" if waits != ("-", "-") else ""))


def _calls(runs: list[Run]) -> str:
    """Requests per call against the cap, each instance's cycle and its busy share of it, over the runs."""
    got = [r.cycle for r in runs if r.cycle is not None]
    if not got:
        return "-"
    caps = {c.batch_cap for c in got}
    cap = f" of {caps.pop()}" if len(caps) == 1 and None not in caps else ""
    busy = _span([100 * c.busy_share if c.busy_share is not None else None for c in got], 0)
    return f"{_span([c.requests_per_call for c in got], 1)}{cap}, every {_span([c.cycle_ms for c in got], 1)} ms, busy {busy} %"


def summarize(folder: Path) -> list[Setting]:
    """Every ``<setting>-<round>/bench.json`` under ``folder`` (or its ``runs/``), by setting, in the order
    the settings first appear by name."""
    root = folder / "runs" if (folder / "runs").is_dir() else folder
    settings: dict[str, Setting] = {}
    for path in sorted(p.parent for p in root.glob("*/bench.json")):
        match = _RUN.match(path.name)
        name = match["setting"] if match else path.name
        settings.setdefault(name, Setting(name)).runs.append(read_run(path))
    return list(settings.values())


def _handover(runs: list[Run]) -> str:
    """The hand-over per request over the runs, and where the runs recorded them its three parts."""
    parts = [r.handover_parts for r in runs if r.handover_parts is not None]
    split = " (staging {}, the stub's side {}, responses {})".format(
        *(_span([p[i] for p in parts]) for i in range(3))) if parts else ""
    return _span([r.handover_ms_per_request for r in runs]) + split


def _span(values: list[float | None], digits: int = 3) -> str:
    got = [v for v in values if v is not None]
    return f"{min(got):.{digits}f}-{max(got):.{digits}f}" if got else "-"


def _cores(runs: list[Run]) -> str:
    capacity = _span([r.host_capacity for r in runs], 1)
    return _span([r.cores_busy for r in runs], 1) + (f" ({capacity})" if capacity != "-" else "")


def _busiest(runs: list[Run]) -> str:
    """The busiest thread's share of a core over the runs, and whose it was in the run where it was highest."""
    got = [r for r in runs if r.busiest_thread is not None]
    if not got:
        return "-"
    top = max(got, key=lambda r: r.busiest_thread or 0.0)
    return f"{_span([r.busiest_thread for r in got], 2)} ({top.busiest_role.split(':', 1)[-1]})"


def markdown(settings: list[Setting]) -> str:
    """The table the docs carry: one row per setting."""
    lines = ["| setting | req/s at the SLO, by round | median [range] | read per row (ms) | tokenize per row (ms) "
             "| stubs' CPU per request (ms) | load generators' CPU per request (ms) | computed/useful "
             "| cores busy at the knee (host's capacity) | busiest thread at the knee (core) "
             "| the encoder's calls at the knee: requests (of the cap), each instance's cycle, busy "
             "| hand-over per request (ms) | GPU per row at the knee: busy / the launches alone (ms) "
             "| host stalls 5+ ms at the knee / the first level past it | host workload (ms) | start-up (s) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in settings:
        rates = s.spread
        rounds = " / ".join("-" if r.rps is None else f"{r.rps:,.0f}{'+' if r.floor else ''}" for r in s.by_round)
        lines.append(
            f"| {s.name} | {rounds} | **{s.median:,.0f}** [{rates.min or 0:,.0f}-"
            f"{rates.max or 0:,.0f}] | {_span([r.read_per_row for r in s.runs])} | {_span([r.tokenize_per_row for r in s.runs])} "
            f"| {_span([r.stub_ms_per_request for r in s.runs])} | {_span([r.load_ms_per_request for r in s.runs])} "
            f"| {_span([r.computed_per_useful for r in s.runs], 2)} | {_cores(s.runs)} | {_busiest(s.runs)} "
            f"| {_calls(s.runs)} | {_handover(s.runs)} "
            f"| {_span([r.gpu_busy_per_row for r in s.runs], 4)} / {_span([r.gpu_alone_per_row for r in s.runs], 4)} "
            f"| {_stall_cells(s.runs)} | {_span([r.host_ms for r in s.runs], 1)} "
            f"| {_span([r.startup_s for r in s.runs], 0)} |")
    lines += _against_references(settings)
    if any(r.floor for s in settings for r in s.runs):
        lines += ["", "\\+ a floor of the knee: no level above it missed (the ladder reached --max-rate, or the run's "
                  "budget ended first)."]
    return "\n".join(lines) + "\n"


def _against_references(settings: list[Setting]) -> list[str]:
    """Each bundle setting's median over each reference's (the ceiling, the peer: measured in the same
    rounds on the same host), and round by round where both ran in it."""
    lines: list[str] = []
    for ref in (s for s in settings if s.system != "bundle"):
        ref_rounds = {r.round: r.rps for r in ref.runs if r.rps}  # a failed reference run is not a zero
        if not ref_rounds:
            continue
        median = ref.median
        what = "of the ceiling" if ref.system == "ceiling" else "over the peer"
        lines.append(f"- {ref.name} (median of {len(ref_rounds)}: {median:,.0f} req/s): " + "; ".join(
            f"{s.name} {s.median / median:.2f} {what} (by round: " + " / ".join(
                f"{r.rps / ref_rounds[r.round]:.2f}" if r.rps is not None and r.round in ref_rounds else "-"
                for r in s.by_round) + ")"
            for s in settings if s.system == "bundle"))
    return ["", *lines] if lines else []


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="a folder of <setting>-<round>/bench.json (or one with runs/)")
    args = parser.parse_args(argv)
    print(markdown(summarize(args.folder)), end="")


if __name__ == "__main__":
    main()
