"""The traffic sample: one file format shared by profile planning, load tests and benchmarks.

Format: JSON Lines, one request per line::

    {"tokens": 57, "batch": 1}
    {"tokens": 212, "batch": 4, "t": 0.53}

``tokens`` is the request's sequence length after tokenization (special tokens included), ``batch``
the number of rows it carries (default 1), and the optional ``t`` its arrival time in seconds since
the start of the sample (used for replay; omitted in synthetic samples). Blank lines and lines
starting with ``#`` are ignored. What is tuned is what is tested: the build stage plans buckets from
this file and the load tests draw their requests from the same file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tritonbundle.errors import ConfigError

SHAPES = ("chat", "bimodal", "uniform", "fixed")


@dataclass(frozen=True)
class Request:
    tokens: int
    batch: int = 1
    t: float | None = None


@dataclass(frozen=True)
class TrafficSample:
    requests: tuple[Request, ...]
    source: str = "<memory>"

    def __post_init__(self) -> None:
        if not self.requests:
            raise ConfigError(f"{self.source}: the traffic sample is empty: it needs at least one request")

    @property
    def lengths(self) -> np.ndarray[Any, Any]:
        return np.array([r.tokens for r in self.requests], dtype=np.int64)

    @property
    def batches(self) -> np.ndarray[Any, Any]:
        return np.array([r.batch for r in self.requests], dtype=np.int64)

    def row_lengths(self) -> np.ndarray[Any, Any]:
        """One entry per row (a request of batch 4 counts its length 4 times): what the engine sees."""
        return np.repeat(self.lengths, self.batches)

    def clipped(self, max_tokens: int) -> TrafficSample:
        """Lengths above ``max_tokens`` are truncated to it (as the tokenizer does)."""
        return TrafficSample(
            tuple(Request(min(r.tokens, max_tokens), r.batch, r.t) for r in self.requests), self.source
        )

    def summary(self) -> dict[str, float]:
        lengths = self.row_lengths()
        return {
            "requests": float(len(self.requests)),
            "rows": float(lengths.size),
            "mean_tokens": float(lengths.mean()),
            "p50_tokens": float(np.percentile(lengths, 50)),
            "p95_tokens": float(np.percentile(lengths, 95)),
            "p99_tokens": float(np.percentile(lengths, 99)),
            "max_tokens": float(lengths.max()),
            "mean_batch": float(self.batches.mean()),
        }


def parse_lines(lines: Iterable[str], *, source: str) -> TrafficSample:
    requests = []
    for number, line in enumerate(lines, start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where}: not JSON ({e.msg}); each line must be like {{\"tokens\": 57, \"batch\": 1}}") from e
        if not isinstance(record, dict) or "tokens" not in record:
            raise ConfigError(f"{where}: each line must be an object with a 'tokens' key, got {line[:60]!r}")
        unknown = set(record) - {"tokens", "batch", "t"}
        if unknown:
            raise ConfigError(f"{where}: unknown keys {sorted(unknown)}; allowed: tokens, batch, t")
        tokens, batch = record["tokens"], record.get("batch", 1)
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
            raise ConfigError(f"{where}: 'tokens' must be an integer >= 1, got {tokens!r}")
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            raise ConfigError(f"{where}: 'batch' must be an integer >= 1, got {batch!r}")
        t = record.get("t")
        if t is not None and (not isinstance(t, (int, float)) or t < 0 or math.isnan(t)):
            raise ConfigError(f"{where}: 't' must be a number of seconds >= 0, got {t!r}")
        requests.append(Request(tokens, batch, None if t is None else float(t)))
    return TrafficSample(tuple(requests), source)


def load(path: Path | str) -> TrafficSample:
    path = Path(path)
    try:
        with path.open() as f:
            return parse_lines(f, source=str(path))
    except FileNotFoundError as e:
        raise ConfigError(f"traffic sample {path} does not exist (make one with `tritonbundle traffic`)") from e


def dump(sample: TrafficSample, path: Path | str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for r in sample.requests:
            record: dict[str, float | int] = {"tokens": r.tokens, "batch": r.batch}
            if r.t is not None:
                record["t"] = round(r.t, 6)
            f.write(json.dumps(record) + "\n")
    return path


def synthetic(
    shape: str = "chat",
    *,
    n: int = 10_000,
    max_tokens: int = 512,
    seed: int = 0,
    batch_max: int = 1,
    rate_per_s: float | None = None,
    fixed_tokens: int = 128,
) -> TrafficSample:
    """A synthetic sample for users without logs.

    * ``chat``: log-normal lengths (median 60 tokens, mean ~82, P95 ~224), like chat turns;
    * ``bimodal``: 80 % chat turns and 20 % document chunks (normal around 380 tokens);
    * ``uniform``: uniform over [1, max_tokens];
    * ``fixed``: every request ``fixed_tokens`` long.

    Batch sizes are 1, or uniform over [1, batch_max]. With ``rate_per_s``, arrival times follow a
    Poisson process at that rate.
    """
    if shape not in SHAPES:
        raise ConfigError(f"unknown traffic shape {shape!r}; allowed: {', '.join(SHAPES)}")
    if n < 1 or max_tokens < 2:
        raise ConfigError("a synthetic sample needs n >= 1 and max_tokens >= 2")
    rng = np.random.default_rng(seed)
    if shape == "chat":
        lengths = rng.lognormal(mean=math.log(60), sigma=0.8, size=n)
    elif shape == "bimodal":
        chat = rng.lognormal(mean=math.log(50), sigma=0.6, size=n)
        docs = rng.normal(loc=380, scale=60, size=n)
        lengths = np.where(rng.random(n) < 0.8, chat, docs)
    elif shape == "uniform":
        lengths = rng.integers(1, max_tokens + 1, size=n).astype(float)
    else:
        lengths = np.full(n, float(fixed_tokens))
    tokens = np.clip(np.round(lengths), 3 if max_tokens >= 3 else 1, max_tokens).astype(int)
    batches = rng.integers(1, batch_max + 1, size=n) if batch_max > 1 else np.ones(n, dtype=int)
    times: list[float | None] = [None] * n
    if rate_per_s:
        times = list(np.cumsum(rng.exponential(1.0 / rate_per_s, size=n)))
    return TrafficSample(
        tuple(Request(int(tk), int(b), t) for tk, b, t in zip(tokens, batches, times)),
        source=f"synthetic:{shape}",
    )
