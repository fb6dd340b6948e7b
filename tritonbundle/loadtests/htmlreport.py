"""report.html: one self-contained page (inline CSS and SVG charts, no script, no network) drawn from
summary.json: the host, the load, offered vs achieved rate over the sending window, exact
percentiles per protocol and request, the charts over the whole run, Triton's view, the errors,
the per-second timeline as a table, and the summary itself as embedded JSON."""

from __future__ import annotations

import datetime as dt
import json
from html import escape
from pathlib import Path
from typing import Any

from tritonbundle.loadtests import charts

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:2rem auto;max-width:1100px;
padding:0 1rem;color:#222;line-height:1.4}
h1{margin-bottom:.2rem}h2{margin-top:2rem;border-bottom:1px solid #ddd;padding-bottom:.2rem}
table{border-collapse:collapse;margin:.5rem 0;font-size:.92rem}
th,td{padding:.25rem .7rem;border-bottom:1px solid #e5e5e5;text-align:right}
th:first-child,td:first-child,table.text th,table.text td{text-align:left}th{background:#f5f5f5}
dl{display:grid;grid-template-columns:max-content auto;gap:.2rem 1rem;margin:.8rem 0}dt{font-weight:600}dd{margin:0}
.verdict{padding:.6rem 1rem;border-radius:6px;font-weight:600;margin:1rem 0}
.pass{background:#e6f4ea;color:#1e6b33}.fail{background:#fdecea;color:#8a1c1c}
svg{width:100%;height:auto}.note{color:#666;font-size:.88rem}pre{background:#f7f7f7;padding:.6rem;overflow:auto}
"""


def _ms(value: Any, requests: int) -> str:
    """A percentile: None is infinite (failures) when there were requests, no data otherwise."""
    if value is None:
        return "&infin;" if requests else "&ndash;"
    return f"{value:,.1f}"


def _rate(value: Any) -> str:
    return "&ndash;" if value is None else f"{value:,.2f}"


def _table(head: list[str], rows: list[list[str]], css: str = "") -> str:
    out = [f'<table class="{css}"><tr>' if css else "<table><tr>", *(f"<th>{h}</th>" for h in head), "</tr>"]
    for row in rows:
        out += ["<tr>", *(f"<td>{c}</td>" for c in row), "</tr>"]
    return "".join(out) + "</table>"


def _load(summary: dict[str, Any]) -> str:
    s = summary.get("settings") or {}
    if s.get("mode") == "open":
        load = f"open model: Poisson arrivals at {s.get('rate', 0):g} requests/s from {s.get('users')} sources"
    else:
        load = f"closed model: {s.get('users')} users sending back-to-back"
    if s.get("shape", "constant") != "constant":
        load += f", {s['shape']} shape"
    source = s.get("traffic") or f"synthetic {s.get('synthetic', '')} traffic"
    return f"{load}; requests of the model's task from {source}; {s.get('duration_s', 0):g} s asked"


def _meta(summary: dict[str, Any]) -> str:
    s = summary.get("settings") or {}
    window = summary.get("window") or {}
    rate = summary.get("rate") or {}
    hosts = summary.get("hosts") or {}
    started = dt.datetime.fromtimestamp(window.get("start_unix", 0), tz=dt.timezone.utc)
    target = f" (target {rate['target_rps']:g}/s)" if rate.get("target_rps") else ""
    items = [
        ("Target host", ", ".join(f"{escape(url)} ({p.upper() if p == 'http' else 'gRPC'})" for p, url in hosts.items())
         or "&ndash;"),
        ("Model", escape(str(s.get("model", "")))),
        ("Load", escape(_load(summary))),
        ("Started", started.strftime("%Y-%m-%d %H:%M:%S UTC")),
        ("Sending window", f"{window.get('sending_s', 0):.1f} s, then {window.get('drain_s', 0):.1f} s of drain "
                           f"(wall {window.get('wall_s', 0):.1f} s)"),
        ("Offered vs achieved", f"{_rate(rate.get('offered_rps'))} requests/s sent vs "
                                f"{_rate(rate.get('achieved_rps'))} answered/s, both over the "
                                f"{window.get('sending_s', 0):.1f} s sending window{target}"),
    ]
    lag = rate.get("send_lag_ms")
    if lag:
        items.append(("Send lag", f"mean {lag['mean']:.1f} ms, p99 {lag['p99']:.1f} ms behind the arrival schedule"))
    if s.get("metrics_url"):
        items.append(("Triton metrics", escape(s["metrics_url"])))
    return "<dl>" + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items) + "</dl>"


def _requests_table(summary: dict[str, Any]) -> str:
    head = ["", "requests", "failures", "offered/s", "achieved/s", "p50 ms", "p90 ms", "p95 ms", "p99 ms", "mean ms",
            "max ms"]
    by_request = summary.get("by_request") or {}
    by_protocol = summary.get("by_protocol") or {}
    # Per request name only where a protocol carried more than one.
    groups = [*(by_request.items() if len(by_request) > len(by_protocol) else ()), *by_protocol.items(),
              ("all", summary["total"])]
    rows = []
    for name, r in groups:
        n = r["requests"]
        rows.append([escape(name), f"{n:,}", f"{r['failures']:,}", _rate(r.get("offered_rps")),
                     _rate(r.get("achieved_rps", r.get("throughput_rps"))),
                     *(_ms(r.get(k), n) for k in ("p50_ms", "p90_ms", "p95_ms", "p99_ms", "mean_ms", "max_ms"))])
    return _table(head, rows)


def _server(summary: dict[str, Any], svg: dict[str, str]) -> str:
    views = summary.get("server") or []
    if not views:
        return ""
    rows = [[escape(v["model"]), f"{v['requests']:,.0f}", f"{v['executions']:,.0f}", f"{v['avg_batch_size']:.2f}",
             f"{v['queue_ms_per_request']:.1f}", f"{v['compute_ms_per_request']:.1f}"] for v in views]
    return ("<h2>Triton (server side)</h2>"
            + _table(["model", "requests", "executions", "avg batch", "queue ms/request", "compute ms/request"], rows)
            + svg.get("server", ""))


def _errors(summary: dict[str, Any]) -> str:
    errors = summary.get("errors") or []
    if not errors:
        return "<h2>Errors</h2><p>None.</p>"
    rows = [[f"{e['occurrences']:,}", escape(e["method"] or ""), escape(e["name"] or ""), escape(e["error"])]
            for e in errors]
    return "<h2>Errors</h2>" + _table(["occurrences", "protocol", "request", "error"], rows, css="text")


def _timeline(summary: dict[str, Any]) -> str:
    rows = [[f"{r['t']:.0f}", f"{r['dt']:.2f}", f"{r['sent']:,}", f"{r['requests']:,}", f"{r['failures']:,}",
             _rate(r["offered_rps"]), _rate(r["achieved_rps"]), _ms(r["p50_ms"], r["requests"]),
             _ms(r["p99_ms"], r["requests"]), "&ndash;" if r.get("users") is None else str(r["users"])]
            for r in summary.get("timeline") or []]
    table = _table(["t s", "width s", "sent", "done", "failed", "offered/s", "achieved/s", "p50 ms", "p99 ms", "users"],
                   rows)
    return f"<details><summary>The timeline the charts draw ({len(rows)} rows)</summary>{table}</details>"


def render(summary: dict[str, Any]) -> str:
    svg = charts.svgs(summary)
    gates = summary.get("gates") or {"passed": True, "failures": []}
    verdict = ('<div class="verdict pass">SLO met</div>' if gates["passed"] else
               '<div class="verdict fail">SLO missed: ' + "; ".join(escape(f) for f in gates["failures"]) + "</div>")
    data = json.dumps(summary, indent=1).replace("</", "<\\/")
    hosts = ", ".join((summary.get("hosts") or {}).values())
    title = f"Load test: {summary.get('settings', {}).get('model', '')} at {hosts}"
    return "\n".join([
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>",
        "<h1>Load test report</h1>", _meta(summary), verdict,
        "<h2>Requests</h2>", _requests_table(summary),
        '<p class="note">Percentiles are exact, over every request (a failed request counts as an infinite latency). '
        "Rates are per second of the sending window: offered = requests sent in it, achieved = requests answered "
        "in a window as long, the median latency later (so that neither the first answers' delay nor the drain "
        "counts).</p>",
        "<h2>Over time</h2>", svg.get("latency", "<p>No requests were recorded.</p>"), _timeline(summary),
        _server(summary, svg), _errors(summary),
        "<h2>Settings</h2><details><summary>As run</summary><pre>"
        + escape(json.dumps(summary.get("settings"), indent=2)) + "</pre></details>",
        f'<script type="application/json" id="summary">{data}</script>', "</body></html>",
    ])


def write(path: Path, summary: dict[str, Any]) -> Path:
    path.write_text(render(summary), encoding="utf-8")
    return path
