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
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: How long an instance waits for its turn before it times its launches anyway.
TURN_TIMEOUT_S = 120.0
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
