"""Texts are cut before tokenizing to what truncation to max_length tokens keeps (runtimes/text.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tritonbundle.recipes import tokenizer_file


@pytest.mark.parametrize("text", [" " * 60_000 + "hello world", ("a" + " " * 200) * 1_000,
                                  ("word\n\n" + "\t" * 150) * 800, "x" * 120 + " y" * 60_000])
def test_the_cut_before_tokenizing_keeps_every_token_truncation_keeps(text: str) -> None:
    """A cut by characters alone (51,200) dropped words of texts with long whitespace runs, changing their
    embedding silently, and left a text of leading whitespace empty (refused)."""
    from tokenizers import Tokenizer

    from tritonbundle.runtimes.text import cut

    tok = Tokenizer.from_file(str(tokenizer_file("minilm")))
    tok.enable_truncation(max_length=512)
    assert tok.encode(cut(text, 512)).ids == tok.encode(text).ids


ROWS = ["Hello, World! It's 3:45 PM; the U.S. GDP rose 2.5% (est.) -- see https://example.com/a?b=c#d.",
        "a man is playing a guitar", "ALL CAPS TEXT WITH NUMBERS 12345 and {braces} [brackets] <tags> ~`^|\\",
        "[CLS] a text with the model's own tokens [SEP] [MASK] inside", "lower [cls] and [Mask] look-alikes",
        "tab\tand\nnewline", "Café naïve résumé", "中文 mixed with English", "emoji 🙂 here", "nbsp\u00a0space",
        "nul\x00char", "  leading and trailing spaces  ", "x" * 150 + " overlong word", "word " * 700,
        ("What is Triton?", "Triton Inference Server serves MODELS."), ("Qu'est-ce que c'est ?", "Un serveur."),
        ("[SEP] in a query", "plain passage")]


def _whole(path: str, max_length: int = 128) -> Any:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(path)
    tok.enable_truncation(max_length=max_length)
    tok.no_padding()
    return tok


def _same_ids(tok: Any, whole: Any, rows: list[Any]) -> None:
    got, want = tok.encode_batch_fast(rows), whole.encode_batch(rows)
    for row, a, b in zip(rows, got, want, strict=True):
        assert (a.ids, a.type_ids, a.attention_mask) == (b.ids, b.type_ids, b.attention_mask), row


def test_plain_rows_skip_the_normalizer_and_give_the_whole_tokenizers_ids() -> None:
    """Mixed rows in one call (each path keeps its place), then each row alone; the rows that take the
    fast path are the printable ASCII ones without an added token written in."""
    from tritonbundle.runtimes.text import PlainTextTokenizer, load_tokenizer

    path = str(tokenizer_file("minilm"))
    tok = load_tokenizer(path, 128)
    assert isinstance(tok, PlainTextTokenizer) and tok.lowercase
    whole = _whole(path)
    _same_ids(tok, whole, ROWS)
    for row in ROWS:
        _same_ids(tok, whole, [row])
    plain = [tok._plain(r) for r in ROWS]
    assert plain[:3] == [True, True, True] and plain[3:4] == [False] and plain[4] is True
    assert not any(plain[5:11]) and plain[14:16] == [True, True] and plain[16] is False


def test_random_ascii_gives_the_whole_tokenizers_ids() -> None:
    """Printable ASCII of every kind, uppercase, punctuation, digits, bracket fragments of added tokens."""
    import random
    import string

    from tritonbundle.runtimes.text import load_tokenizer

    path = str(tokenizer_file("minilm"))
    rng = random.Random(7)
    alphabet = string.ascii_letters + string.digits + string.punctuation + " " * 10
    pieces = ["[CLS", "SEP]", "[UNK ]", "[mask]", "##ing", "Don't", "U.S.A."]
    rows = ["".join(rng.choice(alphabet) if rng.random() < 0.9 else rng.choice(pieces)
                    for _ in range(rng.randint(1, 400))) for _ in range(400)]
    _same_ids(load_tokenizer(path, 256), _whole(path, 256), rows)


def test_a_cased_bert_normalizer_keeps_the_case_and_others_get_the_whole_tokenizer(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    from tritonbundle.runtimes.text import PlainTextTokenizer, load_tokenizer

    config = json.loads(tokenizer_file("minilm").read_text())
    config["normalizer"]["lowercase"] = False
    cased = tmp_path / "cased.json"
    cased.write_text(json.dumps(config))
    tok = load_tokenizer(str(cased), 128)
    assert isinstance(tok, PlainTextTokenizer) and not tok.lowercase
    _same_ids(tok, _whole(str(cased)), ROWS)
    config["normalizer"] = {"type": "Lowercase"}
    other = tmp_path / "other.json"
    other.write_text(json.dumps(config))
    assert isinstance(load_tokenizer(str(other), 128), Tokenizer)


def test_the_environment_turns_the_plain_text_path_off_for_an_a_b(monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenizers import Tokenizer

    from tritonbundle.runtimes.text import NORMALIZER_ENV, PlainTextTokenizer, load_tokenizer

    monkeypatch.setenv(NORMALIZER_ENV, "rust")
    assert isinstance(load_tokenizer(str(tokenizer_file("minilm")), 128), Tokenizer)
    monkeypatch.setenv(NORMALIZER_ENV, "python")
    assert isinstance(load_tokenizer(str(tokenizer_file("minilm")), 128), PlainTextTokenizer)
