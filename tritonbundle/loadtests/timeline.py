"""The run over time, from the recorder: per-second rows for summary.json and the charts, and the
progress lines printed while the test runs (pure: no Locust, no I/O).

A row covers ``[t, t + dt)`` seconds after the sending window opened (``dt`` is 1 s but for the last
row, which ends at the last answer and may be up to 1.5 s wide). A request counts as sent in
the row of its send time (``offered_rps``) and as done in the row of its answer or failure
(``requests``, ``failures``, ``achieved_rps``, and the percentiles, over the requests done in that
row, a failure counting as an infinite latency: :mod:`tritonbundle.measure.latency`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from tritonbundle.loadtests.recorder import Recorder, Requests, Window
from tritonbundle.measure.latency import percentile

#: Runs up to this long get 1 s rows; longer runs get coarser rows so that summary.json stays small.
MAX_ROWS = 3600


def step_for(wall_s: float) -> float:
    """Row width: 1 s, or the whole seconds that keep a long run within :data:`MAX_ROWS` rows."""
    return 1.0 if wall_s <= MAX_ROWS else float(math.ceil(wall_s / MAX_ROWS))


def rows(requests: Requests, window: Window, users: Sequence[tuple[float, int]] = (),
         step_s: float | None = None) -> list[dict[str, Any]]:
    """One row per ``step_s`` from the opening of the sending window to the last answer."""
    step = step_for(window.wall_s) if step_s is None else step_s
    n = max(1, math.ceil(window.wall_s / step - 1e-9))
    if n > 1 and window.wall_s - (n - 1) * step < step / 2:
        n -= 1  # a sliver at the end (the stop comes a few ms after a whole second) joins the last row

    def index(t: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
        out: npt.NDArray[np.int64] = np.clip(np.floor((t - window.start) / step), 0, n - 1).astype(np.int64)
        return out

    sent = np.bincount(index(requests.sent), minlength=n)
    done_at = index(requests.done)
    done = np.bincount(done_at, minlength=n)
    failed = np.bincount(done_at, weights=(~requests.ok).astype(np.float64), minlength=n)
    order = np.argsort(done_at, kind="stable")
    groups = np.split(requests.latency_ms[order], np.cumsum(done)[:-1])
    user_t = np.array([t for t, _ in users], dtype=np.float64)
    user_n = [u for _, u in users]
    out = []
    for i in range(n):
        t = i * step
        dt = max(window.wall_s - t if i == n - 1 else step, 1e-9)
        latencies = groups[i]
        at = int(np.searchsorted(user_t, window.start + t + dt, side="left")) - 1
        out.append({
            "t": t, "dt": dt, "sent": int(sent[i]), "requests": int(done[i]), "failures": int(failed[i]),
            "p50_ms": percentile(latencies, 50) if latencies.size else None,
            "p99_ms": percentile(latencies, 99) if latencies.size else None,
            "offered_rps": float(sent[i] / dt), "achieved_rps": float((done[i] - failed[i]) / dt),
            "users": user_n[at] if at >= 0 else None,
        })
    return out


def of(recorder: Recorder, window: Window | None = None) -> list[dict[str, Any]]:
    """The recorder's rows (every protocol and request name together)."""
    return rows(recorder.requests(), window or recorder.window(), recorder.users)


def progress_every_s(duration_s: float) -> float:
    """How often a run prints a progress line: every 2 s up to 20 s runs, 5 s up to 5 min, then 10 s."""
    return 2.0 if duration_s <= 20 else 5.0 if duration_s <= 300 else 10.0


def progress_line(elapsed_s: float, sent: int, failed: int, window_s: float, window_sent: int,
                  window_latencies_ms: Sequence[float], users: int | None = None, draining: bool = False) -> str:
    """``loadtest: 10 s  sent 120  failed 0  12.0 req/s answered, 12.5 sent  p99 231 ms (last 2 s)``."""
    answered = sum(1 for x in window_latencies_ms if math.isfinite(x))
    p99 = percentile(np.asarray(window_latencies_ms, dtype=np.float64), 99) if window_latencies_ms else math.nan
    shown = "-" if math.isnan(p99) else "inf (failures)" if math.isinf(p99) else f"{p99:.0f} ms"
    state = "  sending stopped" if draining else f"  users {users}" if users is not None else ""
    return (f"loadtest: {elapsed_s:4.0f} s  sent {sent}  failed {failed}  "
            f"{answered / window_s:.1f} req/s answered, {window_sent / window_s:.1f} sent  "
            f"p99 {shown} (last {window_s:.0f} s){state}")
