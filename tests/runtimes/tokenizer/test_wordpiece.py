"""Single plain texts from the word cache (runtimes/wordpiece.py) give the whole tokenizer's ids: against
the real Hugging Face tokenizer, at truncation's edges, past the cache's size, and only for tokenizers
of BERT's shape."""

from __future__ import annotations

import json
import random
import string
from pathlib import Path
from typing import Any

import pytest

from tritonbundle.recipes import tokenizer_file
from tritonbundle.runtimes import wordpiece


def _whole(path: str, max_length: int) -> Any:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(path)
    tok.enable_truncation(max_length=max_length)
    tok.no_padding()
    return tok


def _texts(seed: int, count: int, longest: int) -> list[str]:
    """Printable ASCII of every kind: words, digits, punctuation runs, words past 100 characters."""
    rng = random.Random(seed)
    alphabet = string.ascii_letters + string.digits + string.punctuation + " " * 12
    pieces = ["x" * 101, "antidisestablishmentarianism", "Don't", "U.S.A.", "3.14159", "##ing", "e-mail", "   "]
    return ["".join(rng.choice(alphabet) if rng.random() < 0.92 else rng.choice(pieces)
                    for _ in range(rng.randint(1, longest))) for _ in range(count)]


@pytest.mark.parametrize("max_length", [3, 8, 64, 512])
def test_cached_words_give_the_whole_tokenizers_ids_at_every_truncation(max_length: int) -> None:
    from tritonbundle.runtimes.text import PlainTextTokenizer, load_tokenizer

    path = str(tokenizer_file("minilm"))
    tok = load_tokenizer(path, max_length)
    assert isinstance(tok, PlainTextTokenizer) and tok.words is not None
    whole = _whole(path, max_length)
    texts = _texts(max_length, 300, 600)
    got = tok.encode_batch_fast(texts)
    for text, a, b in zip(texts, got, whole.encode_batch(texts), strict=True):
        assert isinstance(a, wordpiece.Ids), "every text here is plain: the cache serves it"
        assert (a.ids, a.type_ids, a.attention_mask, len(a)) == (b.ids, b.type_ids, b.attention_mask, len(b)), text


def test_a_full_cache_starts_again_and_pairs_and_other_texts_keep_their_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    from tritonbundle.runtimes.text import load_tokenizer

    monkeypatch.setattr(wordpiece, "CACHE_CHUNKS", 50)
    path = str(tokenizer_file("minilm"))
    tok, whole = load_tokenizer(path, 128), _whole(path, 128)
    rows: list[Any] = [*_texts(1, 40, 300), ("What is Triton?", "A SERVER."), "Café au lait", "tab\there"]
    for row, a, b in zip(rows, tok.encode_batch_fast(rows), whole.encode_batch(rows), strict=True):
        assert (a.ids, a.type_ids) == (b.ids, b.type_ids), row
    assert 0 < len(tok.words.chunks) <= 50
    assert all(len(chunk) <= wordpiece.CACHE_CHUNK_CHARS for chunk in tok.words.chunks), "long chunks are not kept"
    kinds = [type(e).__name__ for e in tok.encode_batch_fast(rows[-3:])]
    assert kinds == ["Encoding", "Encoding", "Encoding"], "a pair, accents, a tab: the Rust tokenizer"


def test_only_a_tokenizer_of_berts_shape_gets_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenizers import Tokenizer

    from tritonbundle.runtimes.text import WORDS_ENV, load_tokenizer

    config = json.loads(tokenizer_file("minilm").read_text())
    bare = Tokenizer.from_str(json.dumps(config))
    assert wordpiece.CachedWordPiece.for_tokenizer(bare, config, 128) is not None
    for change in ({"pre_tokenizer": {"type": "Whitespace"}}, {"post_processor": None},
                   {"added_tokens": [*config["added_tokens"], {**config["added_tokens"][0], "content": "foo",
                                                               "id": 30522, "normalized": True}]}):
        assert wordpiece.CachedWordPiece.for_tokenizer(bare, {**config, **change}, 128) is None, change
    assert wordpiece.CachedWordPiece.for_tokenizer(bare, config, 2) is None, "no room for a token of the text"
    bert = {**config, "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 102], "cls": ["[CLS]", 101]}}
    words = wordpiece.CachedWordPiece.for_tokenizer(bare, bert, 128)
    assert words is not None and words.encode("hello, world").ids == _whole(str(tokenizer_file("minilm")), 128).encode(
        "hello, world").ids
    monkeypatch.setenv(WORDS_ENV, "rust")
    assert load_tokenizer(str(tokenizer_file("minilm")), 128).words is None
