"""The search space: which knobs the tuner turns, the values it tries, and where it starts.

Every knob is a manifest tunable (``tritonbundle.manifest.Tunables``), so a winner is a set of
manifest overrides the build stage applies as it would any other. Candidate values are seeded from
what can be computed before measuring: the queue delays from the SLO (a batcher that waits a tenth
of the SLO has spent it), the instance counts from the cores, and, where the engine reports its
launch times (the pytorch runtime's CUDA graphs), the batch sizes whose slowest launch fits in half
the SLO.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

Config = dict[str, Any]

#: The knob that folds the tokenizer into the encoder's process (no tokenizer model, no ensemble).
FOLD = "tokenize_in_encoder"
#: The order the coordinate descent visits the knobs: the biggest effects first, as measured on the H200
#: (docs/benchmarks.md, docs/tuning.md): encoder instances (two to three: +71 %; six to eight folded:
#: +18 %), folding the tokenizer in with its processes kept (+76 % in the tune from the bad start), the
#: tokenizer's threads after it (folded, one to four threads: +40 %; unfolded, where they are the
#: tokenizer model's, two and four read 10 % and 9 % under one), the queue delay; the batch buckets
#: after them, their cap being derived from the engine's launch times (:func:`space`).
ORDER = ("instances", FOLD, "tokenizer_threads", "max_queue_delay_us", "batch_buckets", "tokenizer_instances",
         "tokenizer_queue_delay_us", "preferred_batch_sizes")
#: Knobs of the tokenizer model, which a folded configuration does not have (``tokenizer_threads`` still
#: sets the threads of the encoder's own tokenizer calls).
TOKENIZER_MODEL_KNOBS = ("tokenizer_instances", "tokenizer_queue_delay_us")
BUCKET_SETS: tuple[tuple[int, ...], ...] = (
    (1,), (1, 8), (1, 8, 32), (1, 4, 16, 64), (1, 2, 4, 8, 16, 32, 64), (1, 2, 4, 8, 16, 32, 64, 128),
    (1, 2, 4, 8, 16, 32, 64, 128, 256),
)
#: Buckets between the powers of two, offered where every launch is a CUDA graph padded up to its bucket
#: (an engine that reports its launch times: the pytorch runtime on a GPU): they cut the empty rows, at
#: one more graph per bucket and padding target to capture at start-up. BERT-base on the H200, three
#: interleaved rounds: 15,713 req/s against 14,740 for the powers of two to 64 (docs/benchmarks.md,
#: "Batch buckets between the powers of two").
GRAPH_BUCKET_SETS: tuple[tuple[int, ...], ...] = ((1, 2, 3, 4, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64),)


#: The process and thread counts, whose larger neighbour is tried first (:attr:`Knob.upward_first`).
UPWARD_FIRST = frozenset({"instances", "tokenizer_instances", "tokenizer_threads"})


@dataclass(frozen=True)
class Knob:
    name: str
    values: tuple[Any, ...]
    #: Try the larger neighbour first (a move that pays leaves the other way untried this round). For the
    #: process and thread counts: in the 14 recorded GPU tunes that stepped instances (docs/tuning/), the
    #: smaller neighbour, measured first, never paid (the H100 run: 1 instance 3,933 req/s against the 2
    #: it came from at 6,081) and all 17 moves of instances went up.
    upward_first: bool = False

    def onward(self, before: Any, after: Any) -> list[Any]:
        """The values past ``after`` in the direction from ``before``, at strides of 2, 4, 8... candidates,
        the last candidate that way included (so a long run of values is crossed in a few steps)."""
        if before not in self.values or after not in self.values or before == after:
            return []
        i, j = self.values.index(before), self.values.index(after)
        way, stride, out = (1 if j > i else -1), 2, []
        while 0 < j < len(self.values) - 1:
            j = min(len(self.values) - 1, max(0, j + way * stride))
            out.append(self.values[j])
            stride *= 2
        return out

    def past(self, before: Any, after: Any) -> Any | None:
        """The candidate one step past ``after`` in the direction from ``before`` (None at the end)."""
        if before not in self.values or after not in self.values or before == after:
            return None
        i, j = self.values.index(before), self.values.index(after)
        k = j + (1 if j > i else -1)
        return self.values[k] if 0 <= k < len(self.values) else None

    def between(self, near: Any, far: Any) -> Any | None:
        """The candidate halfway from ``near`` to ``far`` (the nearer of two middles), None when they are
        next to each other: where a stride that overshot is bisected back."""
        if near not in self.values or far not in self.values:
            return None
        i, j = self.values.index(near), self.values.index(far)
        if abs(j - i) < 2:
            return None
        return self.values[(i + j) // 2 if j > i else (i + j + 1) // 2]

    def neighbours(self, value: Any) -> list[Any]:
        """The values next to ``value`` (its nearest candidate when it is not one)."""
        if value in self.values:
            i = self.values.index(value)
        else:
            i = min(range(len(self.values)), key=lambda j: abs(_scalar(self.values[j]) - _scalar(value)))
            return [self.values[i]]
        ways = (i + 1, i - 1) if self.upward_first else (i - 1, i + 1)
        return [self.values[j] for j in ways if 0 <= j < len(self.values)]


def _scalar(value: Any) -> float:
    if isinstance(value, tuple):
        return float(max(value, default=0))
    if isinstance(value, str):
        return float(("none", "max", "buckets").index(value)) if value in ("none", "max", "buckets") else 0.0
    return float(value)


@dataclass(frozen=True)
class Space:
    knobs: tuple[Knob, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)

    def knob(self, name: str) -> Knob:
        return next(k for k in self.knobs if k.name == name)

    def moved(self, config: Mapping[str, Any], name: str, value: Any) -> Config:
        """``config`` with knob ``name`` at ``value``. Folding the tokenizer in (or out) keeps the number of
        Python processes: E encoder and T tokenizer instances fold into E + T instances that do both (the
        largest instance count up to it), and back into E - T encoders (at least one). Why: on the H200,
        under MPS, six folded instances passed 19 % more than four encoders beside four tokenizers
        (docs/benchmarks.md, "the tokenizer folded into six encoders"), while two folded instances lost
        50 % against two encoders beside four tokenizers (docs/tuning.md, "Once more from the bad start"):
        the fold pays with the tokenizers' processes kept, so a descent that folds alone never takes it."""
        out = {**config, name: value}
        if (name != FOLD or bool(value) == bool(config.get(FOLD)) or "instances" not in config
                or "tokenizer_instances" not in config):
            return out
        tokenizers = int(config["tokenizer_instances"])
        wanted = max(1, int(config["instances"]) + (tokenizers if value else -tokenizers))
        counts = next((k.values for k in self.knobs if k.name == "instances"), (wanted,))
        out["instances"] = max((n for n in counts if n <= wanted), default=min(counts))
        return out


