"""BERT's WordPiece for single texts of plain ASCII from a cache of each chunk's ids: the tokenizer's
ids, at a sixth of its time per text.

:class:`.text.PlainTextTokenizer` hands this the texts that are printable ASCII, hold no added token,
and are lowercased already when the tokenizer lowercases. On such a text BERT's pre-tokenizer
(``BertPreTokenizer``; huggingface/tokenizers, ``tokenizers/src/pre_tokenizers/bert.rs``) splits on
whitespace (of printable ASCII, only ' ') and on every ASCII punctuation character, which stands alone:
the words between are runs of letters and digits (:data:`WORD`). WordPiece gives a word the same ids
wherever it stands (``tokenizers/src/models/wordpiece/mod.rs``: greedy longest match, ``##``
continuations, ``[UNK]`` past 100 characters), so a chunk between spaces ("you?": its words "you", "?")
has the same ids wherever it stands too. A text is split on its spaces (``str.split``, in C), each
chunk's ids are looked up, and a chunk not seen yet is split into words and asked of the tokenizer's own
model once, then kept (up to :data:`CACHE_CHUNKS` chunks of at most :data:`CACHE_CHUNK_CHARS` characters,
then the cache starts again). The post-processor puts ``[CLS]`` before and ``[SEP]`` after a single
text; truncation as :func:`.text.load_tokenizer` sets it (longest first, on the right, no stride) keeps
its first ``max_length - 2`` ids.

Development machine, one thread, through ``tokenize()`` (``scripts/tokenize_speed.py``, 2026-12-05):
the bench's chat texts 0.017 ms per text (0.025 with a regular expression and a lookup per word, the
cache's first form), against 0.067 with the Rust WordPiece and 0.103 for the whole tokenizer; Zipf-drawn
vocabulary words with 30 % rare compounds 0.016 warm (0.022) and 0.058 with every chunk new (0.050)
(docs/benchmarks.md, "The word cache by chunks"). Pairs and every other text stay with the Rust tokenizer.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from typing import Any

#: Words of a printable ASCII text as BERT's pre-tokenizer makes them: runs of letters and digits, and
#: each punctuation character (``char::is_ascii_punctuation``: ``!`` to ``/``, ``:`` to ``@``, ``[`` to
#: `````, ``{`` to ``~``) alone; spaces separate.
WORD = re.compile(r"[A-Za-z0-9]+|[!-/:-@\[-`{-~]")
#: Chunks kept per tokenizer (~10-20 MB of ids); past it the cache is emptied and fills again.
CACHE_CHUNKS = 100_000
#: A longer chunk (a URL, a blob, a word past WordPiece's 100 characters) is tokenized each time, never
#: kept: the cache's bound counts chunks, so long ones must not enter it (a text may carry ~50 kB of them).
CACHE_CHUNK_CHARS = 64


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
    """Encodes one plain text (:class:`Ids`) from the chunk cache, asking ``model`` (the tokenizer's
    ``tokenizers.models.WordPiece``) for the words of a chunk it has not seen."""

    def __init__(self, model: Any, cls_ids: list[int], sep_ids: list[int], max_length: int) -> None:
        self.model, self.cls_ids, self.sep_ids = model, list(cls_ids), list(sep_ids)
        #: How many ids of the text itself fit: max_length less the special tokens.
        self.keep = max_length - len(cls_ids) - len(sep_ids)
        #: Each chunk's ids (its words' ids in order): what is looked up per chunk of a text.
        self.chunks: dict[str, list[int]] = {}

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
        # Each whitespace-separated chunk (the text is printable ASCII: only ' ' separates) gives one or
        # more ids and the same ones wherever it stands, so the first `keep` chunks hold every id kept.
        chunks = text.split(None, self.keep)[: self.keep]
        try:
            pieces = list(map(self.chunks.__getitem__, chunks))
        except KeyError:
            pieces = [self._learn(chunk) for chunk in chunks]
        ids = [*self.cls_ids, *itertools.chain.from_iterable(pieces)]
        del ids[self.keep + len(self.cls_ids):]
        ids.extend(self.sep_ids)
        return Ids(ids)

    def _learn(self, chunk: str) -> list[int]:
        """The ids of ``chunk``, from the cache or from the tokenizer's model, word by word (then kept)."""
        got = self.chunks.get(chunk)
        if got is None:
            got = [t.id for word in WORD.findall(chunk) for t in self.model.tokenize(word)]
            if len(chunk) <= CACHE_CHUNK_CHARS:
                if len(self.chunks) >= CACHE_CHUNKS:
                    self.chunks.clear()
                self.chunks[chunk] = got
        return got


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
