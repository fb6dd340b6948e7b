"""Requests generated from a traffic sample match its length distribution (statistically)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tritonbundle import traffic
from tritonbundle.payloads import ONE_TOKEN_WORDS, PayloadFactory

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tokenizer() -> object:
    from tokenizers import Tokenizer

    from tritonbundle.recipes import tokenizer_file

    tok = Tokenizer.from_file(str(tokenizer_file("minilm")))
    tok.no_padding()
    tok.no_truncation()
    return tok


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs."""
    values = np.union1d(a, b)
    cdf_a = np.searchsorted(np.sort(a), values, side="right") / a.size
    cdf_b = np.searchsorted(np.sort(b), values, side="right") / b.size
    return float(np.max(np.abs(cdf_a - cdf_b)))


def test_every_filler_word_is_one_token(tokenizer: object) -> None:
    for word in ONE_TOKEN_WORDS:
        assert len(tokenizer.encode(word).ids) == 3, word  # type: ignore[attr-defined]  # [CLS] word [SEP]


def test_text_lengths_follow_the_sample_distribution(tokenizer: object) -> None:
    sample = traffic.load(ROOT / "build" / "traffic" / "chat.jsonl")
    factory = PayloadFactory(sample, seed=7)
    drawn = np.array([len(tokenizer.encode(factory.text_payload().texts[0]).ids) for _ in range(2000)])  # type: ignore[attr-defined, index]
    reference = sample.lengths
    d = ks_statistic(drawn, reference)
    n, m = drawn.size, reference.size
    critical = 1.628 * np.sqrt((n + m) / (n * m))  # alpha = 0.01
    assert d < critical, f"KS D={d:.4f} >= {critical:.4f}: generated lengths do not match the sample"


def test_a_different_distribution_is_detected() -> None:
    """The statistical test has power: chat vs bimodal traffic is told apart."""
    chat = traffic.synthetic("chat", n=2000, seed=1).lengths
    bimodal = traffic.synthetic("bimodal", n=2000, seed=1).lengths
    assert ks_statistic(chat, bimodal) > 1.628 * np.sqrt(2 / 2000)


def test_token_payloads_have_the_drawn_shape_and_special_tokens() -> None:
    sample = traffic.synthetic("chat", n=500, seed=2, batch_max=4)
    factory = PayloadFactory(sample, seed=3, max_batch=2)
    for _ in range(50):
        p = factory.token_payload()
        assert p.ids is not None and p.ids.shape == (p.batch, p.tokens)
        assert p.batch <= 2
        assert (p.ids[:, 0] == 101).all() and (p.ids[:, -1] == 102).all()


def test_batch_sizes_follow_the_sample() -> None:
    sample = traffic.synthetic("chat", n=4000, seed=4, batch_max=4)
    factory = PayloadFactory(sample, seed=5)
    drawn = np.array([factory.draw()[1] for _ in range(4000)])
    for b in (1, 2, 3, 4):
        assert abs(np.mean(drawn == b) - np.mean(sample.batches == b)) < 0.03
