"""The launch planner: which (batch bucket, padding target) launches run a batch of rows at least cost.

Pure numpy, no torch: unit-tested on its own. Every row goes to the smallest padding target that
holds its own length (:func:`tritonbundle.contract.target_index`); rows are grouped by target,
neighbouring groups may be merged into one launch at the longer target when one launch costs less
than two, and each group is split into batch buckets (padded with empty rows up to the bucket).

Packing (:meth:`LaunchPlanner.plan_packed`): several short texts share one row of the launch, each
attending only to itself (the engine's packed forward), so a batch of chat-length texts fills a few
full rows instead of many rows padded to their targets and empty rows padding a batch bucket. Rows are
packed best-fit decreasing into rows of a candidate width; the packing (or none) whose launches cost
least by the same cost table wins.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from tritonbundle.contract import target_index

IntArray = npt.NDArray[np.int64]
#: One launch: (batch bucket, padding target, indices of the rows it carries).
Launch = tuple[int, int, IntArray]
#: (seconds per forward call, seconds per computed token) of an eager launch.
EagerCost = tuple[float, float]
#: Eager launch cost models: merging two length groups into one launch pays off when the call costs
#: more than the padding.
EAGER_COST: dict[str, EagerCost] = {"cpu": (1e-3, 1e-5), "cuda": (2e-3, 2e-7)}
#: Packed rows are tried at the smallest padding targets of at least these widths (on chat-like traffic
#: five widths plan within 0.1 of what trying every target gives, at a third of the planning time).
PACK_WIDTHS = (32, 64, 128, 256, 512)
#: A packed row of ``w`` tokens carries at most ``w // TOKENS_PER_SLOT`` texts (at most MAX_SLOTS).
TOKENS_PER_SLOT = 8
MAX_SLOTS = 64


def max_slots(width: int) -> int:
    """Texts one packed row of ``width`` tokens may carry (its pooled output has this many slots)."""
    return max(1, min(MAX_SLOTS, width // TOKENS_PER_SLOT))


def unit_length(tokens: int, texts: int) -> int:
    """The row length a unit of ``texts`` texts and ``tokens`` tokens needs: its tokens, and at least
    enough for its texts' slots (so the target it lands on has a slot for each)."""
    return tokens if texts <= 1 else max(tokens, TOKENS_PER_SLOT * texts)


def pack_rows(lengths: Sequence[int] | IntArray, width: int, slots: int) -> list[list[int]]:
    """Best-fit decreasing: indices of rows (each at most ``width`` long) into rows of ``width`` tokens,
    at most ``slots`` texts each."""
    return _pack(lengths, width, slots)[0]


def _pack(lengths: Sequence[int] | IntArray, width: int, slots: int) -> tuple[list[list[int]], list[int]]:
    """:func:`pack_rows` and the tokens each packed row holds. Longest first, each into the open row it
    fills best (a sorted list of (room left, row), searched by bisection: no scan over the rows)."""
    sizes = [int(n) for n in lengths]
    order = sorted(range(len(sizes)), key=sizes.__getitem__, reverse=True)
    bins: list[list[int]] = []
    loads: list[int] = []
    open_rows: list[tuple[int, int]] = []  # (room left, row) of rows with a free slot, ascending
    for i in order:
        need = sizes[i]
        k = bisect.bisect_left(open_rows, (need, -1))
        if k < len(open_rows):
            room, b = open_rows.pop(k)
            bins[b].append(i)
            loads[b] += need
            if len(bins[b]) < slots:
                bisect.insort(open_rows, (room - need, b))
        else:
            bins.append([i])
            loads.append(need)
            if slots > 1:
                bisect.insort(open_rows, (width - need, len(bins) - 1))
    return bins, loads


def used_lengths(mask: npt.ArrayLike) -> IntArray:
    """Per row, the position after the last non-zero mask entry (0 for an all-zero row)."""
    array = np.asarray(mask)
    if array.ndim != 2:
        raise ValueError(f"mask must be 2-D, got shape {list(array.shape)}")
    nonzero = array != 0
    last = array.shape[1] - np.argmax(nonzero[:, ::-1], axis=1)
    return np.where(nonzero.any(axis=1), last, 0).astype(np.int64)


