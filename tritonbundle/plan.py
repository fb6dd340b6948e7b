"""Profile planning: pure functions from a traffic sample and a model spec to a build plan.

Sequence buckets are chosen by an exact dynamic program over the length histogram that minimises
the expected number of computed (padded) tokens. Each bucket's TensorRT ``opt`` length is the shape
the engine will be asked to run, as NVIDIA's guidance for optimization profiles recommends (tune
kernels for the shapes that actually occur): under the ``targets`` policy every request arrives
padded to the bucket's edge, so ``opt`` is the edge; under ``ragged`` it is a percentile (default
P95) of the lengths that fall in the bucket.
Optimization profiles are batch buckets x the buckets of every named dynamic axis.

Every dynamic axis is planned the same way: the traffic sample gives each request's size on it
(``tokens`` for ``sequence``, ``shape.<axis>`` for the others), the same dynamic program chooses its
bucket edges, and each profile holds one bucket per axis. Only the sequence axis of text is padded
(the tokenizer pads token rows); the others (an image's height and width) are served at the size the
request has, so their ``opt`` is the percentile of the sizes in the bucket, and a model with no
traffic for an axis gets one bucket ``[1, axes.<axis>.max]``.

Two padding policies exist; the runtime says which one it uses (``Runtime.padding_policy``) and
the plan records it:

* ``targets``: the tokenizer (or the client) pads every request to its bucket's upper edge, so
  same-shape requests meet in Triton's dynamic batcher and every batch matches a profile (or a
  captured CUDA graph) exactly (TensorRT, ONNX Runtime's GPU backend, the pytorch runtime).
* ``ragged``: requests arrive unpadded, the batcher groups them anyway (``allow_ragged_batch``) and
  the Python-backend model pads each batch to its own longest request (the CPU server's ONNX
  Runtime model, where there is no per-shape compilation to amortise).

This module needs only the manifest and the traffic sample: it knows nothing of runtimes or files.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tritonbundle.errors import ConfigError
from tritonbundle.manifest import BATCH, SEQUENCE, Axis, ModelSpec
from tritonbundle.traffic import TrafficSample

POLICIES = ("targets", "ragged")


# -- sequence buckets ------------------------------------------------------------------------------
def histogram(lengths: np.ndarray[Any, Any], max_len: int) -> np.ndarray[Any, Any]:
    """Counts per length 0..max_len (index = length); lengths above max_len are truncated to it."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size == 0:
        raise ConfigError("cannot plan buckets from an empty traffic sample")
    if lengths.min() < 1:
        raise ConfigError("sequence lengths must be >= 1")
    return np.bincount(np.minimum(lengths, max_len), minlength=max_len + 1)


def padded_tokens(counts: np.ndarray[Any, Any], edges: Sequence[int]) -> int:
    """Tokens computed when every length is padded up to the first edge that holds it."""
    total, low = 0, 0
    for edge in edges:
        total += int(counts[low + 1 : edge + 1].sum()) * int(edge)
        low = edge
    if low < len(counts) - 1 and counts[low + 1 :].sum() > 0:
        raise ConfigError(f"lengths above the last edge {low} are not covered")
    return total


def choose_edges(lengths: np.ndarray[Any, Any], buckets: int, max_len: int) -> tuple[int, ...]:
    """Upper edges of at most ``buckets`` sequence buckets, the last one ``max_len``.

    Exact: dynamic programming over the distinct observed lengths (an optimal edge always sits on
    an observed length, or on ``max_len``), minimising the padded tokens of the sample.
    ``f[k][j]`` is the least cost of covering candidates ``1..j`` with ``k`` buckets, the last of
    which ends at candidate ``j``. O(buckets x n^2) for n distinct lengths (n <= max_len).
    """
    if buckets < 1:
        raise ConfigError("the number of sequence buckets must be >= 1")
    counts = histogram(lengths, max_len)
    candidates = np.array(sorted(set(np.nonzero(counts)[0].tolist()) | {max_len}), dtype=np.int64)
    cumulative = np.concatenate([[0], np.cumsum(counts)])  # cumulative[l + 1] = rows with length <= l
    covered = cumulative[candidates + 1]  # rows with length <= candidate j
    n = len(candidates)
    k_max = min(buckets, n)
    inf = np.iinfo(np.int64).max // 4
    f = np.full((k_max + 1, n), inf, dtype=np.int64)
    back = np.zeros((k_max + 1, n), dtype=np.int64)
    f[1] = covered * candidates  # one bucket from length 1 up to candidate j
    for k in range(2, k_max + 1):
        for j in range(k - 1, n):
            # previous bucket ends at candidate i < j; this one holds (u_i, u_j]
            i = np.arange(k - 2, j)
            costs = f[k - 1, i] + (covered[j] - covered[i]) * candidates[j]
            best = int(np.argmin(costs))
            f[k, j] = costs[best]
            back[k, j] = i[best]
    last = n - 1
    k_best = int(np.argmin(f[1:, last])) + 1  # fewer buckets never cost more; ties -> fewest
    edges, j = [], last
    for k in range(k_best, 0, -1):
        edges.append(int(candidates[j]))
        j = int(back[k, j])
    return tuple(sorted(edges))


