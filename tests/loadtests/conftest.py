"""Fixtures of the load-test tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def fresh_locust_events() -> Iterator[Any]:
    """Snapshot Locust's global event hooks and restore them, so listeners added by one test
    (ours are added when the locustfile is imported) never leak into the next."""
    import locust

    saved = {name: list(hook._handlers) for name, hook in vars(locust.events).items() if hasattr(hook, "_handlers")}
    yield locust.events
    for name, handlers in saved.items():
        getattr(locust.events, name)._handlers = handlers
