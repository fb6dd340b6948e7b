"""The benchmark's outputs: ``bench.json`` (everything), ``bench.md`` (tables), ``bench.png`` (p99 vs
offered load per model and throughput at the SLO per system), ``logs.tar.gz`` (server and load
generator logs, manifests, plans, configs, encoder statistics, the traffic sample), and the console
summary that ends with the ``bundle/naive``, ``bundle/peer`` and ``bundle/ceiling`` ratios."""

from __future__ import annotations

import io
import math
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tritonbundle.files import write_json

MAX_LOG_BYTES = 4 << 20


def _f(value: Any, spec: str = ".1f", none: str = "-") -> str:
    if value is None:
        return none
    if value == "inf" or (isinstance(value, float) and math.isinf(value)):
        return "inf"
    try:
        return format(float(value), spec)
    except (TypeError, ValueError):
        return str(value)


def _best_step(system: dict[str, Any]) -> dict[str, Any] | None:
    sweep = system.get("sweep") or {}
    return sweep.get("best")


def summary_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for name, entry in result.get("models", {}).items():
        for system, s in entry.get("systems", {}).items():
            best = _best_step(s) or {}
            row = {
                "model": name, "system": system, "status": s.get("status"),
                "rps_at_slo": s.get("best_rps"), "p50_ms": best.get("p50_ms"), "p99_ms": best.get("p99_ms"),
                "gpu_util": best.get("extra", {}).get("gpu_util_mean") if best else s.get("gpu_util_mean"),
                "computed_per_useful": s.get("computed_per_useful"), "error": s.get("error"),
                "range": _range(s.get("repeats")),
            }
            if system == "ceiling" and s.get("best"):
                row["p50_ms"] = None
                row["p99_ms"] = s["best"].get("worst_batch_ms")
                row["note"] = f"batch {s['best']['batch']}; p99 column: slowest batch"
            rows.append(row)
    return rows


def _range(repeats: dict[str, Any] | None) -> str:
    """"6,512-7,430 (3 runs, 13 %)" for a repeated system; "" for one run."""
    if not repeats:
        return ""
    failed = f", {repeats['failed']} failed" if repeats.get("failed") else ""
    if repeats.get("median") is None:
        return f"({repeats['runs']} runs{failed})"
    return (f"{repeats['min']:,.0f}-{repeats['max']:,.0f} ({repeats['runs']} runs{failed}, "
            f"spread {_f(repeats.get('spread_pct'), '.0f')} %)")


def console_table(result: dict[str, Any]) -> str:
    slo = result.get("options", {}).get("slo_ms")
    lines = [f"{'model':<10} {'system':<8} {'req/s @p99<=' + _f(slo, 'g') + 'ms':>18} {'p50 ms':>8} {'p99 ms':>8} "
             f"{'GPU %':>6} {'comp/useful':>11}  status"]
    for r in summary_rows(result):
        status = r["status"] if r["status"] == "ok" else f"{r['status']}: {str(r.get('error') or '')[:60]}"
        lines.append(f"{r['model']:<10} {r['system']:<8} {_f(r['rps_at_slo']):>18} {_f(r['p50_ms']):>8} {_f(r['p99_ms']):>8} "
                     f"{_f(r['gpu_util'], '.0f'):>6} {_f(r['computed_per_useful'], '.2f'):>11}  {status}"
                     + (f"; median of {r['range']}" if r["range"] else ""))
    return "\n".join(lines)


def ratio_lines(result: dict[str, Any]) -> list[str]:
    out = []
    for name, entry in result.get("models", {}).items():
        r = entry.get("ratios") or {}
        value = _ratio_text(r)
        rounds = f" (medians of {r['rounds']} rounds, [range])" if r.get("rounds", 1) > 1 else ""
        out.append(f"{name}{rounds}: bundle/naive = {value('bundle_over_naive')} (target >= 8)   "
                   f"bundle/peer = {value('bundle_over_peer')} (target >= 10)   "
                   f"bundle/ceiling = {value('bundle_over_ceiling')} (target >= 0.75)   "
                   f"computed/useful = {_f(r.get('computed_per_useful'), '.2f')} (target <= 1.15)")
    return out