def brute_force_edges(lengths: np.ndarray[Any, Any], buckets: int, max_len: int) -> int:
    """The least padded-token cost over every choice of edges (for tests; exponential)."""
    import itertools

    counts = histogram(lengths, max_len)
    inner = range(1, max_len)
    best = padded_tokens(counts, (max_len,))
    for k in range(1, buckets):
        for combo in itertools.combinations(inner, k):
            best = min(best, padded_tokens(counts, (*combo, max_len)))
    return best


@dataclass(frozen=True)
class SequenceBucket:
    """A bucket of one dynamic axis (the name is the sequence axis's, the first one planned)."""

    min: int
    opt: int
    max: int
    #: Share of the sample's rows in this bucket.
    share: float


Bucket = SequenceBucket


def sequence_buckets(lengths: np.ndarray[Any, Any], buckets: int, max_len: int, percentile: float = 95.0) -> tuple[SequenceBucket, ...]:
    edges = choose_edges(lengths, buckets, max_len)
    clipped = np.minimum(np.asarray(lengths), max_len)
    out, low = [], 0
    for edge in edges:
        inside = clipped[(clipped > low) & (clipped <= edge)]
        opt = int(math.ceil(np.percentile(inside, percentile))) if inside.size else edge
        out.append(SequenceBucket(min=low + 1, opt=min(max(opt, low + 1), edge), max=edge, share=inside.size / clipped.size))
        low = edge
    return tuple(out)


# -- batch buckets and profiles ---------------------------------------------------------------------
@dataclass(frozen=True)
class BatchBucket:
    min: int
    opt: int
    max: int


def batch_buckets(sizes: Sequence[int]) -> tuple[BatchBucket, ...]:
    sizes = sorted(set(int(s) for s in sizes))
    if not sizes or sizes[0] < 1:
        raise ConfigError("batch buckets must be integers >= 1")
    out: list[BatchBucket] = []
    low = 0
    for size in sizes:
        out.append(BatchBucket(min=low + 1, opt=size, max=size))
        low = size
    return tuple(out)


@dataclass(frozen=True)
class Profile:
    """One TensorRT optimization profile: per input, its min/opt/max shape (batch included)."""

    index: int
    shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]
    batch: BatchBucket
    #: The bucket of each named dynamic axis (``sequence`` included).
    axes: dict[str, Bucket] = field(default_factory=dict)

    @property
    def sequence(self) -> Bucket | None:
        return self.axes.get(SEQUENCE)


def _shape(decl_shape: Sequence[int | str], batch: int, sizes: dict[str, int]) -> tuple[int, ...]:
    return tuple(batch if (i == 0 and d == BATCH) else sizes[d] if isinstance(d, str) else int(d)
                 for i, d in enumerate(decl_shape))


def profiles(spec: ModelSpec, batches: Sequence[BatchBucket], axes: dict[str, Sequence[Bucket]]) -> tuple[Profile, ...]:
    """Every batch bucket x every combination of the axes' buckets."""
    out: list[Profile] = []
    names = list(axes)
    for b in batches:
        for combo in itertools.product(*(axes[n] for n in names)):
            chosen = dict(zip(names, combo))
            shapes = {}
            for t in spec.inputs:
                low = {n: c.min for n, c in chosen.items()}
                mid = {n: c.opt for n, c in chosen.items()}
                high = {n: c.max for n, c in chosen.items()}
                shapes[t.name] = (_shape(t.shape, b.min, low), _shape(t.shape, b.opt, mid), _shape(t.shape, b.max, high))
            out.append(Profile(len(out), shapes, b, chosen))
    return tuple(out)


# -- padding waste ----------------------------------------------------------------------------------
def expected_batch_max(lengths: np.ndarray[Any, Any], batch: int) -> float:
    """E[max of ``batch`` lengths drawn from the sample]: what padding to the batch's longest costs."""
    values, counts = np.unique(np.asarray(lengths), return_counts=True)
    cdf = np.cumsum(counts) / counts.sum()
    prev = np.concatenate([[0.0], cdf[:-1]])
    return float(np.sum(values * (cdf**batch - prev**batch)))


@dataclass(frozen=True)
class Waste:
    """Computed tokens per useful token (1.0 = no padding) under each strategy."""

    bucketed: float
    pad_to_max: float
    #: One dynamic profile [1, max]; batches padded to their longest request (also the ragged policy).
    single_profile: dict[int, float]


def waste(lengths: np.ndarray[Any, Any], edges: Sequence[int], max_len: int, batch_sizes: Sequence[int]) -> Waste:
    clipped = np.minimum(np.asarray(lengths), max_len)
    useful = float(clipped.sum())
    counts = histogram(clipped, max_len)
    return Waste(
        bucketed=padded_tokens(counts, edges) / useful,
        pad_to_max=max_len * clipped.size / useful,
        single_profile={int(b): expected_batch_max(clipped, int(b)) / float(clipped.mean()) for b in batch_sizes},
    )