class LaunchPlanner:
    """Turns row lengths into launches ``(batch, target, row indices)`` of least total cost.

    ``cost`` maps (batch bucket, target) to seconds when ``buckets`` are given (CUDA graphs: every
    launch has a bucket's shape, rows padded up to it); without buckets every launch has exactly its
    rows, costed by ``eager_cost = (fixed, per_token)``.
    """

    def __init__(
        self, targets: Sequence[int], buckets: Sequence[int] = (), cost: Mapping[tuple[int, int], float] | None = None,
        eager_cost: EagerCost = EAGER_COST["cpu"],
    ) -> None:
        self.targets = tuple(sorted(int(t) for t in targets))
        if not self.targets:
            raise ValueError("at least one padding target is needed")
        self.buckets = tuple(sorted(int(b) for b in buckets))
        self.eager_cost = eager_cost
        self._shape_cost = dict(cost or {})
        # Per target: least cost of k rows (k <= the largest bucket) and the bucket that starts it.
        self._best: dict[int, list[float]] = {}
        self._choice: dict[int, list[int]] = {}
        self._top_cost: dict[int, float] = {}
        self._cost_tables: dict[int, list[float]] = {}
        if self.buckets:
            if cost is None:
                cost = {(b, s): eager_cost[0] + eager_cost[1] * b * s for b in self.buckets for s in self.targets}
                self._shape_cost = cost
            missing = [(b, s) for b in self.buckets for s in self.targets if (b, s) not in cost]
            if missing:
                raise ValueError(f"no launch cost for shapes {missing[:4]}")
            top = self.buckets[-1]
            for s in self.targets:
                best = [0.0] + [math.inf] * top
                choice = [0] * (top + 1)
                for k in range(1, top + 1):
                    for b in self.buckets:
                        c = cost[(b, s)] + best[max(0, k - b)]
                        if c < best[k]:
                            best[k], choice[k] = c, b
                self._best[s], self._choice[s] = best, choice
            self._top_cost = {s: cost[(top, s)] for s in self.targets}

    def batches(self, n: int, target: int) -> list[int]:
        """Batch buckets that cover ``n`` rows at ``target`` at least cost (exact ``[n]`` without buckets)."""
        if n <= 0:
            return []
        if not self.buckets:
            return [n]
        top = self.buckets[-1]
        out = [top] * (n // top) if n > top else []
        rest = n - top * len(out)
        choice = self._choice[target]
        while rest > 0:
            b = choice[rest]
            out.append(b)
            rest -= b
        return out

    def cost(self, n: int, target: int) -> float:
        if n <= 0:
            return 0.0
        if not self.buckets:
            return self.eager_cost[0] + self.eager_cost[1] * n * target
        top = self.buckets[-1]
        full = n // top if n > top else 0
        return full * self._top_cost[target] + self._best[target][n - full * top]

    def _costs(self, target: int, n: int) -> list[float]:
        """``cost(k, target)`` for k = 0..n at least, as a list kept between calls (the planner's inner
        loop reads it instead of calling :meth:`cost`: a third of its time on 52-row batches)."""
        table = self._cost_tables.setdefault(target, [0.0])
        for k in range(len(table), n + 1):
            table.append(self.cost(k, target))
        return table

    def plan(self, lengths: npt.ArrayLike) -> list[Launch]:
        """Launches for rows of these lengths."""
        lengths = np.asarray(lengths, dtype=np.int64)
        if lengths.size == 0:
            return []
        index = target_index(lengths, self.targets)
        # Rows grouped by target in one sort (stable: rows keep their order within a group).
        order = np.argsort(index, kind="stable")
        groups, starts, sizes = np.unique(index[order], return_index=True, return_counts=True)
        rows = {int(k): order[s : s + n] for k, s, n in zip(groups.tolist(), starts.tolist(), sizes.tolist())}
        _, segments = self._segments(groups.tolist(), sizes.tolist())
        launches: list[Launch] = []
        for group_ids, target in segments:
            members = np.concatenate([rows[k] for k in group_ids])
            start = 0
            for batch in self.batches(len(members), target):
                take = members[start : start + batch]
                launches.append((int(batch), int(target), take))
                start += len(take)
        return launches

    def plan_cost(self, lengths: npt.ArrayLike) -> float:
        """What :meth:`plan`'s launches for these lengths cost, without building them."""
        lengths = np.asarray(lengths, dtype=np.int64)
        if lengths.size == 0:
            return 0.0
        counts = np.bincount(target_index(lengths, self.targets), minlength=len(self.targets))
        groups = np.flatnonzero(counts)
        return self._segments(groups.tolist(), counts[groups].tolist())[0]

    def _segments(self, groups: list[int], counts: list[int]) -> tuple[float, list[tuple[list[int], int]]]:
        """Least cost of running length groups (target indices, ascending, with their row counts) and
        the runs of neighbouring groups that share a launch, each with the target it runs at."""
        # f[i]: least cost of groups[:i]; a segment groups[j:i] runs at the target of groups[i - 1].
        f = [0.0] + [math.inf] * len(groups)
        back = [0] * (len(groups) + 1)
        total = sum(counts)
        for i in range(1, len(groups) + 1):
            n = 0
            costs = self._costs(self.targets[groups[i - 1]], total)
            best, arg = math.inf, 0
            for j in range(i, 0, -1):
                n += counts[j - 1]
                c = f[j - 1] + costs[n]
                if c < best:
                    best, arg = c, j - 1
            f[i], back[i] = best, arg
        segments = []
        i = len(groups)
        while i > 0:
            segments.append((groups[back[i] : i], self.targets[groups[i - 1]]))
            i = back[i]
        return f[-1], segments[::-1]

    def launch_cost(self, launches: Sequence[Launch]) -> float:
        if not self.buckets:
            fixed, per_token = self.eager_cost
            return sum(fixed + per_token * batch * target for batch, target, _ in launches)
        return sum(self._shape_cost[(batch, target)] for batch, target, _ in launches)

    def plan_packed(self, lengths: npt.ArrayLike) -> tuple[list[IntArray], list[Launch]]:
        """Units (rows of the launches: arrays of the texts each carries) and launches over the units, for
        the packing of least cost; without packing every unit is one text. Every candidate is costed;
        only the winner's launches are built."""
        lengths = np.asarray(lengths, dtype=np.int64)
        best_bins: list[list[int]] | None = None
        best_short = best_long = np.empty(0, dtype=np.int64)
        best_unit_lengths = lengths
        best_cost = self.plan_cost(lengths)
        widths = sorted({min((t for t in self.targets if t >= w), default=self.targets[-1]) for w in PACK_WIDTHS})
        for width in widths:
            short = np.flatnonzero(lengths <= width)
            if short.size < 2:
                continue
            bins, loads = _pack(lengths[short].tolist(), width, max_slots(width))
            if len(bins) == short.size:
                continue  # nothing shares a row
            long_rows = np.flatnonzero(lengths > width)
            unit_lengths = np.array(
                [unit_length(load, len(b)) for b, load in zip(bins, loads)] + lengths[long_rows].tolist(), dtype=np.int64)
            cost = self.plan_cost(unit_lengths)
            if cost < best_cost:
                best_bins, best_short, best_long, best_unit_lengths, best_cost = bins, short, long_rows, unit_lengths, cost
        if best_bins is None:
            return [np.array([i], dtype=np.int64) for i in range(lengths.size)], self.plan(lengths)
        units = [best_short[b] for b in best_bins] + [np.array([i], dtype=np.int64) for i in best_long]
        return units, self.plan(best_unit_lengths)


def pack_inputs(
    ids: IntArray, masks: IntArray, lengths: IntArray, units: Sequence[IntArray], batch: int, target: int,
) -> tuple[IntArray, IntArray, IntArray, IntArray]:
    """One packed launch's host inputs [3, batch, target] (token ids; each token's text number in its row,
    1-based, 0 for padding and masked tokens; its position in its text) and, per text carried, its row,
    its slot (0-based) and its index in ``ids``. ``units`` are the launch's rows, each the texts it carries
    (their first ``lengths`` tokens, back to back). No loop over texts or tokens."""
    sizes = np.fromiter((len(u) for u in units), dtype=np.int64, count=len(units))
    texts = np.concatenate(units).astype(np.int64)
    first = np.cumsum(sizes) - sizes
    row = np.repeat(np.arange(len(units), dtype=np.int64), sizes)
    slot = np.arange(texts.size, dtype=np.int64) - np.repeat(first, sizes)
    lens = lengths[texts]
    start = np.cumsum(lens) - lens
    offset = start - np.repeat(start[first], sizes)
    token_text = np.repeat(np.arange(texts.size, dtype=np.int64), lens)
    position = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(start, lens)
    dest_row, dest_col, src = row[token_text], offset[token_text] + position, texts[token_text]
    host = np.zeros((3, batch, target), dtype=np.int64)
    host[0, dest_row, dest_col] = ids[src, position]
    host[1, dest_row, dest_col] = np.where(masks[src, position] != 0, slot[token_text] + 1, 0)
    host[2, dest_row, dest_col] = position
    return host, row, slot, texts


def launch_tokens(launches: Sequence[Launch]) -> int:
    """Tokens the launches compute (padding rows and padding positions included)."""
    return int(sum(batch * target for batch, target, _ in launches))
