"""Tokenize every request of a dynamic batch in one call of the fast tokenizer.

The Rust tokenizer encodes the batch's texts in parallel with the GIL released; the token ids are
then laid into one array with a single vectorized assignment (no loop over rows), and each request
gets its slice, padded to its own target (:func:`tritonbundle.contract.pad_length` of its longest
row), so requests still meet same-shape requests in the encoder's batcher.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from tritonbundle.contract import pad_length

Tokens = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]


def tokenize(tokenizer: Any, texts: Sequence[str], spans: Sequence[tuple[int, int]], targets: Sequence[int],
             pad_id: int = 0) -> list[Tokens]:
    """(token ids, attention mask) per request; ``spans`` are (first text, number of texts) per request."""
    if not texts:
        return []
    encode = getattr(tokenizer, "encode_batch_fast", None) or tokenizer.encode_batch
    encodings = encode(list(texts))
    lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
    padded = [pad_length(int(lengths[s : s + n].max()), targets) for s, n in spans]
    width = max(padded)
    mask = np.arange(width) < lengths[:, None]
    ids = np.full((len(encodings), width), pad_id, dtype=np.int64)
    ids[mask] = np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), dtype=np.int64, count=int(lengths.sum()))
    mask64 = mask.astype(np.int64)
    return [(np.ascontiguousarray(ids[s : s + n, :p]), np.ascontiguousarray(mask64[s : s + n, :p]))
            for (s, n), p in zip(spans, padded)]
