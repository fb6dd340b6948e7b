"""The pytorch model's statistics: cumulative counters written as JSON for the benchmark.

Rows, useful / padded / computed tokens, time per execute phase and GPU time go to
``$TRITONBUNDLE_STATS_DIR/<model>.<pid>.json`` every 0.25 s when that variable is set; nothing is
written otherwise. The benchmark sums the files of all instances (:func:`read_stats`).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

STATS_DIR_ENV = "TRITONBUNDLE_STATS_DIR"
STAT_KEYS = (
    "executes", "requests", "errors", "rows", "launches", "useful_tokens", "seq_tokens", "computed_tokens",
    "t_execute_s", "t_read_s", "t_plan_s", "t_fill_s", "t_launch_s", "t_wait_s", "t_respond_s", "gpu_s",
)


def new_stats() -> dict[str, float]:
    return {key: 0.0 if key.endswith("_s") else 0 for key in STAT_KEYS}


class StatsWriter:
    """Writes the model's cumulative statistics to a JSON file from a background thread."""

    def __init__(self, path: Path, stats: dict[str, float], info: dict[str, Any], interval_s: float = 0.25) -> None:
        self.path, self.stats, self.info, self.interval_s = Path(path), stats, info, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="stats-writer", daemon=True)

    def start(self) -> StatsWriter:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.write()
        self._thread.start()
        return self

    def write(self) -> None:
        data = {"info": self.info, "stats": dict(self.stats), "time": time.time()}
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


def writer_for(model: str, stats: dict[str, float], info: dict[str, Any]) -> StatsWriter | None:
    """A started writer when ``$TRITONBUNDLE_STATS_DIR`` is set, else None."""
    folder = os.environ.get(STATS_DIR_ENV)
    if not folder:
        return None
    return StatsWriter(Path(folder) / f"{model}.{os.getpid()}.json", stats, info).start()


def read_stats(folder: Path) -> dict[str, float]:
    """The counters of every instance's statistics file in ``folder``, summed."""
    total: dict[str, float] = {}
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for k, v in data.get("stats", {}).items():
            total[k] = total.get(k, 0.0) + float(v)
    return total


def read_stats_info(folder: Path) -> list[dict[str, Any]]:
    """What each instance reported about itself (device, precision, graphs...)."""
    out = []
    for path in sorted(folder.glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            out.append(json.loads(path.read_text()).get("info", {}))
    return out
