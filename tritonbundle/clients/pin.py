"""Following a release's pin: the encoder version token-id calls name.

``tritonbundle release`` loads its candidate as the encoder's newest version beside the serving one and
pins the text model's ensemble to the serving one meanwhile (contract.py, "releases"). ``embed_tokens``
calls the encoder itself, where an unversioned request gets the newest version: so the clients name the
version the ensemble pins. A client reads it from the text model's configuration on its first token call
(the call waits for that read, within its deadline) and then in the background every ``PIN_REFRESH_S``
(a thread for the blocking clients, a task for the asyncio ones; either holds the client weakly and
ends with ``close()``); no call reads it on its own path. The release waits ``PIN_SETTLE_S`` after each
move of the pin before it changes the versions the encoder serves. A text model that is not an ensemble
(nothing pinned) is read once.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import math
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any, Protocol
from urllib.parse import quote

from tritonbundle import contract
from tritonbundle.errors import ClientError


class ReleasePin:
    """The encoder version ``ensemble`` pins ("": none, the newest) as last read, and when that read began."""

    def __init__(self, ensemble: str, encoder: str) -> None:
        self.ensemble, self.encoder = ensemble, encoder
        self.version = ""
        self.read_at = -math.inf
        #: When the last read that ended (kept or failed) began.
        self.tried_at = -math.inf
        #: Nothing to follow: the client's model is the encoder itself, or its config has no ensemble steps.
        self.final = ensemble == encoder
        #: Set once the first read has answered or failed, or following ended (the first call waits for it).
        self.first = threading.Event()
        if self.final:
            self.first.set()
        self.stop = threading.Event()
        self._started = False
        self._lock = threading.Lock()

    def start(self) -> bool:
        """True for the one caller that starts following (the first token call)."""
        with self._lock:
            started, self._started = self._started or self.final, True
        return not started

    def take(self, config: Mapping[str, Any], read_at: float) -> str:
        """Keep the pin in ``config`` (the ensemble's, as JSON, read from ``read_at`` on) unless a read
        begun later was kept first; the read has ended (:meth:`tried`)."""
        with self._lock:
            if read_at >= self.read_at:
                if not (config.get("ensemble_scheduling") or {}).get("step"):
                    self.final = True
                pinned = contract.encoder_pin(config, self.encoder)
                self.version, self.read_at = (str(pinned) if pinned >= 0 else ""), read_at
            self.tried_at = max(self.tried_at, read_at)
        return self.version

    def tried(self, read_at: float) -> None:
        """A read begun at ``read_at`` has ended (failed: the last pin stands)."""
        with self._lock:
            self.tried_at = max(self.tried_at, read_at)

    def read_since(self, since: float) -> bool:
        """Whether a read begun after ``since`` has ended (kept or failed), or none will come (nothing to
        follow, stopped)."""
        return self.tried_at > since or self.final or self.stop.is_set()


class PlainHttp:
    """The pin thread's reads for the blocking HTTP client: one kept-open plain ``http.client`` connection,
    not a geventhttpclient pool (the thread would keep a gevent hub, two file descriptors, until the process
    ends), nor urllib (it would send the request and the client's headers to ``$http_proxy``). Each read
    is bounded by the release's settle time."""

    def __init__(self, url: str) -> None:
        self.host, _, prefix = url.partition("/")
        self.prefix = prefix.strip("/")
        self._connection: http.client.HTTPConnection | None = None

    def config(self, model: str, headers: Mapping[str, str]) -> dict[str, Any]:
        path = "/" + "/".join(p for p in (self.prefix, "v2/models", quote(model), "config") if p)
        if self._connection is None:
            self._connection = http.client.HTTPConnection(self.host, timeout=contract.PIN_SETTLE_S)
        try:
            self._connection.request("GET", path, headers=dict(headers))
            answer = self._connection.getresponse()
            body = answer.read()
        except Exception:
            self.close()
            raise
        if answer.status != 200:
            raise ClientError(f"{path}: HTTP {answer.status} {body[:200]!r}", model=model, protocol="http")
        return dict(json.loads(body))

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()


class _Blocking(Protocol):
    def _pin_config(self) -> dict[str, Any]: ...


class _Asyncio(Protocol):
    model: str

    async def _config_json(self, model: str) -> dict[str, Any]: ...


def follow(client: _Blocking, pin: ReleasePin) -> None:
    """Read the pin now and every PIN_REFRESH_S on a daemon thread, until the client is closed or
    collected (the thread holds it weakly) or there is nothing to follow; a failed read keeps the last pin.
    ``_pin_config`` bounds each read (about PIN_SETTLE_S)."""
    ref = weakref.ref(client)

    def loop() -> None:
        try:
            while not pin.stop.is_set():
                held = ref()
                if held is None:
                    return
                read_at = time.monotonic()
                try:
                    pin.take(held._pin_config(), read_at)
                except Exception:  # noqa: BLE001 - tritonclient's own errors, a timeout: the last pin stands
                    pin.tried(read_at)
                del held
                pin.first.set()
                if pin.final:
                    return
                pin.stop.wait(contract.PIN_REFRESH_S)
        finally:
            pin.first.set()  # nobody waits for a read that will not come

    threading.Thread(target=loop, name=f"{pin.ensemble} release pin", daemon=True).start()


def wait_for_read(pin: ReleasePin, since: float, timeout_s: float) -> None:
    """Wait (at most ``timeout_s``) until a read begun after ``since`` has ended (:meth:`ReleasePin.read_since`)."""
    end = time.monotonic() + timeout_s
    while not pin.read_since(since) and time.monotonic() < end:
        time.sleep(0.02)


async def afollow(ref: weakref.ref[_Asyncio], pin: ReleasePin, answered: asyncio.Event) -> None:
    """The asyncio clients' :func:`follow`: a task of the loop the client is used in (cancelled when it
    closes); ``answered`` is set after the first read."""
    try:
        while not pin.stop.is_set():
            held = ref()
            if held is None:
                return
            read_at = time.monotonic()
            try:  # bounded by the release's settle time: a hung read is not waited for past it
                pin.take(await asyncio.wait_for(held._config_json(held.model), contract.PIN_SETTLE_S), read_at)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - tritonclient's own errors, a timeout: the last pin stands
                pin.tried(read_at)
            del held
            answered.set()
            if pin.final:
                return
            await asyncio.sleep(contract.PIN_REFRESH_S)
    finally:
        answered.set()


async def await_read(pin: ReleasePin, since: float, timeout_s: float) -> None:
    """:func:`wait_for_read` for the asyncio clients."""
    end = time.monotonic() + timeout_s
    while not pin.read_since(since) and time.monotonic() < end:
        await asyncio.sleep(0.02)
