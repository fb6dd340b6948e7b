"""Load-test results: the JSON summary, SLO gates and sweep selection (no Locust import).

The charts are in :mod:`tritonbundle.loadtests.charts`, the HTML report in
:mod:`tritonbundle.loadtests.htmlreport`; both draw what :func:`summarize` wrote.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from tritonbundle.loadtests import timeline
from tritonbundle.loadtests.recorder import Recorder
from tritonbundle.measure.latency import Slo, percentile


def hosts(settings: Any) -> dict[str, str]:
    """The URLs the run targeted, per protocol (a scheme added where the setting has none)."""
    out = {}
    for protocol in ("http", "grpc"):
        url = getattr(settings, f"{protocol}_url", None)
        if url:
            out[protocol] = url if "://" in url else f"{protocol}://{url}"
    return out


def summarize(recorder: Recorder, settings: Any, errors: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """Requests, failures, rates and p50/p90/p95/p99 per protocol, per request and in total; the sending
    window; offered vs achieved rate; the per-second timeline the charts draw.

    ``duration_s`` and every ``throughput_rps`` are over the sending window (from the first request
    scheduled to the stop), not the wall time that includes the drain of requests still in flight.
    """
    window = recorder.window()
    keys = recorder.keys()
    protocols = sorted({p for p, _ in keys})
    total = recorder.row(keys, window)
    open_model = getattr(settings, "mode", "closed") == "open"
    rows = timeline.rows(recorder.requests(), window, recorder.users)
    lag = np.asarray(recorder.lag_ms, dtype=np.float64)
    return {
        "settings": {k: v for k, v in vars(settings).items() if k != "slo"} | {"slo": settings.slo.to_json()},
        "hosts": hosts(settings),
        "duration_s": window.sending_s,
        "window": window.to_json() | {"step_s": timeline.step_for(window.wall_s)},
        "rate": {
            "mode": getattr(settings, "mode", "closed"),
            "target_rps": float(settings.rate) if open_model else None,
            "offered_rps": total["offered_rps"], "achieved_rps": total["achieved_rps"],
            "offered_over_s": window.sending_s, "achieved_over_s": window.sending_s,
            "send_lag_ms": {"mean": float(lag.mean()), "p99": percentile(lag, 99), "max": float(lag.max())}
            if lag.size else None,
        },
        "total": total,
        "by_protocol": {p: recorder.row([k for k in keys if k[0] == p], window) for p in protocols},
        "by_request": {f"{p} {n}": recorder.row([(p, n)], window) for p, n in keys},
        "timeline": rows,
        "errors": list(errors),
    }


def evaluate_gates(summary: dict[str, Any], slo: Slo) -> dict[str, Any]:
    """Check every protocol's p95/p99 and failure ratio against the SLO (:meth:`Slo.violations`). A
    protocol the run targeted (``hosts``) that sent nothing fails; so does a run whose users could not
    start (``user_errors``), naming the first reason, or one that left requests unanswered (:func:`unanswered`)."""
    failures: list[str] = []
    groups = {p: None for p in summary.get("hosts") or {}} | summary["by_protocol"]
    if not groups:
        groups = {"total": summary["total"]}
    for name, row in groups.items():
        sent, failed = (0, 0) if row is None else (row["requests"], row["failures"])
        failures += slo.violations(row or {}, sent=sent, failed=failed, label=name)
    missing = unanswered(summary)
    if missing:
        failures.append(f"{missing} request(s) unanswered: sent, but neither answered nor failed when the users "
                        "were stopped after the drain (each counts as failed)")
    user_errors = summary.get("user_errors") or []
    if user_errors:
        first = user_errors[0]
        others = f" (and {len(user_errors) - 1} other user error(s), in summary.json)" if len(user_errors) > 1 else ""
        failures.append(f"users failed {first['occurrences']} time(s): {first['error']}{others}")
    return {"passed": not failures, "failures": failures, "slo": slo.to_json()}


def unanswered(summary: dict[str, Any]) -> int:
    """Requests sent that neither got an answer nor failed by the end of the run (``sent``, counted as
    they went out, less the requests recorded): in flight when the users were stopped."""
    return max(0, int(summary.get("sent", 0)) - int(summary["total"]["requests"]))


def finite(value: Any) -> Any:
    """``value`` with non-finite floats as None (JSON has no infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def best_level(results: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The sweep level with the highest throughput among those that met the SLO."""
    passing = [r for r in results if r["gates"]["passed"]]
    return max(passing, key=lambda r: r["total"]["throughput_rps"]) if passing else None
