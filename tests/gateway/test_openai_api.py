"""The OpenAI embeddings API's request and response shapes (no server)."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from tritonbundle.errors import (
    ClientBusyError,
    DeadlineExceededError,
    InvalidInputError,
    MetadataMismatchError,
    ModelNotFoundError,
    ServerUnavailableError,
)
from tritonbundle.gateway.openai_api import MAX_INPUTS, ApiError, embeddings_response, parse


def test_every_input_form_of_the_api_parses() -> None:
    assert parse({"model": "m", "input": "hi"}).texts == ("hi",)
    assert parse({"model": "m", "input": ["a", "b"]}).texts == ("a", "b")
    assert parse({"model": "m", "input": [101, 7592, 102]}).token_rows == ((101, 7592, 102),)
    many = parse({"model": "m", "input": [[101, 102], [101, 7592, 102]], "encoding_format": "base64", "dimensions": 384})
    assert many.token_rows == ((101, 102), (101, 7592, 102)) and many.encoding == "base64" and many.dimensions == 384
    assert many.count == 2


def test_the_token_estimates_bound_minilms_real_counts_from_both_sides() -> None:
    """most_tokens (bytes + 2) and least_tokens (words) on texts of every kind against MiniLM's own
    tokenizer, with its special tokens, at its 512-token cap and without one."""
    from tokenizers import Tokenizer

    from tritonbundle.recipes import tokenizer_file

    tok = Tokenizer.from_file(str(tokenizer_file("minilm")))
    tok.no_padding()
    tok.no_truncation()
    texts = ["hello world", "Tokenizers split un-hyphenated, punctuated words!", "naïve café 東京 🙂 x", "a " * 600,
             "pneumonoultramicroscopicsilicovolcanoconiosis " * 3, "  spaced\tout\nlines  ", "x",
             "x\x0c" * 200, "\x1f".join(["word"] * 100), "a\x0bb\x85c\x1cd\u2028e"]
    for cap in (None, 512):
        if cap:
            tok.enable_truncation(cap)
        for text in texts:
            real, request = len(tok.encode(text).ids), parse({"model": "m", "input": [text]})
            assert request.least_tokens(cap) <= real <= request.most_tokens(cap), (text, cap)
    rows = parse({"model": "m", "input": [[101, 7592, 102], [101, 102]]})
    assert rows.least_tokens(512) == rows.most_tokens(512) == 5


@pytest.mark.parametrize("body, param, words", [
    ({"input": "hi"}, "model", "'model' is required"),
    ({"model": "m"}, "input", "'input' must be"),
    ({"model": "m", "input": []}, "input", "'input' must be"),
    ({"model": "m", "input": ["a", 1]}, "input", "'input' must be"),
    ({"model": "m", "input": [[101], []]}, "input", "'input' must be"),
    ({"model": "m", "input": [True, 1]}, "input", "'input' must be"),
    ({"model": "m", "input": ["fine", "  "]}, "input", "item 1 is empty"),
    ({"model": "m", "input": ["x"] * (MAX_INPUTS + 1)}, "input", f"at most {MAX_INPUTS}"),
    ({"model": "m", "input": "x", "encoding_format": "hex"}, "encoding_format", "'float', 'base64'"),
    ({"model": "m", "input": "x", "dimensions": 0}, "dimensions", "positive integer"),
])
def test_a_bad_request_is_a_400_naming_the_field(body: dict[str, object], param: str, words: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse(body)
    e = caught.value
    assert e.status == 400 and e.param == param and words in e.message, e.message
    assert e.body()["error"]["type"] == "invalid_request_error"


def test_the_response_keeps_the_input_order_and_decodes_as_openai_clients_do() -> None:
    vectors = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
    floats = embeddings_response("m", vectors, 11, "float")
    assert [d["index"] for d in floats["data"]] == [0, 1] and floats["usage"] == {"prompt_tokens": 11, "total_tokens": 11}
    assert floats["data"][1]["embedding"] == pytest.approx(vectors[1].tolist())
    encoded = embeddings_response("m", vectors, 11, "base64")
    # openai-python: np.frombuffer(base64.b64decode(data), dtype="float32")
    decoded = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="float32") for d in encoded["data"]])
    np.testing.assert_array_equal(decoded, vectors)


def test_texts_that_are_not_unicode_and_ids_past_int64_are_400s() -> None:
    with pytest.raises(ApiError, match="item 1 is not valid Unicode text"):
        parse({"model": "m", "input": ["fine", "\ud800"]})
    with pytest.raises(ApiError, match="'input' must be"):
        parse({"model": "m", "input": [101, 1 << 63]})


@pytest.mark.parametrize("error, status, code", [
    (InvalidInputError("input_ids[0, 1] = 99999999 is outside the vocabulary"), 400, "invalid_value"),
    (MetadataMismatchError("model 'x' has inputs [a, b, c], but the client expects [a, b]"), 400, "invalid_value"),
    (ServerUnavailableError("in ensemble 'minilm', Exceeds maximum queue size"), 429, "server_at_capacity"),
    (ClientBusyError("64 calls already in flight"), 429, "server_at_capacity"),
    (ServerUnavailableError("in ensemble 'minilm', Request timeout expired"), 504, "timeout"),
    (DeadlineExceededError("deadline exceeded"), 504, "timeout"),
    (ServerUnavailableError("failed to connect to all addresses"), 503, "unavailable"),
    (ServerUnavailableError("model 'queue-embedder': failed to connect"), 503, "unavailable"),
    (ModelNotFoundError("Request for unknown model: 'minilm' is not found"), 503, "unavailable"),
])
def test_tritons_answers_map_to_openais_status_codes(error: Exception, status: int, code: str) -> None:
    from tritonbundle.gateway.app import api_error

    mapped = api_error(error)  # type: ignore[arg-type]
    assert (mapped.status, mapped.code) == (status, code), mapped.message
    assert (mapped.retry_after_s is not None) == (status in (429, 503))
