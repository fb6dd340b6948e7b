"""The benchmark's outputs: ``bench.json`` (everything), ``bench.md`` (tables), ``bench.png`` (p99 vs
offered load per model and throughput at the SLO per system), ``logs.tar.gz`` (server and load
generator logs, manifests, plans, configs, encoder statistics, the traffic sample), and the console
summary that ends with the ``bundle/naive``, ``bundle/peer`` and ``bundle/ceiling`` ratios."""

from __future__ import annotations

import dataclasses
import io
import math
import tarfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tritonbundle.bench.levels_md import fmt as _f
from tritonbundle.bench.levels_md import level_lines
from tritonbundle.bench.levels_md import shown_ms as _ms
from tritonbundle.bench.records import BundleResult, CeilingResult, PeerResult, ServedResult, Spread
from tritonbundle.bench.result import BenchResult, ModelResult, Ratios
from tritonbundle.files import write_json
from tritonbundle.measure import host

MAX_LOG_BYTES = 4 << 20


@dataclass(frozen=True)
class Row:
    """One line of the throughput table: a system of a model."""

    model: str
    system: str
    status: str
    rps_at_slo: float | None
    p50_ms: float | None
    p99_ms: float | None
    gpu_util: float | None
    computed_per_useful: float | None
    error: str | None
    range: str
    note: str = ""


def summary_rows(result: BenchResult) -> list[Row]:
    rows = []
    for name, entry in result.models.items():
        for system, s in entry.systems.items():
            best = s.sweep.best if isinstance(s, ServedResult) else None
            gpu = best.extra.get("gpu_util_mean") if best else (s.gpu_util_mean if isinstance(s, CeilingResult) else None)
            row = Row(model=name, system=system, status=s.status, rps_at_slo=s.best_rps,
                      p50_ms=_ms(best.p50_ms) if best else None, p99_ms=_ms(best.p99_ms) if best else None,
                      gpu_util=gpu, computed_per_useful=s.computed_per_useful, error=s.error, range=_range(s.repeats))
            if isinstance(s, ServedResult) and s.sweep.is_floor:  # no level above the best missed
                row = dataclasses.replace(row, note=f"a floor: the search stopped ({s.sweep.stopped}) before a level missed")
            if isinstance(s, CeilingResult) and s.best:
                row = dataclasses.replace(row, p50_ms=None, p99_ms=s.best.worst_batch_ms,
                                          note=f"batch {s.best.batch}; p99 column: slowest batch")
            rows.append(row)
    return rows


def _range(repeats: Spread | None) -> str:
    """"6,512-7,430 (3 runs, 13 %)" for a repeated system; "" for one run."""
    if not repeats:
        return ""
    failed = f", {repeats.failed} failed" if repeats.failed else ""
    if repeats.median is None or repeats.min is None or repeats.max is None:
        return f"({repeats.runs} runs{failed})"
    return (f"{repeats.min:,.0f}-{repeats.max:,.0f} ({repeats.runs} runs{failed}, "
            f"spread {_f(repeats.spread_pct, '.0f')} %)")


def console_table(result: BenchResult) -> str:
    slo = result.options.get("slo_ms")
    lines = [f"{'model':<10} {'system':<8} {'req/s @p99<=' + _f(slo, 'g') + 'ms':>18} {'p50 ms':>8} {'p99 ms':>8} "
             f"{'GPU %':>6} {'comp/useful':>11}  status"]
    for r in summary_rows(result):
        status = r.status if r.status == "ok" else f"{r.status}: {str(r.error or '')[:60]}"
        status += f" ({r.note})" if r.note.startswith("a floor") else ""
        lines.append(f"{r.model:<10} {r.system:<8} {_f(r.rps_at_slo):>18} {_f(r.p50_ms):>8} {_f(r.p99_ms):>8} "
                     f"{_f(r.gpu_util, '.0f'):>6} {_f(r.computed_per_useful, '.2f'):>11}  {status}"
                     + (f"; median of {r.range}" if r.range else ""))
    return "\n".join(lines)