def _ratio_text(ratios: dict[str, Any]) -> Callable[[str], str]:
    ranges = ratios.get("ranges") or {}

    def value(key: str) -> str:
        low_high = ranges.get(key)
        return _f(ratios.get(key), ".2f") + (f" [{low_high[0]:.2f}-{low_high[1]:.2f}]" if low_high else "")

    return value


def markdown(result: dict[str, Any]) -> str:
    env = result.get("environment", {})
    gpu = env.get("gpu") or {}
    opts = result.get("options", {})
    v = env.get("versions", {})
    t = result.get("traffic", {})
    md = [
        "# tritonbundle bench gpu", "",
        f"- date: {env.get('date')}  (elapsed {result.get('elapsed_s')} s, status {result.get('status')})",
        f"- device: {opts.get('device')}; GPU: {gpu.get('name', '-')}, driver {gpu.get('driver', '-')}, "
        f"{gpu.get('memory_mib', '-')} MiB; CPUs: {env.get('cpus')}",
        "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
        f"- command: `{result.get('command')}`",
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
        status = r["status"] if r["status"] == "ok" else f"{r['status']}: {str(r.get('error') or '')[:120]}"
        if r.get("note"):
            status += f" ({r['note']})"
        md.append(f"| {r['model']} | {r['system']} | {_f(r['rps_at_slo'])} | {r['range'] or '-'} | {_f(r['p50_ms'])} | {_f(r['p99_ms'])} | "
                  f"{_f(r['gpu_util'], '.0f')} | {_f(r['computed_per_useful'], '.2f')} | {status} |")
    md += ["", "## Ratios and targets", ""] + [f"- {line}" for line in ratio_lines(result)]
    for name, entry in result.get("models", {}).items():
        md += ["", f"## {name}: {entry.get('description')}", ""]
        build = entry.get("build", {})
        if build.get("status") == "ok":
            md.append(f"- repository: padding targets {build.get('padding_targets')}, batch buckets {build.get('batch_buckets')}, "
                      f"plan's computed/useful (sequence padding) {_f(build.get('plan_computed_per_useful'), '.3f')}")
        else:
            md.append(f"- build failed: {build.get('error')}")
        md += _fixed_loads(entry)
        ceiling = entry.get("systems", {}).get("ceiling", {})
        if ceiling.get("per_batch"):
            md += ["", f"Engine ceiling per batch size ({ceiling.get('mode', '-')}; every launch full, rows at their "
                   "padding targets):", "",
                   "| batch | req/s | useful tokens/s | computed tokens/s | slowest batch ms | fits SLO |", "|---:|---:|---:|---:|---:|---|"]
            for row in ceiling["per_batch"]:
                md.append(f"| {row['batch']} | {_f(row['requests_per_s'])} | {_f(row['useful_tokens_per_s'], '.0f')} | "
                          f"{_f(row['computed_tokens_per_s'], '.0f')} | {_f(row['worst_batch_ms'], '.2f')} | {row['feasible']} |")
            if ceiling.get("fixed_shape"):
                fs = ceiling["fixed_shape"]
                md.append(f"\nFixed shape {fs['batch']}x{fs['length']}: {_f(fs['ms'], '.3f')} ms, {_f(fs['tokens_per_s'], '.0f')} tokens/s.")
        for system in ("naive", "peer", "bundle"):
            c = (entry.get("systems", {}).get(system) or {}).get("correctness")
            if c:
                at_once = "".join(f"; {what}: {a['texts']} requests from {a['callers']} callers at once, min cosine "
                                  f"{_f(a['min_cosine'], '.5f')}" for what, a in
                                  (("before the sweep", c.get("at_once")), ("after it", c.get("after_sweep"))) if a)
                md.append(f"\n{system}: answers checked against the FP32 reference on {c['texts']} texts, "
                          f"min cosine {_f(c['min_cosine'], '.5f')}{at_once}.")
        peer = entry.get("systems", {}).get("peer") or {}
        if peer.get("settings"):
            md.append(f"\npeer: {peer.get('system')} with " + ", ".join(f"{k}={v}" for k, v in peer["settings"].items())
                      + "; changed from its defaults: " + "; ".join(peer.get("changed") or []))
        bundle = entry.get("systems", {}).get("bundle") or {}
        for inst in bundle.get("encoder_instances") or []:
            md.append(f"\nencoder instance {inst.get('instance')}: {inst.get('device')}, {inst.get('precision')}, "
                      f"CUDA graphs {inst.get('cuda_graphs')} ({inst.get('graphs')} captured in {inst.get('prepare_s')} s)"
                      + (f", graph capture failed: {inst.get('graph_error')}" if inst.get("graph_error") else ""))
        for down in bundle.get("went_down") or []:
            md.append(f"\nbundle: tritonserver went down at {_f(down['offered_rps'], ',.0f')} req/s offered ({down['why']}); "
                      f"restarted in {_f(down.get('restart_s'), '.1f')} s, the level counts as failed.")
        b = bundle.get("breakdown")
        if b:
            md += ["", f"Where the bundle's time goes at {_f(b.get('at_offered_rps'))} req/s offered "
                   f"({_f(b.get('achieved_rps'))} answered/s):", ""]
            md.append(f"- client-side mean latency {_f(b.get('client_mean_ms'), '.2f')} ms (p99 {_f(b.get('client_p99_ms'), '.2f')}); "
                      f"ensemble time inside Triton {_f(b.get('ensemble_request_ms'), '.2f')} ms; client + gRPC + frontend "
                      f"{_f(b.get('client_grpc_ms'), '.2f')} ms; load generators late by {_f(b.get('client_lag_mean_ms'), '.2f')} ms")
            for role in ("tokenizer", "encoder"):
                x = b.get(role)
                if x:
                    md.append(f"- {role}: queue {_f(x.get('queue_ms_per_request'), '.2f')} ms, compute "
                              f"{_f(x.get('compute_ms_per_request'), '.2f')} ms per request, average batch {_f(x.get('avg_batch_size'), '.1f')}")
            e = b.get("encoder_execute_ms")
            if e:
                md.append("- encoder execute() per call (ms): " + ", ".join(f"{k} {_f(val, '.3f')}" for k, val in e.items())
                          + f"; {_f(b.get('encoder_rows_per_execute'), '.1f')} rows and "
                          f"{_f(b.get('encoder_launches_per_execute'), '.1f')} graph launches per call")
            calls = b.get("encoder_call_ms") or {}
            if any(v.get("p50") is not None for v in calls.values()):
                md.append("- encoder per call, p50 / p99 (up to the histogram's bucket edge, ms): " + ", ".join(
                    f"{name.removesuffix('_ms')} {_f(v.get('p50'), 'g')} / {_f(v.get('p99'), 'g')}" for name, v in calls.items()))
            p = b.get("padding") or {}
            md.append(f"- tokens: computed/useful {_f(p.get('computed_per_useful'), '.3f')} "
                      f"(sequence padding alone {_f(p.get('seq_padded_per_useful'), '.3f')})")
            cores = b.get("cpu_cores") or {}
            if cores:
                md.append("- CPU cores busy: " + ", ".join(f"{k} {val:.2f}" for k, val in sorted(cores.items(), key=lambda kv: -kv[1])))
            md.append(f"- GPU utilisation {_f(b.get('gpu_util_mean'), '.0f')} %")
            for h in b.get("hints") or []:
                md.append(f"- reading: {h}")
    md += ["", "Notes: latencies are measured by the client from each request's scheduled (Poisson) arrival time; "
           "failed or unanswered requests count as infinite latency. BERT-base weights are random (seed 0): "
           "its embeddings are meaningless, only its speed is measured.", ""]
    return "\n".join(md)


def _fixed_loads(entry: dict[str, Any]) -> list[str]:
    levels: dict[float, dict[str, dict[str, Any]]] = {}
    for system in ("naive", "peer", "bundle"):
        for s in ((entry.get("systems", {}).get(system) or {}).get("sweep") or {}).get("steps", []):
            levels.setdefault(round(float(s["offered_rps"]), 1), {})[system] = s
    if not levels:
        return []
    out = ["", "Latency at each offered load (p50 / p99 ms; answered req/s):", "",
           "| offered req/s | naive | peer | bundle |", "|---:|---|---|---|"]
    for rate in sorted(levels):
        cells = []
        for system in ("naive", "peer", "bundle"):
            s = levels[rate].get(system)
            cells.append(f"{_f(s['p50_ms'])} / {_f(s['p99_ms'])}; {_f(s['achieved_rps'])}{'' if s['passed'] else ' (missed)'}"
                         if s else "-")
        out.append(f"| {rate:g} | {cells[0]} | {cells[1]} | {cells[2]} |")
    return out


def plot(result: dict[str, Any], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    models = list(result.get("models", {}).items())
    if not models:
        return None
    slo = result.get("options", {}).get("slo_ms", 50)
    fig, axes = plt.subplots(2, len(models), figsize=(6.5 * len(models), 8), dpi=100, squeeze=False)
    colors = {"naive": "#C44E52", "peer": "#8172B2", "bundle": "#4C72B0", "ceiling": "#55A868"}
    for col, (name, entry) in enumerate(models):
        ax = axes[0][col]
        for system in ("naive", "peer", "bundle"):
            steps = ((entry.get("systems", {}).get(system) or {}).get("sweep") or {}).get("steps", [])
            pts = sorted((float(s["offered_rps"]), s["p99_ms"]) for s in steps)
            if pts:
                xs = [p[0] for p in pts]
                ys = [float(p[1]) if p[1] not in (None, "inf") else 10 * slo for p in pts]
                ax.plot(xs, ys, "o-", color=colors[system], label=f"{system} p99")
        ceiling = (entry.get("systems", {}).get("ceiling") or {}).get("best_rps")
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
            s = entry.get("systems", {}).get(system) or {}
            names.append(f"{system}\n({s.get('status', '-')})")
            values.append(float(s.get("best_rps") or 0.0))
            bar_colors.append(colors[system])
        ax2.bar(names, values, color=bar_colors)
        for i, value in enumerate(values):
            ax2.text(i, value, f"{value:,.0f}", ha="center", va="bottom", fontsize=9)
        r = entry.get("ratios") or {}
        ax2.set_title(f"req/s at p99 <= {slo:g} ms; bundle/naive {_f(r.get('bundle_over_naive'), '.1f')}, "
                      f"bundle/peer {_f(r.get('bundle_over_peer'), '.1f')}, "
                      f"bundle/ceiling {_f(r.get('bundle_over_ceiling'), '.2f')}", fontsize=9)
        ax2.set_ylabel("requests/s")
    gpu = (result.get("environment", {}).get("gpu") or {}).get("name", result.get("options", {}).get("device"))
    fig.suptitle(f"tritonbundle bench: {gpu}, {result.get('environment', {}).get('date', '')}", fontsize=11)
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


def write_all(result: dict[str, Any], out: Path, work: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    files = [write_json(result, out / "bench.json")]
    (out / "bench.md").write_text(markdown(result))
    files.append(out / "bench.md")
    try:
        png = plot(result, out / "bench.png")
        if png:
            files.append(png)
    except Exception as e:  # noqa: BLE001 - a plot must not lose the numbers
        result.setdefault("report_errors", []).append(f"plot: {e}")
    try:
        files.append(logs_tarball(work, out / "logs.tar.gz"))
    except Exception as e:  # noqa: BLE001
        result.setdefault("report_errors", []).append(f"logs: {e}")
    if result.get("report_errors"):
        write_json(result, out / "bench.json")
    return files


def print_summary(result: dict[str, Any]) -> None:
    print()
    print(console_table(result))
    print()
    for line in ratio_lines(result):
        print(line)
