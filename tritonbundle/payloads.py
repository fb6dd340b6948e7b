"""Requests drawn from the traffic sample: what is tuned (the build stage plans buckets from the
sample) is what is tested, for every task.

Text requests are built from words that BERT's WordPiece keeps as one token each, so a sampled
length of N tokens becomes a text that tokenizes to exactly N tokens ([CLS] and [SEP] included).

:func:`for_model` makes the requests of any served model, for load tests, ``tune``, ``bench`` and
``tritonbundle infer --random``, from the model's own description (its metadata and config: the task,
and for an encoder the names and sizes of its dynamic axes, which the build records), so a load test
needs no manifest:

* text tasks: texts of the traffic sample's token counts through the task's client method (``embed``,
  ``classify``, or ``rerank``: one short query against the drawn number of passages); ``tokens``:
  pre-tokenized rows straight to a text-embedding model's encoder;
* ``tensor``: arrays of the declared shapes; each named axis takes the size the traffic sample gives it
  (``shape.<axis>``, or ``tokens`` for ``sequence``), else the plan's typical size; the batch is the
  sample's (at most ``max_batch``), else 1. Values: floats from a standard normal, integer inputs 0 (a
  valid index for any embedding table) except masks (names containing ``mask``: 1), booleans true. Or
  rows of recorded inputs (a ``.npz`` with one array per input, first axis the samples).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tritonbundle.contract import task_of
from tritonbundle.errors import ConfigError
from tritonbundle.traffic import TrafficSample

#: Common English words that are one WordPiece token each in BERT's uncased vocabulary.
ONE_TOKEN_WORDS = (
    "the of and to in is was for on that with as by at from his it an were are which this be or has had "
    "not but first one their also its new after who they two her she been other when time all during "
    "into school there would world year city music game house water light river night day man part "
    "people state life war work film team family group church book name system government"
).split()


@dataclass(frozen=True)
class Payload:
    tokens: int
    batch: int
    texts: list[str] | None = None
    ids: np.ndarray[Any, Any] | None = None


class PayloadFactory:
    """Draws (length, batch) from a sample and builds text or token payloads of exactly that size."""

    def __init__(self, sample: TrafficSample, *, seed: int = 0, max_tokens: int = 512, max_batch: int = 32) -> None:
        self.sample = sample.clipped(max_tokens)
        self.max_batch = max_batch
        self.rng = np.random.default_rng(seed)
        self._lengths = self.sample.lengths
        self._batches = np.minimum(self.sample.batches, max_batch)

    def draw(self) -> tuple[int, int]:
        i = int(self.rng.integers(0, len(self._lengths)))
        return int(self._lengths[i]), int(self._batches[i])

    def text(self, tokens: int) -> str:
        """A text of ``tokens`` tokens including [CLS] and [SEP] (so ``tokens - 2`` words, at least one)."""
        words = self.rng.choice(ONE_TOKEN_WORDS, size=max(1, tokens - 2))
        return " ".join(words)

    def token_ids(self, tokens: int, batch: int) -> np.ndarray[Any, Any]:
        ids = self.rng.integers(1000, 30000, size=(batch, tokens), dtype=np.int64)
        ids[:, 0] = 101  # [CLS]
        ids[:, -1] = 102  # [SEP]
        return ids

    def text_payload(self) -> Payload:
        tokens, batch = self.draw()
        return Payload(tokens, batch, texts=[self.text(tokens) for _ in range(batch)])

    def token_payload(self) -> Payload:
        tokens, batch = self.draw()
        return Payload(tokens, batch, ids=self.token_ids(tokens, batch))


# -- the requests of any served model ------------------------------------------------------------
#: Protocol data types -> numpy.
NUMPY = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
         "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
         "FP32": np.float32, "FP64": np.float64}
#: Tokens of a text-pair request's query (the passages take the sample's lengths).
QUERY_TOKENS = 10


@dataclass(frozen=True)
class Call:
    """One request: what it is (the load test's request name), its size, and how to send it."""

    kind: str
    rows: int
    #: Tokens per row of a text request (0 for tensors).
    tokens: int
    send: Callable[[Any], Any]


class Requests(Protocol):
    def next(self) -> Call: ...


class TextRequests:
    """Texts drawn from the traffic sample, sent with the task's client method."""

    def __init__(self, task: str, sample: TrafficSample, *, seed: int, max_batch: int, max_tokens: int = 512,
                 kind: str = "text") -> None:
        self.task = task
        self.kind = kind
        self.factory = PayloadFactory(sample, seed=seed, max_batch=max_batch, max_tokens=max_tokens)

    def next(self) -> Call:
        tokens, batch = self.factory.draw()
        if self.kind == "tokens":
            ids = self.factory.token_ids(tokens, batch)
            return Call("tokens", batch, tokens, lambda client: client.embed_tokens(ids))
        texts = [self.factory.text(tokens) for _ in range(batch)]
        if self.task == "text-pair":
            query = self.factory.text(QUERY_TOKENS)
            return Call("pairs", batch, tokens, lambda client: client.rerank(query, texts))
        method = "classify" if self.task == "text-classification" else "embed"
        return Call("text", batch, tokens, lambda client: getattr(client, method)(texts))


@dataclass(frozen=True)
class TensorInput:
    name: str
    datatype: str
    #: Batch excluded: ints are static, names are dynamic axes.
    dims: tuple[int | str, ...]


def tensor_inputs(inputs: Mapping[str, tuple[str, tuple[int, ...]]], parameters: Mapping[str, str],
                  batched: bool) -> list[TensorInput]:
    """The inputs as the build named their dimensions (parameter ``axes``), else as the metadata has them
    (a dynamic dimension without a name is called ``dim<i>``)."""
    named = json.loads(parameters.get("axes") or "{}")
    out = []
    for name, (datatype, shape) in inputs.items():
        if name in named:
            dims: list[int | str] = [int(d) if d.isdigit() else d for d in named[name].split(",")]
            if batched and dims and dims[0] == "batch":
                dims = dims[1:]
        else:
            metadata = list(shape[1:] if batched else shape)
            dims = [d if d > 0 else f"dim{i}" for i, d in enumerate(metadata)]
        out.append(TensorInput(name, datatype, tuple(dims)))
    return out


def typical_sizes(parameters: Mapping[str, str]) -> dict[str, int]:
    """Named axis -> the plan's typical size (parameter ``axis_sizes``: "least,typical,largest")."""
    sizes = json.loads(parameters.get("axis_sizes") or "{}")
    return {axis: int(value.split(",")[1]) for axis, value in sizes.items()}


class TensorRequests:
    """Arrays of the model's declared shapes (module docstring)."""

    def __init__(self, inputs: list[TensorInput], *, batched: bool, max_batch: int, seed: int,
                 sample: TrafficSample | None = None, typical: Mapping[str, int] | None = None,
                 recorded: Path | None = None) -> None:
        self.inputs = inputs
        self.batched = batched
        self.max_batch = max(1, max_batch)
        self.rng = np.random.default_rng(seed)
        self.sample = sample
        self.typical = dict(typical or {})
        self.recorded = load_recorded(recorded, inputs) if recorded is not None else None

    def sizes(self) -> tuple[int, dict[str, int]]:
        """(batch, named axis -> size) of the next request."""
        sizes = dict(self.typical)
        batch = 1
        if self.sample is not None:
            request = self.sample.requests[int(self.rng.integers(0, len(self.sample.requests)))]
            batch = request.batch
            if request.tokens:
                sizes["sequence"] = request.tokens
            sizes.update(dict(request.shape))
        return (min(batch, self.max_batch) if self.batched else 1), sizes

    def arrays(self) -> dict[str, np.ndarray[Any, Any]]:
        batch, sizes = self.sizes()
        if self.recorded is not None:
            count = next(iter(self.recorded.values())).shape[0]
            rows = self.rng.integers(0, count, size=batch)
            return {n: np.ascontiguousarray(a[rows] if self.batched else a[rows[0]]) for n, a in self.recorded.items()}
        out = {}
        for t in self.inputs:
            shape = ([batch] if self.batched else []) + [d if isinstance(d, int) else sizes.get(d, 1) for d in t.dims]
            out[t.name] = random_array(t, shape, self.rng)
        return out

    def next(self) -> Call:
        arrays = self.arrays()
        rows = next(iter(arrays.values())).shape[0] if self.batched and arrays else 1
        return Call("tensor", rows, 0, lambda client: client.infer(arrays))


def random_array(t: TensorInput, shape: list[int], rng: np.random.Generator) -> np.ndarray[Any, Any]:
    dtype = NUMPY.get(t.datatype)
    if dtype is None:
        raise ConfigError(f"input {t.name}: no random data for data type {t.datatype}; give recorded inputs (.npz)")
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    if dtype is np.bool_:
        return np.ones(shape, dtype=dtype)
    return np.full(shape, 1 if "mask" in t.name.lower() else 0, dtype=dtype)


def load_recorded(path: Path, inputs: list[TensorInput]) -> dict[str, np.ndarray[Any, Any]]:
    try:
        data = np.load(path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"recorded inputs {path} are not a readable .npz: {e}") from e
    missing = [t.name for t in inputs if t.name not in data.files]
    if missing:
        raise ConfigError(f"recorded inputs {path} have no arrays for {missing} (they have {data.files})")
    arrays = {t.name: np.asarray(data[t.name]) for t in inputs}
    counts = {a.shape[0] for a in arrays.values()}
    if len(counts) != 1 or 0 in counts:
        raise ConfigError(f"recorded inputs {path}: every array needs the same number of samples (first axis), got {counts}")
    return arrays


def for_model(info: Any, sample: TrafficSample | None, *, seed: int = 0, max_batch: int = 32, kind: str = "auto",
              recorded: Path | None = None) -> Requests:
    """The requests for the served model described by ``info`` (:class:`tritonbundle.clients.ModelInfo`).
    ``kind``: ``auto`` (the model's task), or ``tokens`` (token rows to a text-embedding encoder)."""
    inputs = {t.name: (t.datatype, tuple(t.shape)) for t in info.inputs}
    task = task_of(info.parameters, {n: d for n, (d, _) in inputs.items()})
    batched = info.max_batch_size > 0
    limit = min(max_batch, info.max_batch_size) if batched else 1
    if task != "tensor" and kind != "tokens" and recorded is None:
        if sample is None or "sequence" not in sample.axes():
            raise ConfigError(f"model {info.name} takes text: its requests are drawn from a traffic sample of token "
                              "counts (--traffic, or a synthetic one)")
        return TextRequests(task, sample, seed=seed, max_batch=limit)
    if kind == "tokens":
        if sample is None:
            raise ConfigError("token requests are drawn from a traffic sample of token counts")
        return TextRequests(task, sample, seed=seed, max_batch=limit, kind="tokens")
    return TensorRequests(tensor_inputs(inputs, info.parameters, batched), batched=batched, max_batch=limit, seed=seed,
                          sample=sample if sample is not None and sample.axes() else None,
                          typical=typical_sizes(info.parameters), recorded=recorded)
