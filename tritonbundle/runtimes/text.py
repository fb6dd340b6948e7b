"""Read and tokenize every request of a dynamic batch in one call of the fast tokenizer.

Shared by the tokenizer model and by an encoder that tokenizes in its own process (the pytorch
runtime with ``tokenize_in_encoder``), so both accept and refuse the same texts. A row is one text,
or a pair of texts (a text-pair model: query and passage, tokenized together with token type ids
0 and 1, truncated longest-first to ``max_length``).

The Rust tokenizer encodes the batch's texts in parallel with the GIL released; the token ids are
then laid into one array with a single vectorized assignment (no loop over rows), and each request
gets its slice, padded to its own target (:func:`tritonbundle.contract.pad_length` of its longest
row), so requests still meet same-shape requests in the encoder's batcher.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tritonbundle.contract import has_content, pad_length
from tritonbundle.runtimes.wordpiece import CachedWordPiece

#: (token ids, attention mask) of one request, and its token type ids when they were asked for.
Tokens = tuple[npt.NDArray[np.int64], ...]
Row = str | tuple[str, str]
#: BERT's WordPiece turns a word longer than 100 characters into one [UNK], and whitespace makes no token
#: at all: a prefix holding 100 non-whitespace characters per token of max_length (and one token more,
#: for a word the cut splits) tokenizes to at least max_length tokens, the ones the whole text gives.
#: (Byte-level BPE makes tokens of whitespace too: only more tokens.)
CHARS_PER_TOKEN = 100
_NON_SPACE = re.compile(r"\S")
#: ``rust``: every text through the tokenizer's own normalizer (:class:`PlainTextTokenizer` off), for A/B
#: measurements.
NORMALIZER_ENV = "TRITONBUNDLE_TOKENIZER_NORMALIZER"
#: ``rust``: plain texts through the Rust WordPiece too, not the word cache (:mod:`.wordpiece`), for A/B
#: measurements.
WORDS_ENV = "TRITONBUNDLE_TOKENIZER_WORDS"


def cut(text: str, max_length: int) -> str:
    """``text`` up to its ``CHARS_PER_TOKEN * (max_length + 1)``-th non-whitespace character: what
    truncation to ``max_length`` tokens keeps of it, without tokenizing the rest. A cut by characters alone
    dropped words of texts with long whitespace runs (and left one of 51,200 leading spaces empty)."""
    keep = CHARS_PER_TOKEN * (max_length + 1)
    if len(text) <= keep:
        return text
    for count, match in enumerate(_NON_SPACE.finditer(text), start=1):
        if count == keep:
            return text[: match.end()]
    return text


class TextError(ValueError):
    """A request's text the tokenizer does not take (a client error: INVALID_ARG)."""


def load_tokenizer(path: str, max_length: int, threads: int = 1) -> Any:
    """The fast tokenizer from ``tokenizer.json``, truncating to ``max_length`` tokens, no padding, encoding
    a batch on ``threads`` threads.

    The Rust library decides per call from ``TOKENIZERS_PARALLELISM`` (its own default: on, its thread
    pool as large as the machine) and sizes that pool once, from ``RAYON_NUM_THREADS``, on first use;
    both are set here, before any encoding, so the process's environment (inherited from whoever
    started the server) does not decide it: one pool of every core per instance oversubscribes a
    machine running several instances, and serial encoding of a 30-text batch costs about 3 ms.
    """
    if threads > 1:
        os.environ["TOKENIZERS_PARALLELISM"] = "true"
        os.environ["RAYON_NUM_THREADS"] = str(threads)
    else:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer

    def load() -> Any:
        tokenizer = Tokenizer.from_file(path)
        tokenizer.enable_truncation(max_length=max_length)
        tokenizer.no_padding()
        return tokenizer

    whole = load()
    config = json.loads(Path(path).read_text(encoding="utf-8"))
    normalizer = config.get("normalizer") or {}
    if normalizer.get("type") != "BertNormalizer" or os.environ.get(NORMALIZER_ENV, "python") == "rust":
        return whole
    bare = load()
    bare.normalizer = None
    raw = tuple(t["content"] for t in config.get("added_tokens") or () if not t.get("normalized", True))
    words = CachedWordPiece.for_tokenizer(bare, config, max_length) if os.environ.get(WORDS_ENV) != "rust" else None
    return PlainTextTokenizer(whole, bare, lowercase=bool(normalizer.get("lowercase", True)), raw_tokens=raw,
                              words=words)


