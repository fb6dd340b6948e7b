"""A served model's statistics: cumulative counters written as JSON for the benchmark.

The encoder (pytorch runtime): rows, useful / padded / computed tokens, time per execute phase (read
the requests, tokenize their texts when it tokenizes itself, plan, fill, launch, wait, respond), GPU
time (``gpu_s``, other processes' work time-sliced in included) and what the same launches take on the
GPU alone (``gpu_alone_s``: each launch's shape timed at start-up, summed), and histograms of the time one call takes and of its GPU time (:data:`HISTOGRAMS`: the tail the
sums hide). The tokenizer model: texts, time per execute phase (read, tokenize, respond) and the
histogram of the time one call takes (:data:`KEYS`). Each instance writes
``$TRITONBUNDLE_STATS_DIR/<model>.<pid>.json`` every 0.25 s when that variable is set, nothing
otherwise; the benchmark sums the files of one kind (:func:`read_stats`).
"""

from __future__ import annotations

import bisect
import contextlib
import json
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

STATS_DIR_ENV = "TRITONBUNDLE_STATS_DIR"
#: The encoder's execute() phases, each timed per call (``t_<phase>_s`` summed, ``<phase>_ms`` histogram).
PHASES = ("read", "tokenize", "plan", "fill", "launch", "wait", "respond")
#: Per-call histograms: ``execute_ms`` (from execute() being called to the call's last answer sent),
#: ``gpu_ms`` (first launch to last result, on the GPU: other processes' work time-sliced in
#: included) and each phase's (a call that did not run a phase is not counted in its histogram): which
#: phase a slow call spent its time in, where the sums spread it over all. Bucket ``i`` counts values up
#: to ``HISTOGRAM_EDGES_MS[i]``; the last one, the rest.
HISTOGRAMS = ("execute_ms", "gpu_ms", *(f"{phase}_ms" for phase in PHASES))
HISTOGRAM_EDGES_MS = (0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 50.0, 75.0, 100.0, 200.0, 500.0)
def _histograms(*names: str) -> tuple[str, ...]:
    return tuple(f"h_{name}_{i}" for name in names for i in range(len(HISTOGRAM_EDGES_MS) + 1))


#: Counters per kind of served model.
KEYS = {
    "encoder": ("executes", "requests", "errors", "rows", "launches", "useful_tokens", "seq_tokens", "computed_tokens",
                "t_execute_s", *(f"t_{phase}_s" for phase in PHASES), "gpu_s", "gpu_alone_s",
                *_histograms(*HISTOGRAMS)),
    # t_execute_by_request_s: each call's time once per request it held, as Triton counts its compute.
    "tokenizer": ("executes", "requests", "errors", "texts", "t_execute_s", "t_read_s", "t_tokenize_s", "t_respond_s",
                  "t_execute_by_request_s", *_histograms("execute_ms")),
}


def new_stats(kind: str = "encoder") -> dict[str, float]:
    return {key: 0.0 if key.endswith("_s") else 0 for key in KEYS[kind]}


def observe(stats: dict[str, float], name: str, ms: float) -> None:
    """Count one call's ``ms`` in histogram ``name``."""
    stats[f"h_{name}_{bisect.bisect_left(HISTOGRAM_EDGES_MS, ms)}"] += 1


def quantile_ms(stats: dict[str, float], name: str, q: float) -> float | None:
    """The upper edge of the bucket holding the ``q`` quantile of histogram ``name`` (inf past the last
    edge; None when it counted nothing). Counters subtracted between two readings give a level's."""
    counts = [stats.get(f"h_{name}_{i}", 0.0) for i in range(len(HISTOGRAM_EDGES_MS) + 1)]
    total = sum(counts)
    if total <= 0:
        return None
    seen = 0.0
    for edge, count in zip((*HISTOGRAM_EDGES_MS, math.inf), counts):
        seen += count
        if seen >= q * total:
            return edge
    return math.inf


class StatsWriter:
    """Writes the model's cumulative statistics to a JSON file from a background thread."""

    def __init__(self, path: Path, stats: dict[str, float], info: dict[str, Any], interval_s: float = 0.25,
                 kind: str = "encoder") -> None:
        self.path, self.stats, self.info, self.interval_s, self.kind = Path(path), stats, info, interval_s, kind
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="stats-writer", daemon=True)

    def start(self) -> StatsWriter:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.write()
        self._thread.start()
        return self

    def write(self) -> None:
        data = {"kind": self.kind, "info": self.info, "stats": dict(self.stats), "time": time.time()}
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.path)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(OSError):
                self.write()

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self.write()


def writer_for(model: str, stats: dict[str, float], info: dict[str, Any], kind: str = "encoder") -> StatsWriter | None:
    """A started writer when ``$TRITONBUNDLE_STATS_DIR`` is set, else None."""
    folder = os.environ.get(STATS_DIR_ENV)
    if not folder:
        return None
    return StatsWriter(Path(folder) / f"{model}.{os.getpid()}.json", stats, info, kind=kind).start()


def _files(folder: Path, kind: str) -> list[dict[str, Any]]:
    """The statistics files of ``kind`` in ``folder`` (a file without a kind is an encoder's)."""
    out = []
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if data.get("kind", "encoder") == kind:
            out.append(data)
    return out


def read_stats(folder: Path, kind: str = "encoder") -> dict[str, float]:
    """The counters of every ``kind`` instance's statistics file in ``folder``, summed."""
    total: dict[str, float] = {}
    for data in _files(folder, kind):
        for k, v in data.get("stats", {}).items():
            total[k] = total.get(k, 0.0) + float(v)
    return total


def read_stats_info(folder: Path, kind: str = "encoder") -> list[dict[str, Any]]:
    """What each ``kind`` instance reported about itself (device, precision, graphs...)."""
    return [data.get("info", {}) for data in _files(folder, kind)]
