"""The tokenizer model's batch path: one call for every request, each padded to its own target."""

from __future__ import annotations

import numpy as np
import pytest

from tritonbundle.runtimes.text import tokenize


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer

    from tritonbundle.recipes import tokenizer_file

    tok = Tokenizer.from_file(str(tokenizer_file("minilm")))
    tok.no_padding()
    tok.enable_truncation(max_length=512)
    return tok


TEXTS = ["hi", "a man is playing a guitar", "the " * 70, "x", "stock markets fell sharply today " * 3]


def test_each_request_gets_its_own_rows_padded_to_its_target(tokenizer) -> None:  # type: ignore[no-untyped-def]
    spans = [(0, 2), (2, 1), (3, 2)]
    out = tokenize(tokenizer, TEXTS, spans, targets=(16, 64, 128))
    assert [ids.shape for ids, _ in out] == [(2, 16), (1, 128), (2, 64)]  # 17 tokens go to 64
    for (start, count), (ids, mask) in zip(spans, out):
        for row in range(count):
            want = tokenizer.encode(TEXTS[start + row]).ids
            assert ids[row, : len(want)].tolist() == want and not ids[row, len(want):].any()
            assert mask[row].sum() == len(want) and mask[row, : len(want)].all()
        assert ids.flags.c_contiguous and ids.dtype == np.int64 and mask.dtype == np.int64


def test_without_targets_each_request_pads_to_its_own_longest_row(tokenizer) -> None:  # type: ignore[no-untyped-def]
    out = tokenize(tokenizer, TEXTS, [(0, 2), (2, 3)], targets=())
    longest = [max(len(tokenizer.encode(t).ids) for t in TEXTS[:2]), max(len(tokenizer.encode(t).ids) for t in TEXTS[2:])]
    assert [ids.shape[1] for ids, _ in out] == longest
    assert tokenize(tokenizer, [], [], targets=(16,)) == []


@pytest.mark.parametrize("threads, parallel", [(1, "false"), (4, "true")])
def test_the_tokenizer_runs_on_the_threads_it_was_given_whatever_the_environment_says(
        threads: int, parallel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The serving process's environment (inherited from whoever started the server) must not decide
    how many threads tokenize: the model's setting is written before the first encoding."""
    from tritonbundle.recipes import tokenizer_file
    from tritonbundle.runtimes.text import load_tokenizer

    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true" if parallel == "false" else "false")
    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    tok = load_tokenizer(str(tokenizer_file("minilm")), 512, threads)
    import os

    assert os.environ["TOKENIZERS_PARALLELISM"] == parallel
    assert os.environ.get("RAYON_NUM_THREADS") == (str(threads) if threads > 1 else None)
    (ids, mask), = tokenize(tok, TEXTS, [(0, len(TEXTS))], targets=())
    assert ids.shape[0] == len(TEXTS) and mask.sum() == sum(len(tok.encode(t).ids) for t in TEXTS)