def ratio_lines(result: BenchResult) -> list[str]:
    out = []
    for name, entry in result.models.items():
        r = entry.ratios or Ratios()
        value = _ratio_text(r)
        rounds = f" (medians of {r.rounds} rounds, [range])" if (r.rounds or 1) > 1 else ""
        out.append(f"{name}{rounds}: bundle/naive = {value('bundle_over_naive')} (target >= 8)   "
                   f"bundle/peer = {value('bundle_over_peer')} (target >= 10)   "
                   f"bundle/ceiling = {value('bundle_over_ceiling')} (target >= {r.ceiling_bar:g})   "
                   f"computed/useful = {_f(r.computed_per_useful, '.2f')} (target <= 1.15)")
    return out


def _ratio_text(ratios: Ratios) -> Callable[[str], str]:
    ranges = ratios.ranges or {}

    def value(key: str) -> str:
        low_high = ranges.get(key)
        return _f(ratios.value(key), ".2f") + (f" [{low_high[0]:.2f}-{low_high[1]:.2f}]" if low_high else "")

    return value


def markdown(result: BenchResult) -> str:
    env = result.environment
    speed = host.HostSpeed.from_json(env.get("host_speed"))
    gpu = env.get("gpu") or {}
    opts = result.options
    v = env.get("versions", {})
    t = result.traffic or {}
    md = [
        "# tritonbundle bench gpu", "",
        f"- date: {env.get('date')}  (elapsed {result.elapsed_s} s, status {result.status})",
        f"- device: {opts.get('device')}; GPU: {gpu.get('name', '-')}, driver {gpu.get('driver', '-')}, "
        f"{gpu.get('memory_mib', '-')} MiB; CPUs: {env.get('cpus')}"
        + (f" ({env['physical_cores']} physical cores)" if env.get("physical_cores") else ""),
        *([f"- GPU sharing (the bundle's instances): {env['gpu_sharing']}"] if env.get("gpu_sharing") else []),
        *([f"- host speed: {speed.describe()}"] if env.get("host_speed") else []),
        *([f"- the host-stall probe did not run: {env['stall_probe_error']}"] if env.get("stall_probe_error") else []),
        *([f"- the bundle's load generators send gRPC requests: {env['load_sender']} (TRITONBUNDLE_LOAD_SENDER)"
           if env["load_sender"] != "http" else
           "- the bundle's load generators send HTTP requests, built once (TRITONBUNDLE_LOAD_SENDER=http)"]
          if env.get("load_sender") else []),
        "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
        f"- command: `{result.command}`",
        f"- traffic: {t.get('source')}: {int(t.get('requests', 0))} requests, mean {_f(t.get('mean_tokens'))} tokens, "
        f"P50 {_f(t.get('p50_tokens'), '.0f')}, P95 {_f(t.get('p95_tokens'), '.0f')}, max {_f(t.get('max_tokens'), '.0f')}",
        f"- SLO: p99 <= {opts.get('slo_ms')} ms; open model (Poisson arrivals), ladder from {opts.get('ladder_start')} req/s"
        + "".join(f" ({k} from {val})" for k, val in (opts.get("start_rates") or {}).items()) + " "
        f"x{opts.get('ladder_factor')} then {opts.get('refine')} bisections",
        "- the bundle's clients send " + ("token rows straight to the encoder (tokenized on the client side; no "
                                          "tokenizer stage)" if opts.get("input") == "tokens" else "texts (the ensemble tokenizes)"),
        "", "## Throughput at the SLO", "",
        "| model | system | req/s at SLO | range over rounds | p50 ms | p99 ms | GPU util % | computed/useful tokens | status |",
        "|---|---|---:|---|---:|---:|---:|---:|---|",
    ]
    for r in summary_rows(result):
        status = r.status if r.status == "ok" else f"{r.status}: {str(r.error or '')[:120]}"
        if r.note:
            status += f" ({r.note})"
        md.append(f"| {r.model} | {r.system} | {_f(r.rps_at_slo)} | {r.range or '-'} | {_f(r.p50_ms)} | {_f(r.p99_ms)} | "
                  f"{_f(r.gpu_util, '.0f')} | {_f(r.computed_per_useful, '.2f')} | {status} |")
    md += ["", "## Ratios and targets", ""] + [f"- {line}" for line in ratio_lines(result)]
    for name, entry in result.models.items():
        md += ["", f"## {name}: {entry.description}", ""]
        md += _model_lines(entry, speed.capacity_cores())
    md += ["", "Notes: latencies are measured by the client from each request's scheduled (Poisson) arrival time; "
           "failed or unanswered requests count as infinite latency. BERT-base weights are random (seed 0): "
           "its embeddings are meaningless, only its speed is measured.", ""]
    return "\n".join(md)


