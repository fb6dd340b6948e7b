"""Tenants of a shared gateway: who may call it (API keys), which models, and how much.

The tenants file (YAML; a Secret in Helm) maps keys to tenants::

    tenants:
      - name: search                      # [A-Za-z0-9_.-], the label in metrics and the usage log
        keys: ["sha256:9f86d081884c7d65..."]  # sha256 of each key (tritonbundle tenants key makes one)
        models: [minilm]                  # optional: default every model the gateway serves
        limits:                           # optional, each one optional
          requests_per_s: 20              # sustained rate; bursts up to `burst` (default: one second's worth)
          burst: 40
          tokens_per_min: 200000          # the tokenizer's tokens, reserved at admission, settled at the answer
          concurrent_requests: 8          # requests of this tenant in flight at once

Keys are kept only as their SHA-256 (a plain key in the file is hashed when read, and a warning says
so); a caller's key is hashed and looked up, and neither the key nor its hash is ever logged or labelled.

:class:`Admission` enforces the limits per tenant (all of a tenant's keys share them): a request over a
limit is refused at once, with the seconds after which the same request would be admitted. Requests per
second are a token bucket; tokens per minute a bucket of ``tokens_per_min`` refilled continuously: a
request is admitted only while the bucket holds the most tokens it can use (the gateway's estimate from
above, :meth:`~tritonbundle.gateway.openai_api.EmbeddingsRequest.most_tokens`, at most the whole
``tokens_per_min``), which is reserved at once and settled to the answer's real token count when it ends
(all of it given back when the server failed it), so that many requests at once cannot overshoot; one
that used more than it reserved leaves the bucket owing. A request that uses more than
``tokens_per_min`` by itself even by the estimate from below (its words,
:meth:`~tritonbundle.gateway.openai_api.EmbeddingsRequest.least_tokens`) is refused whatever the bucket
holds (the caller splits it): the estimate from above, bytes, is ~3x a text's real count, and refusing
on it turned away requests that fit. Concurrency is a counter. A refused request takes nothing from any
limit.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tritonbundle.errors import ConfigError

NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
HASHED = re.compile(r"^sha256:[0-9a-f]{64}$")
#: Shortest plain key accepted in a tenants file (a hashed one says nothing of its key's length).
MIN_KEY_CHARS = 16
LIMIT_KEYS = ("requests_per_s", "burst", "tokens_per_min", "concurrent_requests")


def key_hash(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Limits:
    requests_per_s: float | None = None
    burst: float | None = None
    tokens_per_min: int | None = None
    concurrent_requests: int | None = None


@dataclass(frozen=True)
class Tenant:
    name: str
    #: The models it may call; empty: every model the gateway serves.
    models: frozenset[str] = frozenset()
    limits: Limits = Limits()

    def may_use(self, model: str) -> bool:
        return not self.models or model in self.models


@dataclass(frozen=True)
class Tenants:
    tenants: tuple[Tenant, ...]
    #: sha256:<hex> of each key -> its tenant's name.
    by_key: Mapping[str, str] = field(default_factory=dict)
    #: Plain keys found in the file (they work; the gateway warns that the file should hold hashes).
    plain_keys: int = 0

    def find(self, key: str) -> Tenant | None:
        name = self.by_key.get(key_hash(key))
        return None if name is None else self.named(name)

    def named(self, name: str) -> Tenant:
        return next(t for t in self.tenants if t.name == name)

    def unserved(self, served: Iterable[str]) -> list[str]:
        """One line per tenant allowed models the gateway's OpenAI API does not serve: fine for KServe
        models reached through the edge, a typo otherwise (the gateway warns at start)."""
        served = set(served)
        return [f"tenant {t.name!r} may use {sorted(t.models - served)}, which this gateway's OpenAI API does not "
                f"serve (it serves {sorted(served)}): fine for KServe /v2 models through the edge, else check the names"
                for t in self.tenants if t.models - served]


def load(path: Path | str) -> Tenants:
    """The tenants file; :class:`ConfigError` naming the entry and field for anything wrong."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"tenants file {path}: cannot read it: {e}") from e
    return parse(data, where=str(path))


