"""Requests drawn from the traffic sample: what is tuned (the build stage plans buckets from the
sample) is what is tested.

Text requests are built from words that BERT's WordPiece keeps as one token each, so a sampled
length of N tokens becomes a text that tokenizes to exactly N tokens ([CLS] and [SEP] included).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

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