def offered(knob: str, *, text: bool, fold: bool) -> bool:
    """Whether the tuner turns ``knob`` for a model: the tokenizer's knobs only for a text model, and
    ``tokenize_in_encoder`` only where its runtime and task accept it (``fold``)."""
    if knob.startswith("tokenizer_"):
        return text
    return fold if knob == FOLD else True


def inert(knob: str, config: Mapping[str, Any]) -> bool:
    """Whether ``knob`` does nothing in ``config`` (the descent does not spend a point on it): the
    tokenizer model's knobs when the encoder tokenizes itself."""
    return bool(config.get(FOLD)) and knob in TOKENIZER_MODEL_KNOBS


def space(*, slo_ms: float, cores: int, text: bool, gpu: bool, launch_ms: Mapping[tuple[int, int], float] | None = None,
          knobs: Sequence[str] = ORDER, include: Sequence[Mapping[str, Any]] = (), fold: bool = False) -> Space:
    """The knobs to search for a model served under ``slo_ms`` on a machine with ``cores`` cores.

    ``launch_ms``: the engine's measured time per launch at (batch, padded length), when it reports
    them: batch sizes whose slowest launch takes more than half the SLO are left out. ``include``:
    configurations whose values join the candidates (the start and the manifest's own settings, so
    the search can step from them). ``fold``: the model can tokenize in its encoder (:func:`offered`);
    under MPS that passed 19 % more texts on the H200 than the ensemble (docs/benchmarks.md).
    """
    notes = []
    slo_us = slo_ms * 1000
    delays = tuple(sorted({0, int(slo_us / 100), int(slo_us / 50), int(slo_us / 20), int(slo_us / 10)}))
    notes.append(f"queue delays {', '.join(f'{d} us' for d in delays)}: up to a tenth of the {slo_ms:g} ms SLO")
    most = max(1, cores if not gpu else min(8, cores // 2))
    instances = tuple(n for n in (1, 2, 3, 4, 6, 8) if n <= most) or (1,)
    notes.append(f"instances up to {instances[-1]} ({cores} cores{', GPU' if gpu else ''})")
    buckets = BUCKET_SETS
    if launch_ms:  # the engine's launches are CUDA graphs, each padded up to its batch bucket
        buckets = tuple(sorted(BUCKET_SETS + GRAPH_BUCKET_SETS, key=lambda b: (max(b), len(b))))
        slowest = {b: max(t for (bb, _), t in launch_ms.items() if bb == b) for b, _ in launch_ms}
        fits = [b for b, t in slowest.items() if t <= slo_ms / 2]
        if len(fits) < len(slowest):  # else every measured size fits: nothing says where to stop
            largest = max(fits, default=1)
            buckets = tuple(s for s in buckets if max(s) <= largest) or ((1,),)
            notes.append(f"batch buckets up to {largest}: the engine's slowest launch at {largest} rows "
                         f"({slowest.get(largest, 0):.1f} ms) fits in half the SLO, at {min(set(slowest) - set(fits))} "
                         "it does not")
        else:
            notes.append(f"batch buckets: the engine's slowest launch at {max(slowest)} rows takes "
                         f"{slowest[max(slowest)]:.1f} ms, within half the SLO")
    elif not gpu:
        buckets = tuple(s for s in BUCKET_SETS if max(s) <= 64)
    all_knobs = {
        "batch_buckets": Knob("batch_buckets", buckets),
        "instances": Knob("instances", instances),
        "max_queue_delay_us": Knob("max_queue_delay_us", delays),
        "tokenizer_instances": Knob("tokenizer_instances", tuple(n for n in (1, 2, 4, 6, 8) if n <= max(1, cores))),
        "tokenizer_queue_delay_us": Knob("tokenizer_queue_delay_us", tuple(d for d in (0, 100, 200, 500, 1000) if d <= slo_us / 20)),
        "tokenizer_threads": Knob("tokenizer_threads", tuple(n for n in (1, 2, 4, 8) if n <= max(1, cores // 2))),
        "preferred_batch_sizes": Knob("preferred_batch_sizes", ("none", "max", "buckets")),
        FOLD: Knob(FOLD, (False, True)),
    }
    all_knobs = {name: replace(k, upward_first=name in UPWARD_FIRST) for name, k in all_knobs.items()}
    chosen = [_with(all_knobs[k], [c[k] for c in include if k in c]) for k in knobs
              if k in all_knobs and offered(k, text=text, fold=fold)]
    return Space(tuple(chosen), tuple(notes))


def _with(knob: Knob, extra: Sequence[Any]) -> Knob:
    """``knob`` with ``extra`` values among its candidates, in order."""
    values = list(knob.values)
    for value in extra:
        value = tuple(value) if isinstance(value, list) else value
        if value not in values:
            values.append(value)
    return replace(knob, values=tuple(sorted(values, key=lambda v: (_scalar(v), len(v) if isinstance(v, tuple) else 0))))


def config_from_json(config: Mapping[str, Any]) -> Config:
    """A configuration read back from JSON, which has lists where a configuration holds tuples (batch
    buckets): the manifest takes them, and the search compares and steps from them, as its own."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in config.items()}


def key(config: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """A hashable identity of a configuration."""
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in config.items()))


def describe(config: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={list(v) if isinstance(v, tuple) else v}" for k, v in sorted(config.items()))