def parse(data: Any, where: str = "tenants file") -> Tenants:
    if not isinstance(data, dict) or not isinstance(data.get("tenants"), list) or not data["tenants"]:
        raise ConfigError(f"{where}: expected a mapping with a non-empty list 'tenants'")
    unknown = sorted(set(data) - {"tenants"})
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown} (only 'tenants')")
    tenants: list[Tenant] = []
    by_key: dict[str, str] = {}
    plain = 0
    for i, entry in enumerate(data["tenants"]):
        at = f"{where}: tenants[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{at}: expected a mapping with name, keys, models, limits")
        extra = sorted(set(entry) - {"name", "keys", "models", "limits"})
        if extra:
            raise ConfigError(f"{at}: unknown keys {extra} (name, keys, models, limits)")
        name = entry.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise ConfigError(f"{at}.name: {name!r} is not a name of 1-64 letters, digits, '_', '.' or '-'")
        if any(t.name == name for t in tenants):
            raise ConfigError(f"{at}.name: {name!r} is used twice")
        keys = entry.get("keys")
        if not isinstance(keys, list) or not keys or not all(isinstance(k, str) for k in keys):
            raise ConfigError(f"{at}.keys: expected a non-empty list of keys (sha256:<hex>, or plain keys)")
        for j, key in enumerate(keys):
            if HASHED.match(key):
                hashed = key
            elif key.startswith("sha256:"):
                raise ConfigError(f"{at}.keys[{j}]: a sha256: key needs 64 lowercase hex digits")
            elif len(key) < MIN_KEY_CHARS:
                raise ConfigError(f"{at}.keys[{j}]: a plain key needs at least {MIN_KEY_CHARS} characters")
            else:
                hashed, plain = key_hash(key), plain + 1
            if hashed in by_key:
                raise ConfigError(f"{at}.keys[{j}]: the same key is also a key of tenant {by_key[hashed]!r}")
            by_key[hashed] = name
        models = entry.get("models", [])
        if not isinstance(models, list) or not all(isinstance(m, str) and m for m in models):
            raise ConfigError(f"{at}.models: expected a list of model names")
        tenants.append(Tenant(name, frozenset(models), _limits(entry.get("limits") or {}, f"{at}.limits")))
    return Tenants(tuple(tenants), by_key, plain)


def _limits(raw: Any, at: str) -> Limits:
    if not isinstance(raw, dict):
        raise ConfigError(f"{at}: expected a mapping of {', '.join(LIMIT_KEYS)}")
    extra = sorted(set(raw) - set(LIMIT_KEYS))
    if extra:
        raise ConfigError(f"{at}: unknown keys {extra} ({', '.join(LIMIT_KEYS)})")
    for k, v in raw.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
            raise ConfigError(f"{at}.{k}: must be a number > 0, not {v!r}")
        if k in ("tokens_per_min", "concurrent_requests") and v != int(v):
            raise ConfigError(f"{at}.{k}: must be a whole number, not {v!r}")
    if "burst" in raw and "requests_per_s" not in raw:
        raise ConfigError(f"{at}.burst: needs requests_per_s")
    if "burst" in raw and raw["burst"] < 1:  # a request takes a whole one: the bucket would never hold it
        raise ConfigError(f"{at}.burst: must be at least 1 (requests at once), not {raw['burst']!r}")
    return Limits(
        requests_per_s=float(raw["requests_per_s"]) if "requests_per_s" in raw else None,
        burst=float(raw["burst"]) if "burst" in raw else None,
        tokens_per_min=int(raw["tokens_per_min"]) if "tokens_per_min" in raw else None,
        concurrent_requests=int(raw["concurrent_requests"]) if "concurrent_requests" in raw else None,
    )


