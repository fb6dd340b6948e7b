"""Every request of a load test as it happened: when it was sent, how long it took, whether it was
answered; the sending window; the user count over time (no Locust import, no I/O).

The summary, the per-second timeline, the progress lines and the charts are all computed from here,
so that they agree with each other. Percentiles follow :mod:`tritonbundle.measure.latency` (a failed
request counts as an infinite latency), not Locust's rounded histogram.

Time is wall-clock seconds (``time.time()``), the clock Triton's metric scrapes are stamped with.
"""

from __future__ import annotations

import math
import time
from array import array
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tritonbundle.measure.latency import latency_summary

Key = tuple[str, str]


@dataclass(frozen=True)
class Window:
    """The sending window (from the first request scheduled to the moment sending stopped) and the
    drain after it (requests already sent, answered after the stop), in wall-clock seconds.

    ``answer_delay_s`` is the median latency of the answered requests: answers are counted over a
    window as long as the sending window, that much later (see :meth:`Recorder.row`).
    """

    start: float
    end: float
    last: float
    answer_delay_s: float = 0.0

    @property
    def sending_s(self) -> float:
        return max(0.0, self.end - self.start)

    @property
    def drain_s(self) -> float:
        return max(0.0, self.last - self.end)

    @property
    def wall_s(self) -> float:
        return max(0.0, self.last - self.start)

    def to_json(self) -> dict[str, float]:
        return {"start_unix": self.start, "sending_s": self.sending_s, "drain_s": self.drain_s, "wall_s": self.wall_s,
                "answer_delay_s": self.answer_delay_s}


@dataclass(frozen=True)
class Requests:
    """Requests as arrays: sent (unix s), done (unix s), latency (ms, inf for a failure), answered."""

    sent: npt.NDArray[np.float64]
    done: npt.NDArray[np.float64]
    latency_ms: npt.NDArray[np.float64]
    ok: npt.NDArray[np.bool_]

    def __len__(self) -> int:
        return int(self.sent.size)


class Recorder:
    """Every request's outcome, per protocol and request name, with its send time.

    ``begin``/``end`` mark the sending window: the users call ``begin`` when they start scheduling
    requests, the ``test_stopping`` hook calls ``end``. A run that never marked them (a test driving
    users by hand) gets the window of its first and last request.
    """

    def __init__(self) -> None:
        self._sent: dict[Key, array[float]] = defaultdict(lambda: array("d"))
        self._elapsed: dict[Key, array[float]] = defaultdict(lambda: array("d"))
        self._ok: dict[Key, array[int]] = defaultdict(lambda: array("b"))
        self.started: float | None = None
        self.stopped: float | None = None
        #: (unix s, users running), sampled while the test runs.
        self.users: list[tuple[float, int]] = []
        #: How late (ms) each open-model request was sent after its scheduled arrival.
        self.lag_ms: array[float] = array("d")
        self._recent: list[float] = []
        #: Requests sent so far (counted when sent, for the progress lines) and failed so far.
        self.n_sent = 0
        self.n_failed = 0

    def begin(self, t: float | None = None) -> None:
        """A user started scheduling requests (the earliest call opens the sending window)."""
        t = time.time() if t is None else t
        self.started = t if self.started is None else min(self.started, t)

    def end(self, t: float | None = None) -> None:
        """Sending stopped (the first call closes the sending window)."""
        if self.stopped is None:
            self.stopped = time.time() if t is None else t

    def add(self, protocol: str, name: str, latency_ms: float, ok: bool, sent_at: float | None = None) -> None:
        """One request that ended now (answered or failed), sent ``latency_ms`` ago unless ``sent_at``."""
        key = (protocol, name)
        self._sent[key].append(time.time() - latency_ms / 1000 if sent_at is None else sent_at)
        self._elapsed[key].append(latency_ms)
        self._ok[key].append(1 if ok else 0)
        self.n_failed += 0 if ok else 1
        self._recent.append(latency_ms if ok else math.inf)

    def take_recent(self) -> list[float]:
        """Latencies (inf: failed) of the requests that ended since the last call."""
        out, self._recent = self._recent, []
        return out

    def keys(self) -> list[Key]:
        return sorted(self._sent)

    @property
    def latencies(self) -> dict[Key, list[float]]:
        """Answered requests' latencies (ms) per key."""
        return {k: [x for x, ok in zip(self._elapsed[k], self._ok[k]) if ok] for k in self.keys()}

    @property
    def failures(self) -> dict[Key, int]:
        return {k: len(self._ok[k]) - sum(self._ok[k]) for k in self.keys()}

    def requests(self, keys: Iterable[Key] | None = None) -> Requests:
        chosen = [k for k in (self.keys() if keys is None else keys) if k in self._sent]
        # np.array copies: a view would pin the arrays' buffers and forbid the next append.
        sent = np.concatenate([np.array(self._sent[k], dtype=np.float64) for k in chosen] or [np.zeros(0)])
        elapsed = np.concatenate([np.array(self._elapsed[k], dtype=np.float64) for k in chosen] or [np.zeros(0)])
        ok = np.concatenate([np.array(self._ok[k], dtype=bool) for k in chosen] or [np.zeros(0, dtype=bool)])
        return Requests(sent=sent, done=sent + elapsed / 1000, latency_ms=np.where(ok, elapsed, math.inf), ok=ok)

    def window(self) -> Window:
        """The sending window, from ``begin``/``end`` or else from the requests themselves."""
        every = self.requests()
        first = float(every.sent.min()) if len(every) else time.time()
        start = self.started if self.started is not None else first
        last_sent = float(every.sent.max()) if len(every) else start
        end = self.stopped if self.stopped is not None else last_sent
        end = max(start, end)
        last = max(end, float(every.done.max()) if len(every) else end)
        answered = every.latency_ms[every.ok]
        delay = float(np.median(answered)) / 1000 if answered.size else 0.0
        return Window(start=start, end=end, last=last, answer_delay_s=delay)

    def row(self, keys: Sequence[Key], window: Window) -> dict[str, Any]:
        """Requests, failures, rates over the sending window and latency percentiles of ``keys``.

        ``offered_rps``: requests sent in the sending window per second of it. ``throughput_rps`` (=
        ``achieved_rps``): requests answered per second of the sending window, counted over a window
        as long, ``answer_delay_s`` (the median latency) later. So the drain does not stretch the
        time they are divided by; the first answers' delay and the answers still to come at the stop
        cancel out (a server that keeps up achieves what was offered, whatever its latency); and a
        server that falls behind is not credited with the backlog it answers after the stop.
        """
        r = self.requests(keys)
        failures = int((~r.ok).sum())
        requests = len(r)
        span = window.sending_s
        sent_in = int(((r.sent >= window.start) & (r.sent <= window.end)).sum())
        counted_from, counted_to = window.start + window.answer_delay_s, window.end + window.answer_delay_s
        answered_in = int((r.ok & (r.done >= counted_from) & (r.done <= counted_to)).sum())
        achieved = answered_in / span if span > 0 else 0.0
        return {
            "requests": requests, "failures": failures,
            "failure_ratio": failures / requests if requests else 0.0,
            "throughput_rps": achieved, "offered_rps": sent_in / span if span > 0 else 0.0, "achieved_rps": achieved,
            **latency_summary(r.latency_ms[r.ok].tolist(), failures),
        }
