"""The OpenAI embeddings API's shapes, with no I/O: what a ``POST /v1/embeddings`` body may hold, the
response and the error bodies (https://platform.openai.com/docs/api-reference/embeddings).

``input`` is a string, a list of strings, a list of token ids (one input already tokenized) or a list
of such lists. Token ids are the served model's own vocabulary (a BERT's WordPiece ids, not tiktoken's):
clients that tokenize with tiktoken before sending (LangChain's ``OpenAIEmbeddings`` by default) must be
told not to (``check_embedding_ctx_length=False``). ``encoding_format`` is ``float`` (a list of numbers)
or ``base64`` (the little-endian float32 bytes, as OpenAI's clients decode them). ``dimensions`` is
accepted only when it equals the model's own size: these models cannot shorten their vectors.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tritonbundle.contract import MAX_TEXT_BYTES, has_content

#: OpenAI's own limit on inputs per request.
MAX_INPUTS = 2048
ENCODINGS = ("float", "base64")


class ApiError(Exception):
    """An OpenAI-shaped error: HTTP status, ``error.type``, ``error.code``, ``error.param``."""

    def __init__(self, status: int, message: str, *, kind: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None, retry_after_s: float | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.code, self.param = status, message, kind, code, param
        self.retry_after_s = retry_after_s
        #: Why a request was refused (metering: unauthenticated, rate, tokens, concurrency, server_busy).
        self.reason = reason
        #: Tokens the server spent on the request before it was refused (None: not known).
        self.tokens_used: int | None = None

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def invalid(message: str, param: str | None = "input") -> ApiError:
    return ApiError(400, message, param=param, code="invalid_value")


@dataclass(frozen=True)
class EmbeddingsRequest:
    model: str
    #: Texts, or token rows (never both).
    texts: tuple[str, ...] = ()
    token_rows: tuple[tuple[int, ...], ...] = ()
    encoding: str = "float"
    dimensions: int | None = None
    #: Each text's size in UTF-8 bytes and its whitespace-separated words, as :func:`parse` counted them.
    text_bytes: tuple[int, ...] = ()
    text_words: tuple[int, ...] = ()

    @property
    def count(self) -> int:
        return len(self.texts) or len(self.token_rows)

    def most_tokens(self, max_length: int | None) -> int:
        """An estimate, from above, of the tokens this request will use, before it is sent: a token row's
        length; a text's UTF-8 bytes and 2 special tokens (a WordPiece or byte-level BPE token covers at
        least one byte), at most ``max_length`` (the model's longest sequence, when known)."""
        return self._tokens([size + 2 for size in self.text_bytes], max_length)

    def least_tokens(self, max_length: int | None) -> int:
        """An estimate, from below, of the tokens this request will use: a token row's length; a text's
        words (a WordPiece, BPE or SentencePiece tokenizer gives each word at least one token; only a word
        of nothing but control characters gets none), split at whitespace other than the control
        characters a BERT tokenizer deletes (:data:`_JOINERS`), at most ``max_length``. The project's docs in
        400-character chunks: 1.25-2.0 MiniLM tokens a word, 3.1 bytes a token (docs/tenants.md)."""
        return self._tokens(self.text_words, max_length)

    def _tokens(self, per_text: Sequence[int], max_length: int | None) -> int:
        """The token rows' lengths; else each text's count, at most ``max_length`` (when known), summed."""
        if self.token_rows:
            return sum(len(r) for r in self.token_rows)
        return sum(min(max_length, n) if max_length else n for n in per_text)


def parse(body: Any) -> EmbeddingsRequest:
    """A request body as OpenAI's API takes it; :class:`ApiError` (400) naming the field otherwise."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object", param=None)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("'model' is required: the name of a served embedding model (GET /v1/models lists them)", "model")
    encoding = body.get("encoding_format", "float") or "float"
    if encoding not in ENCODINGS:
        raise invalid(f"'encoding_format' must be one of {list(ENCODINGS)}, not {encoding!r}", "encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and (not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions < 1):
        raise invalid(f"'dimensions' must be a positive integer, not {dimensions!r}", "dimensions")
    value = body.get("input")
    texts: tuple[str, ...] = ()
    rows: tuple[tuple[int, ...], ...] = ()
    if isinstance(value, str):
        texts = (value,)
    elif isinstance(value, list) and value and all(isinstance(x, str) for x in value):
        texts = tuple(value)
    elif isinstance(value, list) and value and all(_is_id(x) for x in value):
        rows = (tuple(value),)
    elif isinstance(value, list) and value and all(isinstance(r, list) and r and all(_is_id(x) for x in r) for r in value):
        rows = tuple(tuple(r) for r in value)
    else:
        raise invalid("'input' must be a non-empty string, a list of strings, a list of token ids or a list of "
                      "non-empty lists of token ids")
    count = len(texts) or len(rows)
    if count > MAX_INPUTS:
        raise invalid(f"'input' holds {count} items; at most {MAX_INPUTS} per request")
    sizes, words = [], []
    for i, text in enumerate(texts):  # the tokenizer's own rules, checked here to name the request's index
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError as e:
            raise invalid(f"'input' item {i} is not valid Unicode text ({e.reason} at character {e.start})") from None
        if not has_content(text):
            raise invalid(f"'input' item {i} is empty: every text needs at least one character that is not a "
                          "space or a control character")
        if size > MAX_TEXT_BYTES:
            raise invalid(f"'input' item {i} is {size} bytes; the limit is {MAX_TEXT_BYTES} bytes per text (it would be "
                          "cut to the model's maximum length in tokens anyway)")
        sizes.append(size)
        words.append(len(text.translate(_JOINERS).split()))
    return EmbeddingsRequest(model=model, texts=texts, token_rows=rows, encoding=encoding, dimensions=dimensions,
                             text_bytes=tuple(sizes), text_words=tuple(words))


#: Control characters Python splits words at but a BERT tokenizer deletes, joining the words beside them
#: ("x\x0cx" is one word to it): vertical tab, form feed (PDF text's page breaks), the separators, NEL.
_JOINERS = dict.fromkeys(map(ord, "\x0b\x0c\x1c\x1d\x1e\x1f\x85"))

#: Token ids travel as int64; the encoder refuses those outside its vocabulary.
MAX_ID = (1 << 63) - 1


def _is_id(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_ID


def embeddings_response(model: str, vectors: np.ndarray[Any, Any], tokens: int, encoding: str) -> dict[str, Any]:
    """The ``list`` of ``embedding`` objects, in input order, with the usage in tokens."""
    vectors = np.ascontiguousarray(vectors, dtype="<f4")
    data = []
    for index, row in enumerate(vectors):
        value: Any = base64.b64encode(row.tobytes()).decode("ascii") if encoding == "base64" else row.tolist()
        data.append({"object": "embedding", "index": index, "embedding": value})
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": int(tokens), "total_tokens": int(tokens)}}


def models_response(names: list[str], created: int) -> dict[str, Any]:
    return {"object": "list", "data": [model_object(name, created) for name in names]}


def model_object(name: str, created: int) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created, "owned_by": "tritonbundle"}