def _model_lines(entry: ModelResult, capacity: float | None = None) -> list[str]:
    """A model's section: its repository, latency per load, the ceiling, the answers checks, the peer's
    settings and the bundle's instances, restarts and breakdown."""
    md = []
    build = entry.build
    if build is not None and build.status == "ok":
        md.append(f"- repository: padding targets {build.padding_targets}, batch buckets {build.batch_buckets}, "
                  f"plan's computed/useful (sequence padding) {_f(build.plan_computed_per_useful, '.3f')}")
    else:
        md.append(f"- build failed: {build.failure.error if build is not None and build.failure else None}")
    md += level_lines(entry)
    ceiling = entry.system("ceiling", CeilingResult)
    if ceiling is not None and ceiling.per_batch:
        md += ["", f"Engine ceiling per batch size ({ceiling.mode}; every launch full, rows at their "
               "padding targets):", "",
               "| batch | req/s | useful tokens/s | computed tokens/s | slowest batch ms | fits SLO |", "|---:|---:|---:|---:|---:|---|"]
        for row in ceiling.per_batch:
            md.append(f"| {row.batch} | {_f(row.requests_per_s)} | {_f(row.useful_tokens_per_s, '.0f')} | "
                      f"{_f(row.computed_tokens_per_s, '.0f')} | {_f(row.worst_batch_ms, '.2f')} | {row.feasible} |")
        if ceiling.fixed_shape:
            fs = ceiling.fixed_shape
            md.append(f"\nFixed shape {fs.batch}x{fs.length}: {_f(fs.ms, '.3f')} ms, {_f(fs.tokens_per_s, '.0f')} tokens/s.")
    for system in ("naive", "peer", "bundle"):
        served = entry.system(system, ServedResult)
        if served is not None:
            c = served.correctness
            at_once = "".join(f"; {what}: {a.texts} requests from {a.callers} callers at once, min cosine "
                              f"{_f(a.min_cosine, '.5f')}" for what, a in
                              (("before the sweep", c.at_once), ("after it", c.after_sweep)) if a)
            md.append(f"\n{system}: answers checked against the FP32 reference on {c.texts} texts, "
                      f"min cosine {_f(c.min_cosine, '.5f')}{at_once}.")
    peer = entry.system("peer", PeerResult)
    if peer is not None and peer.settings:
        md.append(f"\npeer: {peer.system} with " + ", ".join(f"{k}={v}" for k, v in peer.settings.items())
                  + "; changed from its defaults: " + "; ".join(peer.changed or []))
    bundle = entry.system("bundle", BundleResult)
    if bundle is not None:
        md += _bundle_lines(bundle, capacity)
    return md


def _timing_words(inst: dict[str, Any]) -> str:
    """How an instance timed its launch costs (engine.py, "Launch costs"); nothing from older reports."""
    if not inst.get("timings_ms") or "shape_timing" not in inst:
        return ""
    if inst["shape_timing"] != "alone":
        return "; launch costs timed concurrently (mean of replays)"
    if inst.get("timing_turn_error"):
        return f"; launch costs timed without the GPU's turn ({inst['timing_turn_error']})"
    if inst.get("timings_shared"):
        return f"; launch costs another instance timed alone, read after {_f(inst.get('timing_wait_s'), '.1f')} s waiting"
    held = "" if inst.get("timing_turn_held") else ", the turn timed out"
    return f"; launch costs timed alone after {_f(inst.get('timing_wait_s'), '.1f')} s waiting{held}"


def _launch_cost_spread(instances: list[dict[str, Any]]) -> list[str]:
    """The largest shape's launch time as each instance measured it: instances that timed while others
    used the GPU disagree (and plan with costs that are not the GPU's). Reports from before the engine
    said how it timed them keep their markdown."""
    shapes = [inst.get("timings_ms") or {} for inst in instances]
    if len(shapes) < 2 or not all(shapes) or not all("shape_timing" in inst for inst in instances):
        return []
    largest = max(shapes[0], key=lambda k: int(k.split("x")[0]) * int(k.split("x")[1]))
    times = [t[largest] for t in shapes if largest in t]
    return [f"\nlaunch costs: {largest} took {min(times):.2f}-{max(times):.2f} ms by the {len(times)} instances' "
            f"timings (spread {100.0 * (max(times) - min(times)) / min(times):.0f} %)"]


