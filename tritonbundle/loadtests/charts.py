"""The load test's charts, drawn from summary.json (its per-second ``timeline`` and Triton's
``server_timeline``): PNG files in the report folder and inline SVG for report.html.

* latency.png: p50 and p99 per 1 s window over the whole run (a window where more than 1 % of the
  requests failed has an infinite p99, marked at the top), above requests/s offered vs achieved;
* throughput.png: requests/s offered vs achieved, failures/s and users over time;
* server.png: Triton's queue vs compute time per request and its average batch size over time;
* sweep.png: throughput and p99 per sweep level.

The grey band after the sending window is the drain: no request was sent any more, the ones in
flight were still being answered.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

GREY, RED, BLUE, GREEN, ORANGE = "#7f7f7f", "#C44E52", "#4C72B0", "#55A868", "#DD8452"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _t(rows: Sequence[dict[str, Any]]) -> list[float]:
    return [r["t"] + r["dt"] / 2 for r in rows]


def _latency(row: dict[str, Any], key: str) -> float:
    """A window's percentile: None in JSON is infinite when the window had requests (failures)."""
    value = row.get(key)
    if value is None:
        return math.inf if row.get("requests") else math.nan
    return float(value)


def _drain(ax: Any, summary: dict[str, Any], until: float = 0.0) -> None:
    """Shade the drain; the x axis spans the run (and ``until``, a later point to show)."""
    window = summary.get("window") or {}
    if window.get("drain_s", 0) > 0:
        ax.axvspan(window["sending_s"], window["wall_s"], color=GREY, alpha=0.15, lw=0, label="drain (sending stopped)")
    ax.set_xlim(0, max(window.get("wall_s", 0.0), until, 1.0) * 1.01)


def draw_latency(ax: Any, summary: dict[str, Any], slo_ms: float | None = None) -> None:
    rows = summary.get("timeline") or []
    t = _t(rows)
    highest = 0.0
    for key, color, label, mark_at in (("p50_ms", BLUE, "p50", 0.9), ("p99_ms", RED, "p99", 0.97)):
        values = [_latency(r, key) for r in rows]
        finite = [v if math.isfinite(v) else math.nan for v in values]
        highest = max([highest, *(v for v in finite if not math.isnan(v))])
        ax.plot(t, finite, color=color, marker=".", label=label)
        infinite = [x for x, v in zip(t, values) if math.isinf(v)]
        if infinite:
            ax.plot(infinite, [mark_at] * len(infinite), linestyle="none", marker="v", color=color,
                    transform=ax.get_xaxis_transform(), label=f"{label} infinite (failures)")
    if slo_ms:
        ax.axhline(slo_ms, color=RED, linestyle=":", label=f"SLO p99 {slo_ms:g} ms")
    _drain(ax, summary)
    ax.set_ylim(0, max(highest, slo_ms or 0.0) * 1.12 or 1.0)
    ax.set_ylabel("latency (ms)")
    ax.set_title("latency per 1 s window (exact percentiles; a failure counts as infinite)", fontsize=10)
    _legend(ax)
    ax.grid(alpha=0.3)


def draw_rates(ax: Any, summary: dict[str, Any], users: bool = True) -> None:
    rows = summary.get("timeline") or []
    t = _t(rows)
    rate = summary.get("rate") or {}
    ax.plot(t, [r["offered_rps"] for r in rows], color=GREY, lw=4, alpha=0.45, label="offered (sent)")
    ax.plot(t, [r["achieved_rps"] for r in rows], color=GREEN, marker=".", label="achieved (answered)")
    failures = [r["failures"] / r["dt"] for r in rows]
    if any(failures):
        ax.plot(t, failures, color=RED, marker=".", label="failed")
    if rate.get("target_rps"):
        ax.axhline(rate["target_rps"], color=GREY, linestyle=":", label=f"target {rate['target_rps']:g}/s")
    _drain(ax, summary)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("seconds since the first request was scheduled")
    ax.set_ylabel("requests / s")
    ax.set_title(f"requests per second: offered {rate.get('offered_rps', 0):.1f}/s vs achieved "
                 f"{rate.get('achieved_rps', 0):.1f}/s over the {summary.get('duration_s', 0):.1f} s sending window",
                 fontsize=10)
    ax.grid(alpha=0.3)
    counts = [r.get("users") for r in rows]
    settings = summary.get("settings") or {}
    varying = settings.get("mode") != "open" or settings.get("shape", "constant") != "constant"
    if users and varying and any(c is not None for c in counts):
        ax2 = ax.twinx()
        ax2.step(t, [math.nan if c is None else c for c in counts], where="mid", color=ORANGE, linestyle="--",
                 lw=1, label="users")
        ax2.set_ylim(bottom=0, top=max(c or 0 for c in counts) * 1.3 + 1)
        ax2.set_ylabel("users" if settings.get("mode") != "open" else "Poisson sources", color=ORANGE)
        _legend(ax, ax2)
    else:
        _legend(ax)


