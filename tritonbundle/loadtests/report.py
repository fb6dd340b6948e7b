"""Load-test results: the JSON summary, SLO gates, PNG plots and sweep selection (no Locust import)."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PERCENTILES = (0.5, 0.9, 0.95, 0.99)


def _entry(entry: Any, duration_s: float) -> dict[str, Any]:
    requests = int(entry.num_requests)
    failures = int(entry.num_failures)
    row: dict[str, Any] = {
        "requests": requests,
        "failures": failures,
        "failure_ratio": failures / (requests + failures) if requests + failures else 0.0,
        "throughput_rps": requests / duration_s if duration_s > 0 else 0.0,
        "avg_ms": float(entry.avg_response_time) if requests else None,
    }
    for p in PERCENTILES:
        row[f"p{int(p * 100)}_ms"] = float(entry.get_response_time_percentile(p)) if requests else None
    return row


def summarize(stats: Any, settings: Any) -> dict[str, Any]:
    """Requests, failures, throughput and p50/p90/p95/p99 per request type (protocol) and name."""
    start = stats.total.start_time
    end = stats.total.last_request_timestamp or start
    duration = max(end - start, 1e-9)
    by_type: dict[str, Any] = {}
    by_name: dict[str, Any] = {}
    for (name, method), entry in stats.entries.items():
        by_name[f"{method} {name}"] = _entry(entry, duration)
    # Locust keys entries by (name, method); per protocol totals aggregate over names.
    for method in sorted({m for _, m in stats.entries}):
        from locust.stats import StatsEntry

        total = StatsEntry(stats, method, method, use_response_times_cache=False)
        for (_, m), entry in stats.entries.items():
            if m == method:
                total.extend(entry)
        by_type[method] = _entry(total, duration)
    return {
        "settings": {k: v for k, v in vars(settings).items() if k != "slo"} | {"slo": settings.slo.to_json()},
        "duration_s": duration,
        "total": _entry(stats.total, duration),
        "by_protocol": by_type,
        "by_request": by_name,
        "errors": [{"method": e.method, "name": e.name, "error": str(e.error), "occurrences": e.occurrences}
                   for e in stats.errors.values()],
    }


def evaluate_gates(summary: dict[str, Any], slo: Any) -> dict[str, Any]:
    """Check every protocol's p95/p99 and failure ratio against the SLO."""
    failures: list[str] = []
    groups = summary["by_protocol"] or {"total": summary["total"]}
    for name, row in groups.items():
        if row["requests"] == 0:
            failures.append(f"{name}: no successful requests")
            continue
        if slo.p95_ms is not None and row["p95_ms"] > slo.p95_ms:
            failures.append(f"{name}: p95 {row['p95_ms']:.0f} ms > SLO {slo.p95_ms:g} ms")
        if slo.p99_ms is not None and row["p99_ms"] > slo.p99_ms:
            failures.append(f"{name}: p99 {row['p99_ms']:.0f} ms > SLO {slo.p99_ms:g} ms")
        if row["failure_ratio"] > slo.max_failure_ratio:
            failures.append(f"{name}: failure ratio {row['failure_ratio']:.3f} > {slo.max_failure_ratio:g}")
    return {"passed": not failures, "failures": failures, "slo": slo.to_json()}


def read_history(path: Path) -> list[dict[str, Any]]:
    """The aggregated rows of Locust's ``*_stats_history.csv``."""
    if not path.exists():
        return []
    rows = []
    with path.open() as f:
        for row in csv.DictReader(f):
            if row.get("Name") != "Aggregated":
                continue
            rows.append(row)
    return rows


def _float(value: str | None) -> float:
    try:
        out = float(value or "nan")
    except ValueError:
        return math.nan
    return out


def plot(report_dir: Path, summary: dict[str, Any], prefix: str = "locust") -> list[Path]:
    """throughput.png, latency.png (percentiles over time) and server.png (Triton's view)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    history = read_history(report_dir / f"{prefix}_stats_history.csv")
    written = []
    if history:
        t0 = _float(history[0]["Timestamp"])
        t = [_float(r["Timestamp"]) - t0 for r in history]
        fig, ax = plt.subplots(figsize=(9, 4), dpi=100)
        ax.plot(t, [_float(r["Requests/s"]) for r in history], label="requests/s")
        ax.plot(t, [_float(r["Failures/s"]) for r in history], label="failures/s", color="#C44E52")
        ax2 = ax.twinx()
        ax2.plot(t, [_float(r["User Count"]) for r in history], color="grey", linestyle=":", label="users")
        ax.set_xlabel("seconds")
        ax.set_ylabel("requests / s")
        ax2.set_ylabel("users")
        ax.set_title("throughput")
        ax.legend(loc="upper left")
        fig.tight_layout()
        written.append(report_dir / "throughput.png")
        fig.savefig(written[-1])
        plt.close(fig)

        fig, ax = plt.subplots(figsize=(9, 4), dpi=100)
        for column in ("50%", "95%", "99%"):
            ax.plot(t, [_float(r.get(column)) for r in history], label=f"p{column.rstrip('%')}")
        ax.set_xlabel("seconds")
        ax.set_ylabel("latency (ms)")
        ax.set_title("latency percentiles (all requests)")
        ax.legend()
        fig.tight_layout()
        written.append(report_dir / "latency.png")
        fig.savefig(written[-1])
        plt.close(fig)
    timeline = summary.get("server_timeline") or {}
    if timeline:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4), dpi=100)
        for model, rows in timeline.items():
            if not rows:
                continue
            t0 = rows[0]["t"]
            ts = [r["t"] - t0 for r in rows]
            axes[0].plot(ts, [r["queue_ms"] for r in rows], label=f"{model} queue")
            axes[0].plot(ts, [r["compute_ms"] for r in rows], linestyle="--", label=f"{model} compute")
            axes[1].plot(ts, [r["avg_batch"] for r in rows], label=model)
        axes[0].set_title("Triton: queue vs compute time per request (ms)")
        axes[1].set_title("Triton: average batch size")
        for ax in axes:
            ax.set_xlabel("seconds")
            ax.legend(fontsize=7)
        fig.tight_layout()
        written.append(report_dir / "server.png")
        fig.savefig(written[-1])
        plt.close(fig)
    return written


def best_level(results: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The sweep level with the highest throughput among those that met the SLO."""
    passing = [r for r in results if r["gates"]["passed"]]
    return max(passing, key=lambda r: r["total"]["throughput_rps"]) if passing else None


def plot_sweep(path: Path, results: Sequence[dict[str, Any]], slo_ms: float | None, level_name: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = [r["level"] for r in results]
    fig, ax = plt.subplots(figsize=(8, 4), dpi=100)
    ax.plot(levels, [r["total"]["throughput_rps"] for r in results], marker="o", label="throughput (req/s)")
    ax.set_xlabel(level_name)
    ax.set_ylabel("requests / s")
    ax2 = ax.twinx()
    ax2.plot(levels, [r["total"]["p99_ms"] or math.nan for r in results], marker="s", color="#C44E52", label="p99 (ms)")
    if slo_ms:
        ax2.axhline(slo_ms, color="#C44E52", linestyle=":", label=f"SLO {slo_ms:g} ms")
    ax2.set_ylabel("p99 latency (ms)")
    fig.legend(loc="upper left")
    ax.set_title("sweep: throughput and p99 per level")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
