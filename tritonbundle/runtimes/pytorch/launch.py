"""The launch planner: which (batch bucket, padding target) launches run a batch of rows at least cost.

Pure numpy, no torch: unit-tested on its own. Every row goes to the smallest padding target that
holds its own length (:func:`tritonbundle.contract.target_index`); rows are grouped by target,
neighbouring groups may be merged into one launch at the longer target when one launch costs less
than two, and each group is split into batch buckets (padded with empty rows up to the bucket).
"""

from __future__ import annotations

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
        # Per target: least cost of k rows (k <= the largest bucket) and the bucket that starts it.
        self._best: dict[int, list[float]] = {}
        self._choice: dict[int, list[int]] = {}
        self._top_cost: dict[int, float] = {}
        if self.buckets:
            if cost is None:
                cost = {(b, s): eager_cost[0] + eager_cost[1] * b * s for b in self.buckets for s in self.targets}
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

    def plan(self, lengths: npt.ArrayLike) -> list[Launch]:
        """Launches for rows of these lengths."""
        lengths = np.asarray(lengths, dtype=np.int64)
        if lengths.size == 0:
            return []
        index = target_index(lengths, self.targets)
        groups = sorted(set(index.tolist()))
        rows = {k: np.flatnonzero(index == k) for k in groups}
        counts = [len(rows[k]) for k in groups]
        # f[i]: least cost of groups[:i]; a segment groups[j:i] runs at the target of groups[i - 1].
        f = [0.0] + [math.inf] * len(groups)
        back = [0] * (len(groups) + 1)
        for i in range(1, len(groups) + 1):
            n = 0
            for j in range(i, 0, -1):
                n += counts[j - 1]
                c = f[j - 1] + self.cost(n, self.targets[groups[i - 1]])
                if c < f[i]:
                    f[i], back[i] = c, j - 1
        segments = []
        i = len(groups)
        while i > 0:
            segments.append((back[i], i))
            i = back[i]
        launches: list[Launch] = []
        for j, i in reversed(segments):
            target = self.targets[groups[i - 1]]
            members = np.concatenate([rows[k] for k in groups[j:i]])
            start = 0
            for batch in self.batches(len(members), target):
                take = members[start : start + batch]
                launches.append((int(batch), int(target), take))
                start += len(take)
        return launches


def launch_tokens(launches: Sequence[Launch]) -> int:
    """Tokens the launches compute (padding rows and padding positions included)."""
    return int(sum(batch * target for batch, target, _ in launches))
