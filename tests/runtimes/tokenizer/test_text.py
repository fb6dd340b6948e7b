"""Texts are cut before tokenizing to what truncation to max_length tokens keeps (runtimes/text.py)."""

from __future__ import annotations

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
