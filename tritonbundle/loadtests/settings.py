"""Load-test settings: one JSON-serialisable object, passed from ``tritonbundle loadtest`` to the
locustfile through the ``TRITONBUNDLE_LOADTEST`` environment variable."""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, fields

from tritonbundle.errors import ConfigError
from tritonbundle.measure.latency import Slo

ENV = "TRITONBUNDLE_LOADTEST"
MODES = ("closed", "open")
SHAPES = ("constant", "step", "spike", "soak")
INPUTS = ("text", "tokens", "both")


@dataclass
class LoadSettings:
    http_url: str | None = "127.0.0.1:8000"
    grpc_url: str | None = "127.0.0.1:8001"
    metrics_url: str | None = None
    model: str = "minilm"
    #: text: the model's own requests (texts for a text model, tensors for a tensor model); tokens:
    #: token rows to a text-embedding model's encoder; both: alternate.
    input: str = "text"
    #: Recorded inputs (.npz, one array per input) for a tensor model, instead of random ones.
    inputs: str | None = None
    traffic: str | None = None
    synthetic: str = "chat"
    seed: int = 0
    #: closed: ``users`` loop back-to-back (fixed concurrency); open: Poisson arrivals at ``rate``.
    mode: str = "closed"
    users: int = 8
    rate: float = 20.0
    spawn_rate: float = 100.0
    duration_s: float = 20.0
    shape: str = "constant"
    timeout_s: float = 10.0
    retries: int = 1
    #: Open model: requests in flight per scheduler before the client itself refuses to send more.
    max_in_flight: int = 256
    max_batch: int = 32
    report_dir: str = "reports/loadtest"
    slo: Slo = field(default_factory=Slo)

    def __post_init__(self) -> None:
        if isinstance(self.slo, dict):
            self.slo = Slo(**self.slo)
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if self.shape not in SHAPES:
            raise ConfigError(f"shape must be one of {', '.join(SHAPES)}, not {self.shape!r}")
        if self.input not in INPUTS:
            raise ConfigError(f"input must be one of {', '.join(INPUTS)}, not {self.input!r}")
        if not (self.http_url or self.grpc_url):
            raise ConfigError("give at least one of --http-url and --grpc-url")
        if self.users < 1 or self.rate <= 0 or self.duration_s <= 0:
            raise ConfigError("users must be >= 1, rate and duration > 0")
        if self.users < len(self.protocols):  # one user speaks one protocol: fewer users leave one untested
            raise ConfigError(
                f"{self.users} user(s) cannot cover the {len(self.protocols)} protocols ({' and '.join(self.protocols)}): "
                f"each user speaks one; give --users {len(self.protocols)} or more (closed-model --sweep levels too), "
                "or test one protocol with --protocol http or --protocol grpc")
        if self.duration_s > 24 * 3600:
            raise ConfigError("a load test is bounded: duration at most 24 h")

    @property
    def protocols(self) -> list[str]:
        return [p for p, url in (("http", self.http_url), ("grpc", self.grpc_url)) if url]

    def users_at(self, t: float) -> int | None:
        """Users the load shape wants ``t`` seconds into the sending window (None: past it); never fewer
        than one per protocol."""
        return shape_users(self.shape, self.users, self.duration_s, t, minimum=len(self.protocols))

    def rate_at(self, t: float) -> float:
        """Open model: the total rate ``t`` seconds into the sending window, ``rate`` scaled as the load
        shape scales the users (``rate`` throughout for the constant and soak shapes)."""
        return self.rate * (self.users_at(t) or self.users) / self.users

    def user_classes(self) -> list[str]:
        """The locustfile's user classes to run for these settings."""
        prefix = "Open" if self.mode == "open" else ""
        return [prefix + {"http": "HttpUser", "grpc": "GrpcUser"}[p] for p in self.protocols]

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls) -> LoadSettings:
        raw = os.environ.get(ENV)
        if not raw:
            return cls()
        data = json.loads(raw)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def shape_users(shape: str, users: int, duration_s: float, t: float, minimum: int = 1) -> int | None:
    """Users wanted at ``t`` seconds for a load shape (None: the test is over), at least ``minimum``.

    * step: four equal steps up to ``users``;
    * spike: a quarter of ``users``, all of them from 40 % to 60 % of the run, then back;
    * constant and soak: ``users`` throughout (soak is the name for long runs).
    """
    if t >= duration_s:
        return None
    if shape == "step":
        steps = 4
        return max(minimum, math.ceil(users * (int(t / (duration_s / steps)) + 1) / steps))
    if shape == "spike":
        base = max(minimum, users // 4)
        return users if 0.4 * duration_s <= t < 0.6 * duration_s else base
    return users