class Refused(Exception):
    """A request over one of its tenant's limits: which (``reason``), and when to retry."""

    def __init__(self, reason: str, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.reason, self.message, self.retry_after_s = reason, message, max(1.0, math.ceil(retry_after_s))


class TooLarge(Exception):
    """A request that uses more tokens than its tenant's ``tokens_per_min`` by itself."""


class _State:
    def __init__(self, limits: Limits, now: float) -> None:
        self.limits = limits
        self.burst = limits.burst or max(1.0, limits.requests_per_s or 1.0)
        self.requests = self.burst
        self.tokens = float(limits.tokens_per_min or 0)
        self.updated = now
        self.in_flight = 0

    def refill(self, now: float) -> None:
        elapsed, self.updated = max(0.0, now - self.updated), now
        if self.limits.requests_per_s:
            self.requests = min(self.burst, self.requests + elapsed * self.limits.requests_per_s)
        if self.limits.tokens_per_min:
            self.tokens = min(float(self.limits.tokens_per_min), self.tokens + elapsed * self.limits.tokens_per_min / 60)


class Admission:
    """Each tenant's limits (module docstring). Not thread-safe: the gateway calls it from its event loop."""

    def __init__(self, tenants: Iterable[Tenant], clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        now = clock()
        self._state = {t.name: _State(t.limits, now) for t in tenants}

    def admit(self, tenant: Tenant, *, in_flight: bool = True, tokens: int = 0, least_tokens: int = 0) -> int:
        """Count one request in, reserving the ``tokens`` it may use (an estimate from above; at most the
        whole ``tokens_per_min``), and return the reservation; or raise :class:`Refused` (nothing counted),
        or :class:`TooLarge` when even ``least_tokens`` (an estimate from below) is over ``tokens_per_min``.
        A request that uses more than it reserved leaves the bucket below zero until it refills.
        ``in_flight=False``: a request whose end this process never sees (the edge's KServe requests,
        ``tokens`` 0): its rate and the tokens left are checked, it is not counted in flight, and no
        :meth:`release` follows."""
        reserved = min(tokens, tenant.limits.tokens_per_min or tokens)
        s = self._check(tenant, in_flight, reserved, least_tokens)
        if s.limits.requests_per_s:
            s.requests -= 1
        if in_flight:
            s.in_flight += 1
        if s.limits.tokens_per_min:
            s.tokens -= reserved
        return reserved

    def release(self, tenant: Tenant, reserved: int, used: int) -> None:
        """One admitted request is done: of the ``reserved`` tokens it ``used`` this many (0 when it failed)."""
        s = self._state[tenant.name]
        s.refill(self.clock())
        s.in_flight -= 1
        if s.limits.tokens_per_min:
            s.tokens = min(float(s.limits.tokens_per_min), s.tokens + reserved - used)

    def _check(self, tenant: Tenant, in_flight: bool, tokens: int, least_tokens: int) -> _State:
        s = self._state[tenant.name]
        s.refill(self.clock())
        limits = s.limits
        if in_flight and limits.concurrent_requests and s.in_flight >= limits.concurrent_requests:
            raise Refused("concurrency", f"tenant {tenant.name!r} has {s.in_flight} requests in flight, its limit "
                                         f"(concurrent_requests {limits.concurrent_requests})", 1.0)
        if limits.tokens_per_min and least_tokens > limits.tokens_per_min:
            raise TooLarge(f"this request uses at least {least_tokens} tokens, more than the tokens_per_min of tenant "
                           f"{tenant.name!r} ({limits.tokens_per_min}): send fewer or shorter texts per request")
        if limits.tokens_per_min and (s.tokens <= 0 or s.tokens < tokens):
            rate = limits.tokens_per_min / 60
            raise Refused("tokens", f"tenant {tenant.name!r} has used its tokens_per_min ({limits.tokens_per_min}): "
                                    f"{max(0, int(s.tokens))} left, this request may use up to {tokens}",
                          (max(tokens, 1) - s.tokens) / rate)
        if limits.requests_per_s and s.requests < 1:
            raise Refused("rate", f"tenant {tenant.name!r} is over its requests_per_s ({limits.requests_per_s:g}, "
                                  f"burst {s.burst:g})", (1 - s.requests) / limits.requests_per_s)
        return s
