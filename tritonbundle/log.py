"""Console output: one logger for progress lines, rich progress bars for long steps."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

LOG = logging.getLogger("tritonbundle")


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is now (pytest and rich swap it), not the one at setup."""

    @property
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


def setup(verbose: bool = False) -> None:
    """Print ``tritonbundle`` log records to stderr as short, prefixed lines."""
    if LOG.handlers:
        LOG.setLevel(logging.DEBUG if verbose else logging.INFO)
        return
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("[tritonbundle] %(message)s"))
    LOG.addHandler(handler)
    LOG.setLevel(logging.DEBUG if verbose else logging.INFO)
    LOG.propagate = False


def step(message: str) -> None:
    """Announce a step of a longer job."""
    LOG.info("==> %s", message)


@contextlib.contextmanager
def spinner(message: str) -> Iterator[None]:
    """Show a live spinner with elapsed time while a step runs (plain lines when not a TTY)."""
    if not sys.stderr.isatty():
        step(message)
        yield
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), transient=False
    ) as progress:
        progress.add_task(message, total=None)
        yield
