"""BERT's WordPiece for single texts of plain ASCII from a cache of each word's ids: the tokenizer's
ids, at a fifth of its time per text.

:class:`.text.PlainTextTokenizer` hands this the texts that are printable ASCII, hold no added token,
and are lowercased already when the tokenizer lowercases. On such a text BERT's pre-tokenizer
(``BertPreTokenizer``; huggingface/tokenizers, ``tokenizers/src/pre_tokenizers/bert.rs``) splits on
whitespace (of printable ASCII, only ' ') and on every ASCII punctuation character, which stands alone:
the words between are runs of letters and digits (:data:`WORD`). WordPiece gives a word the same ids
wherever it stands (``tokenizers/src/models/wordpiece/mod.rs``: greedy longest match, ``##``
continuations, ``[UNK]`` past 100 characters), so each word is asked of the tokenizer's own model once
and its ids are kept (up to :data:`CACHE_WORDS` words, then the cache starts again). The post-processor
puts ``[CLS]`` before and ``[SEP]`` after a single text; truncation as :func:`.text.load_tokenizer`
sets it (longest first, on the right, no stride) keeps its first ``max_length - 2`` ids.

Development machine, one thread, through ``tokenize()`` (``scripts/tokenize_speed.py``): the bench's
chat texts 0.037 ms per text against 0.090 with the Rust WordPiece (and 0.137 for the whole tokenizer);
Zipf-drawn vocabulary words with 30 % rare compounds 0.029 warm and 0.070 with every word new, against
0.094 (docs/benchmarks.md). Pairs and every other text stay with the Rust tokenizer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

#: Words of a printable ASCII text as BERT's pre-tokenizer makes them: runs of letters and digits, and
#: each punctuation character (``char::is_ascii_punctuation``: ``!`` to ``/``, ``:`` to ``@``, ``[`` to
#: `````, ``{`` to ``~``) alone; spaces separate.
WORD = re.compile(r"[A-Za-z0-9]+|[!-/:-@\[-`{-~]")
#: Words kept per tokenizer (~10-20 MB of ids); past it the cache is emptied and fills again.
CACHE_WORDS = 100_000


class Ids:
    """What :func:`.text.tokenize` reads of an encoding: its ids and length (one segment: type ids 0)."""

    __slots__ = ("ids",)

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def type_ids(self) -> list[int]:
        return [0] * len(self.ids)

    @property
    def attention_mask(self) -> list[int]:
        return [1] * len(self.ids)


class CachedWordPiece:
    """Encodes one plain text (:class:`Ids`) from the word cache, asking ``model`` (the tokenizer's
    ``tokenizers.models.WordPiece``) for the words it has not seen."""

    def __init__(self, model: Any, cls_ids: list[int], sep_ids: list[int], max_length: int) -> None:
        self.model, self.cls_ids, self.sep_ids = model, list(cls_ids), list(sep_ids)
        #: How many ids of the text itself fit: max_length less the special tokens.
        self.keep = max_length - len(cls_ids) - len(sep_ids)
        self.words: dict[str, list[int]] = {}

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, config: Mapping[str, Any], max_length: int) -> CachedWordPiece | None:
        """For a tokenizer of BERT's shape (``tokenizer.json`` as ``config``), else None: the BERT
        pre-tokenizer, a WordPiece model, one special token before and after a single text, and no
        added token matched after normalizing (those would split a word before WordPiece sees it)."""
        if (config.get("pre_tokenizer") or {}).get("type") != "BertPreTokenizer":
            return None
        if (config.get("model") or {}).get("type") != "WordPiece":
            return None
        if any(t.get("normalized", True) for t in config.get("added_tokens") or ()):
            return None
        ends = _special_ends(config.get("post_processor") or {})
        if ends is None or max_length - len(ends[0]) - len(ends[1]) < 1:
            return None
        return cls(tokenizer.model, ends[0], ends[1], max_length)

    def encode(self, text: str) -> Ids:
        words, ids = self.words, list(self.cls_ids)
        for word in WORD.findall(text):
            got = words.get(word)
            if got is None:
                if len(words) >= CACHE_WORDS:
                    words.clear()
                got = words[word] = [t.id for t in self.model.tokenize(word)]
            ids.extend(got)
            if len(ids) > self.keep + len(self.cls_ids):
                break
        del ids[self.keep + len(self.cls_ids):]
        ids.extend(self.sep_ids)
        return Ids(ids)


def _special_ends(post: Mapping[str, Any]) -> tuple[list[int], list[int]] | None:
    """The ids the post-processor puts before and after a single text: ``BertProcessing`` (cls, sep) or a
    ``TemplateProcessing`` whose single template is special tokens, the text (type id 0), special
    tokens; None for any other."""
    if post.get("type") == "BertProcessing":
        return [int(post["cls"][1])], [int(post["sep"][1])]
    if post.get("type") != "TemplateProcessing":
        return None
    specials = post.get("special_tokens") or {}
    before: list[int] = []
    after: list[int] = []
    seen_text = False
    for piece in post.get("single") or ():
        if "Sequence" in piece:
            if seen_text or piece["Sequence"].get("id") != "A" or piece["Sequence"].get("type_id", 0) != 0:
                return None
            seen_text = True
        elif "SpecialToken" in piece and piece["SpecialToken"].get("type_id", 0) == 0:
            token = specials.get(piece["SpecialToken"]["id"])
            if token is None:
                return None
            (after if seen_text else before).extend(int(i) for i in token["ids"])
        else:
            return None
    return (before, after) if seen_text else None
