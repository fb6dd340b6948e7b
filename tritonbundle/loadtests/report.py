"""Load-test results: the JSON summary, SLO gates, PNG plots and sweep selection (no Locust import)."""

from __future__ import annotations

import csv
import math
from array import array
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tritonbundle.measure.latency import Slo, latency_summary


class Recorder:
    """Every request's outcome, per protocol and request name: answered latencies and failures.

    Percentiles come from these raw latencies through :mod:`tritonbundle.measure.latency` (the
    convention the benchmark and the tuner use), not from Locust's rounded histogram.
    """

    def __init__(self) -> None:
        self.latencies: dict[tuple[str, str], array[float]] = defaultdict(lambda: array("d"))
        self.failures: dict[tuple[str, str], int] = defaultdict(int)

    def add(self, protocol: str, name: str, latency_ms: float, ok: bool) -> None:
        if ok:
            self.latencies[(protocol, name)].append(latency_ms)
        else:
            self.failures[(protocol, name)] += 1

    def row(self, keys: Sequence[tuple[str, str]], duration_s: float) -> dict[str, Any]:
        answered = [x for k in keys for x in self.latencies.get(k, ())]
        failures = sum(self.failures.get(k, 0) for k in keys)
        requests = len(answered) + failures
        return {
            "requests": requests, "failures": failures,
            "failure_ratio": failures / requests if requests else 0.0,
            "throughput_rps": len(answered) / duration_s if duration_s > 0 else 0.0,
            **latency_summary(answered, failures),
        }

    def keys(self) -> list[tuple[str, str]]:
        return sorted(set(self.latencies) | set(self.failures))


def summarize(recorder: Recorder, settings: Any, duration_s: float, errors: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """Requests, failures, throughput and p50/p90/p95/p99 per protocol, per request and in total."""
    keys = recorder.keys()
    protocols = sorted({p for p, _ in keys})
    return {
        "settings": {k: v for k, v in vars(settings).items() if k != "slo"} | {"slo": settings.slo.to_json()},
        "duration_s": duration_s,
        "total": recorder.row(keys, duration_s),
        "by_protocol": {p: recorder.row([k for k in keys if k[0] == p], duration_s) for p in protocols},
        "by_request": {f"{p} {n}": recorder.row([(p, n)], duration_s) for p, n in keys},
        "errors": list(errors),
    }


def evaluate_gates(summary: dict[str, Any], slo: Slo) -> dict[str, Any]:
    """Check every protocol's p95/p99 and failure ratio against the SLO (:meth:`Slo.violations`)."""
    failures: list[str] = []
    groups = summary["by_protocol"] or {"total": summary["total"]}
    for name, row in groups.items():
        failures += slo.violations(row, sent=row["requests"], failed=row["failures"], label=name)
    return {"passed": not failures, "failures": failures, "slo": slo.to_json()}


def finite(value: Any) -> Any:
    """``value`` with non-finite floats as None (JSON has no infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


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