# -- the plan -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelPlan:
    model: str
    runtime: str
    target: str
    policy: str
    max_batch_size: int
    max_sequence_length: int
    batch_buckets: tuple[BatchBucket, ...]
    sequence_buckets: tuple[SequenceBucket, ...]
    profiles: tuple[Profile, ...]
    preferred_batch_sizes: tuple[int, ...]
    max_queue_delay_us: int
    waste: Waste | None
    traffic: dict[str, float] = field(default_factory=dict)
    #: The buckets of every named dynamic axis other than ``sequence`` (its own are ``sequence_buckets``).
    axis_buckets: dict[str, tuple[Bucket, ...]] = field(default_factory=dict)

    @property
    def padding_targets(self) -> tuple[int, ...]:
        """Lengths the tokenizer/client pads to (empty under the ragged policy)."""
        return tuple(s.max for s in self.sequence_buckets) if self.policy == "targets" else ()

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["padding_targets"] = list(self.padding_targets)
        return data


def axis_buckets(spec: ModelSpec, axis: Axis, sample: TrafficSample | None) -> tuple[Bucket, ...]:
    """Buckets of a named axis other than ``sequence``: from the sample's sizes on it (above the axis's
    ``max`` they are clipped to it), or one bucket ``[1, max]`` when the sample has none."""
    if sample is not None and axis.name in sample.axes():
        sizes = sample.row_sizes(axis.name)
        high = axis.max or int(sizes.max())
        return sequence_buckets(np.minimum(sizes, high), axis.buckets, high, spec.opt_percentile)
    if not axis.max:
        where = f"model {spec.name}"
        raise ConfigError(
            f"{where}: its axis {axis.name!r} is dynamic, so planning needs the sizes requests have on it: a traffic "
            f"sample whose lines give shape.{axis.name} (build/traffic/README.md), or axes.{axis.name}.max in the "
            "manifest (one bucket from 1 to it)"
        )
    return (Bucket(min=1, opt=axis.max, max=axis.max, share=1.0),)


def plan_model(spec: ModelSpec, sample: TrafficSample | None, *, policy: str = "targets") -> ModelPlan:
    """Plan one model under a padding policy (it applies to the sequence axis of text). A model without
    dynamic axes needs no traffic sample."""
    if policy not in POLICIES:
        raise ConfigError(f"padding policy {policy!r} is not one of {', '.join(POLICIES)}")
    batches = batch_buckets(spec.batch_buckets) if spec.batched else (BatchBucket(1, 1, 1),)
    seqs: tuple[SequenceBucket, ...] = ()
    plan_waste = None
    summary: dict[str, float] = {}
    others: dict[str, tuple[Bucket, ...]] = {}
    for axis in spec.axes:
        if axis.name != SEQUENCE:
            others[axis.name] = axis_buckets(spec, axis, sample)
    if spec.has_sequence:
        if sample is None:
            raise ConfigError(
                f"model {spec.name}: it has a sequence dimension, so planning needs a traffic sample "
                "(manifest key 'traffic', or --traffic; make one with `tritonbundle traffic`)"
            )
        clipped = sample.clipped(spec.max_sequence_length)
        rows = clipped.row_lengths()
        seqs = sequence_buckets(rows, spec.sequence_buckets, spec.max_sequence_length, spec.opt_percentile)
        if policy == "targets":
            # Every request is padded to its bucket's edge, so the edge is the only length the engine
            # sees in that bucket: tune for it (opt = max), not for a percentile it never serves.
            seqs = tuple(dataclasses.replace(s, opt=s.max) for s in seqs)
        plan_waste = waste(rows, [s.max for s in seqs], spec.max_sequence_length, [b.max for b in batches])
    if sample is not None and (spec.has_sequence or others):
        summary = (sample.clipped(spec.max_sequence_length) if spec.has_sequence else sample).summary()
    axes: dict[str, Sequence[Bucket]] = {}
    for axis in spec.axes:
        axes[axis.name] = seqs if axis.name == SEQUENCE else others[axis.name]
    profs = profiles(spec, batches, axes)
    sizes = [b.max for b in batches if b.max > 1]
    preferred: tuple[int, ...] = ()
    if spec.batched and spec.preferred_batch_sizes == "buckets":
        preferred = tuple(sizes)
    elif spec.batched and spec.preferred_batch_sizes == "max" and sizes:
        preferred = (sizes[-1],)
    return ModelPlan(
        model=spec.name,
        runtime=spec.runtime,
        target=spec.target,
        policy=policy,
        max_batch_size=spec.max_batch_size,
        max_sequence_length=spec.max_sequence_length,
        batch_buckets=batches,
        sequence_buckets=seqs,
        profiles=profs,
        preferred_batch_sizes=preferred,
        max_queue_delay_us=spec.max_queue_delay_us,
        waste=plan_waste,
        traffic=summary,
        axis_buckets=others,
    )
