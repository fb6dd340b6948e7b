"""One process at a time on a GPU while it times its launches: an exclusive file lock per GPU.

The launch planner's costs are the captured graphs' replay times (:meth:`Engine.prepare`). Every
encoder instance is its own process, and Triton starts them together: four instances timing their
graphs at once time-slice the GPU, so each measures its replays stretched by the others' kernels, by
different amounts per shape. On the H200 (2026-12-02) one shape's time differed up to 4x between the
instances of one server (64 x 512: 21-90 ms against 21.2 in the benchmark's ceiling), and the plans those
tables chose cost up to 1.8x the GPU time of the plan an undisturbed table chooses for the same rows
(docs/benchmarks.md, "the launch costs"). With this turn, the instances time one after another.

The lock is ``flock`` on a file in the temporary folder named by the GPU's UUID, so the processes of one
server (and of any server sharing that folder) take turns; it is released when the holder's file is
closed, also when the process dies. Waiting is bounded: after ``timeout_s`` the caller times anyway and
says so (a held-forever lock must not keep a model from loading).

Shared costs: the instances of one server are the same model on the same GPU, so one timing serves them
all. The first to take the turn times and leaves its table (:func:`share_costs`) under a key that names
the server process, the weights and the shapes; the next ones read it in their turn (:func:`shared_costs`)
instead of timing again. Timed one after another, eight BERT-base instances with 288 graphs each waited
0-23 s for their turns (~3 s a table; docs/benchmarks/h200-tune-vs-handpicked-2/handpicked-1/bench.json,
``timing_wait_s``): the last was ready 41 s after it started, the first after 17. The table is a file beside
the lock, one per user (a file another user wrote is never read), written whole and renamed into place.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: How long an instance waits for its turn before it times its launches anyway.
TURN_TIMEOUT_S = 120.0
#: How long a shared table stays in the file. Its key names the server process, so a table never serves
#: another server; this only keeps the file from growing.
COSTS_KEPT_S = 24 * 3600.0
_POLL_S = 0.05


@dataclass
class Turn:
    """What waiting for the turn took: seconds waited, whether the lock was held, and why not (``error``:
    the lock file could not be opened; held False with no error: the wait timed out)."""

    waited_s: float = 0.0
    held: bool = False
    error: str = ""


def lock_path(gpu: str, folder: str | Path | None = None) -> Path:
    """The lock file of one GPU (``gpu``: its UUID, or any name that identifies it on this host)."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", gpu).strip("-") or "gpu"
    return Path(folder or tempfile.gettempdir()) / f"tritonbundle-gpu-{name}.lock"


def _open(path: Path) -> int:
    """The lock file, opened for reading (enough for flock): an existing one as it is, whoever made it
    (a sticky /tmp refuses O_CREAT on another user's file), else created readable by every user.
    Never through a symlink (the name is predictable)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        pass
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:  # another process made it meanwhile
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    os.fchmod(fd, 0o644)  # whatever the umask: other users' processes must be able to open it
    return fd


@contextlib.contextmanager
def gpu_turn(gpu: str, timeout_s: float = TURN_TIMEOUT_S, folder: str | Path | None = None) -> Iterator[Turn]:
    """Hold the GPU's lock for the ``with`` block, waiting at most ``timeout_s`` for it. A lock file that
    cannot be opened gives no turn, and ``Turn.error`` says why (the caller times anyway)."""
    path = lock_path(gpu, folder)
    turn = Turn()
    start = time.monotonic()
    try:
        fd = _open(path)
    except OSError as e:
        fd, turn.error = -1, f"{path}: {e.strerror or e}"
    if fd < 0:
        yield turn
        return
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                turn.held = True
                break
            except BlockingIOError:
                if time.monotonic() - start >= timeout_s:
                    break
                time.sleep(_POLL_S)
        turn.waited_s = time.monotonic() - start
        yield turn
    finally:
        os.close(fd)  # releases the lock


def costs_path(gpu: str, folder: str | Path | None = None) -> Path:
    """The file of launch-cost tables beside the GPU's lock, this user's own."""
    lock = lock_path(gpu, folder)
    return lock.with_name(f"{lock.stem}-{os.getuid()}.costs.json")


def _tables(path: Path) -> dict[str, Any]:
    try:
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), encoding="utf-8") as f:
            tables = json.load(f)
    except (OSError, ValueError):
        return {}
    return tables if isinstance(tables, dict) else {}


def shared_costs(gpu: str, key: str, folder: str | Path | None = None) -> dict[str, float] | None:
    """The launch costs (seconds by shape name) another process left under ``key``; None if there are none.
    Read it in the GPU's turn: the process that wrote it held the turn while it timed and wrote."""
    entry = _tables(costs_path(gpu, folder)).get(key)
    costs = entry.get("costs_s") if isinstance(entry, dict) else None
    if not isinstance(costs, dict) or not costs or not all(isinstance(v, (int, float)) for v in costs.values()):
        return None
    return {str(k): float(v) for k, v in costs.items()}


def share_costs(gpu: str, key: str, costs: dict[str, float], folder: str | Path | None = None) -> str:
    """Leave ``costs`` under ``key`` for the processes that take the turn next (tables older than
    ``COSTS_KEPT_S`` are dropped). Returns why it could not ("" when it did); timing goes on either way."""
    path = costs_path(gpu, folder)
    now = time.time()
    tables = {k: v for k, v in _tables(path).items()
              if isinstance(v, dict) and isinstance(v.get("written"), (int, float)) and now - v["written"] < COSTS_KEPT_S}
    tables[key] = {"costs_s": costs, "written": now}
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(tables, f)
            os.replace(tmp, path)  # a link at ``path`` is replaced, never followed
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as e:
        return f"{path}: {e.strerror or e}"
    return ""