def _bundle_lines(bundle: BundleResult, capacity: float | None = None) -> list[str]:
    """The bundle's readings at its knee; ``capacity``: the cores' worth of work the host did with all its
    CPUs busy before the run (measure/host.py), set beside the cores busy there."""
    md = []
    for inst in bundle.encoder_instances or []:
        md.append(f"\nencoder instance {inst.get('instance')}: {inst.get('device')}, {inst.get('precision')}, "
                  f"CUDA graphs {inst.get('cuda_graphs')} ({inst.get('graphs')} captured in {inst.get('prepare_s')} s)"
                  + (f", graph capture failed: {inst.get('graph_error')}" if inst.get("graph_error") else "")
                  + _timing_words(inst))
    md += _launch_cost_spread(bundle.encoder_instances or [])
    if bundle.mps_servers is not None:
        md.append(f"\nGPU sharing: mps, MPS server process(es) {bundle.mps_servers}" if bundle.mps_servers else
                  "\nGPU sharing: mps was asked for, but the instances reached no MPS server: they time-sliced the GPU")
    for down in bundle.went_down or []:
        md.append(f"\nbundle: tritonserver went down at {_f(down.offered_rps, ',.0f')} req/s offered ({down.why}); "
                  f"restarted in {_f(down.restart_s, '.1f')} s, the level counts as failed.")
    if b := bundle.breakdown:
        md += ["", f"Where the bundle's time goes at {_f(b.at_offered_rps)} req/s offered "
               f"({_f(b.achieved_rps)} answered/s):", ""]
        md.append(f"- client-side mean latency {_f(b.client_mean_ms, '.2f')} ms (p99 {_f(b.client_p99_ms, '.2f')}); "
                  f"ensemble time inside Triton {_f(b.ensemble_request_ms, '.2f')} ms; client + gRPC + frontend "
                  f"{_f(b.client_grpc_ms, '.2f')} ms; load generators late by {_f(b.client_lag_mean_ms, '.2f')} ms"
                  + ("" if b.client_loop_lag_p99_ms is None else
                     f" (p99 {_f(b.client_lag_p99_ms, '.2f')}); their event loops woke timers "
                     f"{_f(b.client_loop_lag_p99_ms, '.2f')} ms late at p99")
                  + ("" if b.client_p99_from_send_ms is None else f"; p99 from each send {_f(b.client_p99_from_send_ms, '.2f')} ms"))
        for role, x in (("tokenizer", b.tokenizer), ("encoder", b.encoder)):
            if x:
                md.append(f"- {role}: queue {_f(x.get('queue_ms_per_request'), '.2f')} ms, compute "
                          f"{_f(x.get('compute_ms_per_request'), '.2f')} ms per request, average batch {_f(x.get('avg_batch_size'), '.1f')}")
        if c := b.encoder_cycle:
            stub = (b.encoder_execute_ms or {}).get("execute")  # the rest of Triton's time: the Python backend's hand-over
            inside = "" if not stub else f", the stub's execute() {stub:.2f}" + (
                " of it" if c.handover_ms(stub) is not None else ", past it: batches in flight")
            if c.staging_ms is not None and c.responding_ms is not None:
                inside += f", staging {c.staging_ms:.2f} and responses {c.responding_ms:.2f}"
            md.append(f"- encoder instances: {c.instances}, each taking a call every {c.cycle_ms:.2f} ms (Triton's time for "
                      f"a call out of the queue: {_f(c.busy_ms, '.2f')} ms{inside}); {c.requests_per_call:.1f} requests per call, "
                      f"the cap {c.batch_cap or '-'}" + (f": at most {c.bound_rps:,.0f} req/s at this cycle with every call full" if c.bound_rps else ""))
        t = b.tokenizer_execute_ms
        if t:
            tok_calls = (b.tokenizer_call_ms or {}).get("execute_ms", {})
            md.append("- tokenizer execute() per call (ms): " + ", ".join(f"{k} {_f(val, '.3f')}" for k, val in t.items())
                      + f"; {_f(b.tokenizer_texts_per_execute, '.1f')} texts per call; p50 / p99 "
                      f"{_f(tok_calls.get('p50'), 'g')} / {_f(tok_calls.get('p99'), 'g')} (bucket edges)"
                      + (f"; Triton's compute beyond execute() {b.tokenizer_outside_ms:.3f} ms per request"
                         if b.tokenizer_outside_ms is not None else ""))
        if e := b.encoder_execute_ms:
            md.append("- encoder execute() per call (ms): " + ", ".join(f"{k} {_f(val, '.3f')}" for k, val in e.items())
                      + f"; {_f(b.encoder_rows_per_execute, '.1f')} rows and "
                      f"{_f(b.encoder_launches_per_execute, '.1f')} graph launches per call")
        if calls := {name: v for name, v in (b.encoder_call_ms or {}).items() if v.get("p50") is not None}:
            md.append("- encoder per call, p50 / p99 (up to the histogram's bucket edge, ms): " + ", ".join(
                f"{name.removesuffix('_ms')} {_f(v.get('p50'), 'g')} / {_f(v.get('p99'), 'g')}" for name, v in calls.items()))
        p = b.padding or {}
        md.append(f"- tokens: computed/useful {_f(p.get('computed_per_useful'), '.3f')} "
                  f"(sequence padding alone {_f(p.get('seq_padded_per_useful'), '.3f')})")
        cores = b.cpu_cores or {}
        if cores:
            md.append("- CPU cores busy: " + ", ".join(f"{k} {val:.2f}" for k, val in sorted(cores.items(), key=lambda kv: -kv[1]))
                      + (_against_capacity(sum(cores.values()), capacity) if capacity is not None else ""))
        if b.cpu_threads:
            md.append("- busiest threads, share of one core (thread name): " + _threads(b.cpu_threads))
        per_row = "" if b.gpu_busy_ms_per_row is None else (f"; busy {b.gpu_busy_ms_per_row:.4f} ms per row, the same "
                   f"launches alone {_f(b.gpu_alone_ms_per_row, '.4f')} (each shape as the engine timed it at start-up)")
        md.append(f"- GPU utilisation {_f(b.gpu_util_mean, '.0f')} %" + _clocks(b.gpu_clocks) + per_row)
        for h in b.hints or []:
            md.append(f"- reading: {h}")
    return md


