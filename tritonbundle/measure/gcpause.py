"""The garbage collector's pauses in this process, as the load generators record them per level.

CPython's cyclic collector stops the interpreter while it runs; a full (generation 2) collection walks
every tracked object, so a load generator holding a pool of prepared requests and thousands of
in-flight tasks can stop for milliseconds at a time, during which it sends nothing and reads no
answer: the requests it should have sent go late, and that lateness is measured latency (latencies
count from each request's schedule). ``gc.callbacks`` (CPython, since 3.3) calls back at the start and
the stop of every collection, with its generation.
"""

from __future__ import annotations

import gc
import time
from typing import Any


class GcPauses:
    """Collections and their pauses since the last :meth:`take`, once :meth:`install`-ed."""

    def __init__(self) -> None:
        self._started: float | None = None
        self._pauses: list[tuple[int, float]] = []

    def install(self) -> GcPauses:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)
        return self

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self._pauses.append((int(info.get("generation", -1)), (time.perf_counter() - self._started) * 1000.0))
            self._started = None

    def take(self) -> dict[str, float]:
        """The collections since the last call: how many, the longest and all together (ms), and how many
        were full (generation 2) collections; then starts counting afresh."""
        pauses, self._pauses = self._pauses, []
        return {"gc_collections": len(pauses), "gc_full": sum(1 for g, _ in pauses if g == 2),
                "gc_max_ms": max((ms for _, ms in pauses), default=0.0), "gc_ms": sum(ms for _, ms in pauses)}