def _legend(ax: Any, *others: Any) -> None:
    """One legend, right of the plot (where it hides no data)."""
    handles, labels = ax.get_legend_handles_labels()
    for other in others:
        h, lab = other.get_legend_handles_labels()
        handles, labels = handles + h, labels + lab
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.08 if others else 1.01, 1.0), fontsize=8,
              frameon=False)


def latency_figure(summary: dict[str, Any], slo_ms: float | None = None) -> Any:
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6.5), dpi=100, sharex=True)
    draw_latency(top, summary, slo_ms)
    draw_rates(bottom, summary)
    fig.tight_layout()
    return fig


def throughput_figure(summary: dict[str, Any]) -> Any:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(11, 3.8), dpi=100)
    draw_rates(ax, summary)
    fig.tight_layout()
    return fig


def server_figure(summary: dict[str, Any]) -> Any | None:
    timeline = {m: rows for m, rows in (summary.get("server_timeline") or {}).items() if rows}
    if not timeline:
        return None
    plt = _pyplot()
    start = (summary.get("window") or {}).get("start_unix")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), dpi=100)
    until = 0.0
    for model, rows in timeline.items():
        t0 = start if start is not None else rows[0]["t"]
        ts = [r["t"] - t0 for r in rows]
        until = max(until, *ts)
        axes[0].plot(ts, [r["queue_ms"] for r in rows], label=f"{model} queue")
        axes[0].plot(ts, [r["compute_ms"] for r in rows], linestyle="--", label=f"{model} compute")
        axes[1].plot(ts, [r["avg_batch"] for r in rows], label=model)
    axes[0].set_title("Triton: queue vs compute time per request (ms)", fontsize=10)
    axes[1].set_title("Triton: average batch size", fontsize=10)
    for ax in axes:
        _drain(ax, summary, until)
        ax.set_xlabel("seconds since the first request was scheduled")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _figures(summary: dict[str, Any], names: tuple[str, ...] = ("latency", "throughput", "server")) -> dict[str, Any]:
    figures = {}
    if summary.get("timeline"):
        if "latency" in names:
            figures["latency"] = latency_figure(summary, _slo_ms(summary))
        if "throughput" in names:
            figures["throughput"] = throughput_figure(summary)
    server = server_figure(summary) if "server" in names else None
    if server is not None:
        figures["server"] = server
    return figures


def write_pngs(report_dir: Path, summary: dict[str, Any]) -> list[Path]:
    """latency.png, throughput.png and (with Triton's metrics) server.png."""
    plt = _pyplot()
    written = []
    for name, fig in _figures(summary).items():
        written.append(report_dir / f"{name}.png")
        fig.savefig(written[-1])
        plt.close(fig)
    return written


def svgs(summary: dict[str, Any], names: tuple[str, ...] = ("latency", "server")) -> dict[str, str]:
    """The same charts as inline SVG elements (text kept as text, no external references); latency's
    lower panel is throughput's chart, so the page needs only these two."""
    plt = _pyplot()
    out = {}
    with plt.rc_context({"svg.fonttype": "none", "svg.hashsalt": "tritonbundle"}):
        for name, fig in _figures(summary, names).items():
            buffer = io.StringIO()
            fig.savefig(buffer, format="svg")
            plt.close(fig)
            text = buffer.getvalue()
            out[name] = text[text.index("<svg"):]
    return out


def _slo_ms(summary: dict[str, Any]) -> float | None:
    slo = (summary.get("settings") or {}).get("slo") or {}
    value = slo.get("p99_ms")
    return float(value) if value is not None else None


def plot_sweep(path: Path, results: Sequence[dict[str, Any]], slo_ms: float | None, level_name: str) -> Path:
    plt = _pyplot()
    levels = [r["level"] for r in results]
    fig, ax = plt.subplots(figsize=(8, 4), dpi=100)
    ax.plot(levels, [r["total"]["throughput_rps"] for r in results], marker="o", label="throughput (req/s)")
    ax.set_xlabel(level_name)
    ax.set_ylabel("requests / s")
    ax2 = ax.twinx()
    ax2.plot(levels, [r["total"]["p99_ms"] or math.nan for r in results], marker="s", color=RED, label="p99 (ms)")
    if slo_ms:
        ax2.axhline(slo_ms, color=RED, linestyle=":", label=f"SLO {slo_ms:g} ms")
    ax2.set_ylabel("p99 latency (ms)")
    fig.legend(loc="upper left")
    ax.set_title("sweep: throughput and p99 per level")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