#: Cores busy at the knee, as a share of the host's capacity, from which the host counts as full.
HOST_FULL = 0.9


def _against_capacity(busy: float, capacity: float) -> str:
    text = f"; {busy:.2f} in all, against the {capacity} cores' worth the host did with every CPU busy before the run"
    if busy >= HOST_FULL * capacity:
        text += ": the host's CPU was full at the knee (the limit may be the host's, not the server's)"
    return text


def _threads(threads: Mapping[str, Sequence[Sequence[Any]]]) -> str:
    """The server's roles' busiest threads (those past 1 % of a core), then the load generators' busiest one."""
    busy = {role: [(name, cores) for name, cores in top if cores >= 0.01] for role, top in threads.items()}
    parts = [f"{role.removeprefix('server:')} " + ", ".join(f"{cores:.2f} ({name})" for name, cores in top)
             for role, top in sorted(busy.items()) if role.startswith("server:") and top]
    loads = [(cores, name) for role, top in threads.items() if role.startswith("load") for name, cores in top]
    if loads:
        cores, name = max(loads)
        parts.append(f"load generators {cores:.2f} ({name})")
    return "; ".join(parts)


def plot(result: BenchResult, path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    models = list(result.models.items())
    if not models:
        return None
    slo = result.options.get("slo_ms", 50)
    fig, axes = plt.subplots(2, len(models), figsize=(6.5 * len(models), 8), dpi=100, squeeze=False)
    colors = {"naive": "#C44E52", "peer": "#8172B2", "bundle": "#4C72B0", "ceiling": "#55A868"}
    for col, (name, entry) in enumerate(models):
        ax = axes[0][col]
        for system in ("naive", "peer", "bundle"):
            served = entry.system(system, ServedResult)
            pts = sorted((float(s.offered_rps), s.p99_ms) for s in (served.sweep.steps if served is not None else []))
            if pts:
                xs = [p[0] for p in pts]
                ys = [float(p[1]) if math.isfinite(p[1]) else 10 * slo for p in pts]
                ax.plot(xs, ys, "o-", color=colors[system], label=f"{system} p99")
        ceiling = entry.systems["ceiling"].best_rps if "ceiling" in entry.systems else None
        if ceiling:
            ax.axvline(ceiling, color=colors["ceiling"], linestyle=":", label="engine ceiling")
        ax.axhline(slo, color="gray", linestyle="--", label=f"SLO {slo:g} ms")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("offered load (req/s)")
        ax.set_ylabel("p99 latency (ms)")
        ax.set_title(f"{name}", fontsize=10)
        ax.legend(fontsize=8)
        ax2 = axes[1][col]
        names, values, bar_colors = [], [], []
        for system in ("naive", "peer", "bundle", "ceiling"):
            s = entry.systems.get(system)
            names.append(f"{system}\n({s.status if s is not None else '-'})")
            values.append(float(s.best_rps or 0.0) if s is not None else 0.0)
            bar_colors.append(colors[system])
        ax2.bar(names, values, color=bar_colors)
        for i, value in enumerate(values):
            ax2.text(i, value, f"{value:,.0f}", ha="center", va="bottom", fontsize=9)
        r = entry.ratios or Ratios()
        ax2.set_title(f"req/s at p99 <= {slo:g} ms; bundle/naive {_f(r.bundle_over_naive, '.1f')}, "
                      f"bundle/peer {_f(r.bundle_over_peer, '.1f')}, "
                      f"bundle/ceiling {_f(r.bundle_over_ceiling, '.2f')}", fontsize=9)
        ax2.set_ylabel("requests/s")
    gpu = (result.environment.get("gpu") or {}).get("name", result.options.get("device"))
    fig.suptitle(f"tritonbundle bench: {gpu}, {result.environment.get('date', '')}", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def logs_tarball(work: Path, path: Path) -> Path:
    """Logs, manifests, plans, configs, encoder statistics and the traffic sample (no weights)."""
    keep = (".log", ".yaml", ".json", ".jsonl", ".pbtxt", ".py")
    with tarfile.open(path, "w:gz") as tar:
        for file in sorted(work.rglob("*")):
            if not file.is_file() or file.suffix not in keep or file.name.endswith(".tmp"):
                continue
            if file.suffix == ".py" and "model_repository" not in file.parts:
                continue
            arcname = str(file.relative_to(work))
            size = file.stat().st_size
            if size > MAX_LOG_BYTES:
                data = file.read_bytes()[-MAX_LOG_BYTES:]
                info = tarfile.TarInfo(arcname + ".tail")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.add(file, arcname=arcname)
    return path


def write_all(result: BenchResult, out: Path, work: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    files = [write_json(result.to_json(), out / "bench.json")]
    (out / "bench.md").write_text(markdown(result))
    files.append(out / "bench.md")
    try:
        png = plot(result, out / "bench.png")
        if png:
            files.append(png)
    except Exception as e:  # noqa: BLE001 - a plot must not lose the numbers
        result.report_errors.append(f"plot: {e}")
    try:
        files.append(logs_tarball(work, out / "logs.tar.gz"))
    except Exception as e:  # noqa: BLE001
        result.report_errors.append(f"logs: {e}")
    if result.report_errors:
        write_json(result.to_json(), out / "bench.json")
    return files


def print_summary(result: BenchResult) -> None:
    print(f"\n{console_table(result)}\n")
    for line in ratio_lines(result):
        print(line)


def _clocks(clocks: dict[str, float | None] | None) -> str:
    """``; SM clock 1,980 MHz (min 1,755), 540 W, slowed (power, heat) in 0 % of samples`` or nothing."""
    if not clocks:
        return ""
    parts = []
    if clocks.get("gpu_sm_mhz_mean") is not None:
        parts.append(f"SM clock {_f(clocks['gpu_sm_mhz_mean'], ',.0f')} MHz (min {_f(clocks.get('gpu_sm_mhz_min'), ',.0f')})")
    if clocks.get("gpu_power_w_mean") is not None:
        parts.append(f"{_f(clocks['gpu_power_w_mean'], '.0f')} W")
    if clocks.get("gpu_slowed_share") is not None:
        parts.append(f"clocks slowed by power or heat in {_f(100 * (clocks['gpu_slowed_share'] or 0), '.0f')} % of samples")
    return "; " + ", ".join(parts) if parts else ""