class PlainTextTokenizer:
    """A BERT tokenizer whose normalizer runs in Python for rows of plain text, the same ids faster.

    Hugging Face's ``BertNormalizer`` tracks every character's alignment while it cleans, maps Chinese
    characters, strips accents and lowercases: on chat texts (~70 tokens) it took 0.10 of the 0.23 ms
    per text that encoding took on one thread of the development machine, where the bare tokenizer on
    lowercased texts took 0.11 (``str.lower``: 0.002). On printable ASCII it only lowercases: cleaning
    maps control characters and whitespace other than ' ' (not printable), and Chinese characters and
    accents are not ASCII. So a row whose texts are printable ASCII, and hold none of the added tokens
    matched before normalizing ([CLS], [SEP], ... written into a text), is lowercased here and encoded
    without the normalizer; every other row by the whole tokenizer, in the same call's order. The ids
    are the whole tokenizer's (tests/runtimes/tokenizer/test_text.py). Source:
    huggingface/tokenizers, ``tokenizers/src/normalizers/bert.rs``."""

    def __init__(self, whole: Any, bare: Any, *, lowercase: bool, raw_tokens: Sequence[str],
                 words: CachedWordPiece | None = None) -> None:
        self.whole = whole
        self._encode_whole, self._encode_bare = _encoder(whole), _encoder(bare)
        self.lowercase = lowercase
        self.raw_tokens = tuple(raw_tokens)
        #: Any of them in a text, in one scan (five ``in`` scans took 5x as long on chat texts).
        self._raw = re.compile("|".join(map(re.escape, self.raw_tokens))) if self.raw_tokens else None
        #: Single plain texts from the word cache (:mod:`.wordpiece`; None: the Rust WordPiece for them too).
        self.words = words

    @property
    def kind(self) -> str:
        """The paths it serves, for start-up lines and A/B logs."""
        return type(self).__name__ + ("+CachedWordPiece" if self.words is not None else "")

    def _plain(self, row: Row) -> bool:
        texts = row if isinstance(row, tuple) else (row,)
        raw = self._raw
        return all(t.isascii() and t.isprintable() and (raw is None or raw.search(t) is None) for t in texts)

    def _lower(self, row: Row) -> Row:
        if not self.lowercase:
            return row
        return (row[0].lower(), row[1].lower()) if isinstance(row, tuple) else row.lower()

    def encode_batch_fast(self, rows: Sequence[Row]) -> list[Any]:
        """Each row by its path, in the call's order: a single plain text from the word cache, other
        plain rows (pairs; every plain row without the cache) by the Rust tokenizer without its normalizer,
        the rest by the whole tokenizer."""
        plain = [self._plain(r) for r in rows]
        words = self.words
        cached = [words is not None and p and isinstance(r, str) for r, p in zip(rows, plain)]
        ids = iter([words.encode(r.lower() if self.lowercase else r) for r, c in zip(rows, cached)
                    if c and isinstance(r, str)] if words is not None else [])
        bare = [self._lower(r) for r, p, c in zip(rows, plain, cached) if p and not c]
        fast = iter(self._encode_bare(bare) if bare else [])
        slow = iter(self._encode_whole([r for r, p in zip(rows, plain) if not p]) if not all(plain) else [])
        return [next(ids) if c else next(fast) if p else next(slow) for p, c in zip(plain, cached)]

    def encode(self, *args: Any, **kwargs: Any) -> Any:
        return self.whole.encode(*args, **kwargs)


def _encoder(tokenizer: Any) -> Callable[[list[Row]], list[Any]]:
    """``encode_batch_fast`` (no character offsets; tokenizers >= 0.20), else ``encode_batch``."""
    encode: Callable[[list[Row]], list[Any]] = getattr(tokenizer, "encode_batch_fast", None) or tokenizer.encode_batch
    return encode


def read_texts(array: np.ndarray[Any, Any], name: str, max_text_bytes: int, max_length: int) -> list[str]:
    """The texts of one request's ``[batch, 1]`` BYTES input, each checked (size before decoding, UTF-8,
    something left to tokenize) and cut to what ``max_length`` tokens can hold (:func:`cut`); a
    :class:`TextError` names the first that fails and its position."""
    if array.ndim == 0:
        raise TextError(f"{name} must have a batch dimension, got a scalar")
    if array.size == 0:
        raise TextError(f"{name} is empty: send at least one text")
    if array.ndim > 1 and any(d != 1 for d in array.shape[1:]):
        raise TextError(f"{name} must have shape [batch, 1] (one text per row), got {list(array.shape)}")
    texts = []
    for i, item in enumerate(array.reshape(-1)):
        raw = item if isinstance(item, bytes) else str(item).encode()
        if len(raw) > max_text_bytes:
            raise TextError(
                f"{name}[{i}] is {len(raw)} bytes; the limit is {max_text_bytes} bytes "
                f"(texts are truncated to {max_length} tokens, so send only their beginning)"
            )
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TextError(f"{name}[{i}] is not valid UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start})") from None
        text = cut(text, max_length)
        if not has_content(text):
            raise TextError(f"{name}[{i}] is empty: send at least one character that is not whitespace or a "
                            "control character")
        texts.append(text)
    return texts


def pairs(queries: Sequence[str], texts: Sequence[str], query_name: str, text_name: str) -> list[tuple[str, str]]:
    """One (query, text) pair per row of a request; both inputs must have as many rows."""
    if len(queries) != len(texts):
        raise TextError(f"{query_name} has {len(queries)} rows and {text_name} {len(texts)}: send one {query_name} "
                        f"per {text_name} (repeat the query for each passage)")
    return list(zip(queries, texts))


def tokenize(tokenizer: Any, texts: Sequence[Row], spans: Sequence[tuple[int, int]], targets: Sequence[int],
             pad_id: int = 0, *, type_ids: bool = False) -> list[Tokens]:
    """(token ids, attention mask[, token type ids]) per request; ``spans`` are (first row, number of rows)
    per request; a row is a text or a (query, text) pair."""
    if not texts:
        return []
    encodings = _encoder(tokenizer)(list(texts))
    lengths = np.fromiter((len(e) for e in encodings), dtype=np.int64, count=len(encodings))  # len(e.ids) makes a list
    padded = [pad_length(int(lengths[s : s + n].max()), targets) for s, n in spans]
    width = max(padded)
    mask = np.arange(width) < lengths[:, None]
    count = int(lengths.sum())
    ids = np.full((len(encodings), width), pad_id, dtype=np.int64)
    ids[mask] = np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), dtype=np.int64, count=count)
    arrays = [ids, mask.astype(np.int64)]
    if type_ids:
        types = np.zeros((len(encodings), width), dtype=np.int64)
        types[mask] = np.fromiter(itertools.chain.from_iterable(e.type_ids for e in encodings), dtype=np.int64,
                                  count=count)
        arrays.append(types)
    return [tuple(np.ascontiguousarray(a[s : s + n, :p]) for a in arrays) for (s, n), p in zip(spans, padded)]
