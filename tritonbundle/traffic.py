"""The traffic sample: one file format shared by profile planning, load tests and benchmarks.

Format: JSON Lines, one request per line::

    {"tokens": 57, "batch": 1}
    {"tokens": 212, "batch": 4, "t": 0.53}
    {"shape": {"height": 480, "width": 640}, "batch": 1}

``tokens`` is the request's sequence length after tokenization (special tokens included): the size of
the ``sequence`` axis of text. ``shape`` gives the request's size on any other named dynamic axis of
the manifest (``height``, ``width``, ``frames``...). ``batch`` is the number of rows it carries
(default 1), and the optional ``t`` its arrival time in seconds since the start of the sample (used
for replay; omitted in synthetic samples). A line has ``tokens``, ``shape`` or both. Blank lines and
lines starting with ``#`` are ignored. What is tuned is what is tested: the build stage plans buckets
from this file and the load tests draw their requests from the same file.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tritonbundle.errors import ConfigError

SHAPES = ("chat", "bimodal", "uniform", "fixed")


#: The axis ``tokens`` measures.
SEQUENCE = "sequence"
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Request:
    #: Size of the ``sequence`` axis (0: the request has none).
    tokens: int = 0
    batch: int = 1
    t: float | None = None
    #: (axis, size) of the other named axes, sorted by name.
    shape: tuple[tuple[str, int], ...] = ()

    def size(self, axis: str) -> int | None:
        if axis == SEQUENCE:
            return self.tokens or None
        return dict(self.shape).get(axis)


@dataclass(frozen=True)
class TrafficSample:
    requests: tuple[Request, ...]
    source: str = "<memory>"

    def __post_init__(self) -> None:
        if not self.requests:
            raise ConfigError(f"{self.source}: the traffic sample is empty: it needs at least one request")

    @property
    def lengths(self) -> np.ndarray[Any, Any]:
        """Each request's ``tokens`` (an error when a request has none: the sample is not one of text)."""
        return self.sizes(SEQUENCE)

    def axes(self) -> tuple[str, ...]:
        """The named axes every request of the sample gives a size for."""
        names = {SEQUENCE} | {name for r in self.requests for name, _ in r.shape}
        return tuple(sorted(n for n in names if all(r.size(n) for r in self.requests)))

    def sizes(self, axis: str) -> np.ndarray[Any, Any]:
        """Each request's size on ``axis`` (``sequence``: its tokens)."""
        missing = next((i for i, r in enumerate(self.requests) if not r.size(axis)), None)
        if missing is not None:
            key = "tokens" if axis == SEQUENCE else f'shape.{axis}'
            have = ", ".join(self.axes()) or "none"
            raise ConfigError(f"{self.source}: request {missing + 1} has no {key!r}: every request must give a size "
                              f"for the model's axis {axis!r} (the sample's axes: {have})")
        return np.array([r.size(axis) for r in self.requests], dtype=np.int64)

    def row_sizes(self, axis: str) -> np.ndarray[Any, Any]:
        """One entry per row on ``axis`` (a request of batch 4 counts 4 times): what the engine sees."""
        return np.repeat(self.sizes(axis), self.batches)

    @property
    def batches(self) -> np.ndarray[Any, Any]:
        return np.array([r.batch for r in self.requests], dtype=np.int64)

    def row_lengths(self) -> np.ndarray[Any, Any]:
        """One entry per row (a request of batch 4 counts its length 4 times): what the engine sees."""
        return self.row_sizes(SEQUENCE)

    def clipped(self, max_tokens: int) -> TrafficSample:
        """Lengths above ``max_tokens`` are truncated to it (as the tokenizer does)."""
        return TrafficSample(
            tuple(dataclasses.replace(r, tokens=min(r.tokens, max_tokens)) for r in self.requests), self.source
        )

    def summary(self) -> dict[str, float]:
        out = {"requests": float(len(self.requests)), "rows": float(self.batches.sum())}
        axes = self.axes()
        if SEQUENCE in axes:
            lengths = self.row_lengths()
            out.update({
                "mean_tokens": float(lengths.mean()),
                "p50_tokens": float(np.percentile(lengths, 50)),
                "p95_tokens": float(np.percentile(lengths, 95)),
                "p99_tokens": float(np.percentile(lengths, 99)),
                "max_tokens": float(lengths.max()),
            })
        for axis in axes:
            if axis != SEQUENCE:
                sizes = self.row_sizes(axis)
                out.update({f"mean_{axis}": float(sizes.mean()), f"max_{axis}": float(sizes.max())})
        out["mean_batch"] = float(self.batches.mean())
        return out


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
        if not isinstance(record, dict) or not ({"tokens", "shape"} & set(record)):
            raise ConfigError(f"{where}: each line must be an object with a 'tokens' or a 'shape' key, got {line[:60]!r}")
        unknown = set(record) - {"tokens", "shape", "batch", "t"}
        if unknown:
            raise ConfigError(f"{where}: unknown keys {sorted(unknown)}; allowed: tokens, shape, batch, t")
        tokens, batch = record.get("tokens", 0), record.get("batch", 1)
        if "tokens" in record and (not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1):
            raise ConfigError(f"{where}: 'tokens' must be an integer >= 1, got {tokens!r}")
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            raise ConfigError(f"{where}: 'batch' must be an integer >= 1, got {batch!r}")
        t = record.get("t")
        if t is not None and (not isinstance(t, (int, float)) or t < 0 or math.isnan(t)):
            raise ConfigError(f"{where}: 't' must be a number of seconds >= 0, got {t!r}")
        requests.append(Request(tokens, batch, None if t is None else float(t), _shape(record.get("shape"), where)))
    return TrafficSample(tuple(requests), source)


def _shape(raw: Any, where: str) -> tuple[tuple[str, int], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{where}: 'shape' must be an object of axis sizes, like {{\"height\": 480, \"width\": 640}}")
    for name, size in raw.items():
        if name == SEQUENCE:
            raise ConfigError(f"{where}: give the sequence length as 'tokens', not shape.sequence")
        if not NAME.match(name) or name == "batch":
            raise ConfigError(f"{where}: shape.{name}: not an axis name (letters, digits, _; not 'batch')")
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ConfigError(f"{where}: shape.{name} must be an integer >= 1, got {size!r}")
    return tuple(sorted(raw.items()))


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
            record: dict[str, Any] = {"tokens": r.tokens} if r.tokens else {}
            if r.shape:
                record["shape"] = dict(r.shape)
            record["batch"] = r.batch
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
