"""What the clients send and how they read the answer, over every client, with tritonclient's own request
and result objects around an in-memory server (tests/clients/fake_triton.py): ``infer`` returns every
output when none are named; ``classify`` and ``rerank`` build one row per text (per pair), split at
``max_batch_size`` and parse each row; a method that does not fit the model fails before sending; every
request gets its own headers dict."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from tests.clients import fake_triton as fake
from tritonbundle import contract
from tritonbundle.clients import (
    AsyncGrpcClient,
    AsyncHttpClient,
    Classification,
    GrpcClient,
    HttpClient,
    InvalidInputError,
    MetadataMismatchError,
)

CLIENTS = {"http": (HttpClient, fake.FakeHttp), "grpc": (GrpcClient, fake.FakeGrpc),
           "aio-http": (AsyncHttpClient, fake.FakeAioHttp), "aio-grpc": (AsyncGrpcClient, fake.FakeAioGrpc)}
TOKENS = fake.info("tokens", {"input_ids": "INT64", "attention_mask": "INT64"},
                   {"logits": "FP32", "token_scores": "FP32"}, max_batch_size=8, task="tensor")
SENTIMENT = fake.info("sentiment", {"TEXT": "BYTES"}, {"logits": "FP32", "label": "BYTES", "score": "FP32"},
                      max_batch_size=2, task="text-classification")
RERANKER = fake.info("reranker", {"QUERY": "BYTES", "TEXT": "BYTES"}, {"logits": "FP32", "score": "FP32"},
                     max_batch_size=2, task="text-pair")
MINILM = fake.info("minilm", {"TEXT": "BYTES"}, {"embedding": "FP32"}, max_batch_size=32, task="text-embedding")
TEXTS = ["a", "bb", "ccc", "dddd", "eeeee"]


def respond(model: str, arrays: fake.Arrays) -> fake.Arrays:
    """An encoder (``*_encoder``): its ids as the embedding; token ids in: logits and token_scores; TEXT: a
    classifier's outputs; QUERY and TEXT: a cross-encoder's. Each row's answer depends on that row only, so
    order and splitting show."""
    if model.endswith("_encoder"):  # an embedding model's encoder: one vector per row
        return {"embedding": arrays["input_ids"].astype(np.float32)}
    if "TEXT" not in arrays:
        ids = arrays["input_ids"].astype(np.float32)
        return {"logits": np.stack([ids.sum(axis=1), arrays["attention_mask"].sum(axis=1)], axis=1).astype(np.float32),
                "token_scores": ids * 2}
    lengths = np.array([len(t) for t in arrays["TEXT"].reshape(-1)], dtype=np.float32)
    if "QUERY" not in arrays:
        logits = np.stack([lengths, -lengths, lengths / 2], axis=1).astype(np.float32)
        labels = np.array([[b"long" if n > 2 else b"court"] for n in lengths], dtype=object)
        return {"logits": logits, "label": labels, "score": (lengths / 10).reshape(-1, 1)}
    queries = {bytes(q) for q in arrays["QUERY"].reshape(-1)}
    assert len(queries) == 1, "one query per request, beside each passage"
    logits = (lengths * len(queries.pop())).reshape(-1, 1)
    return {"logits": logits, "score": (lengths / 100).reshape(-1, 1).astype(np.float32)}


def call(protocol: str, method: str, *args: Any, models: tuple[Any, ...] = (), model: str = "m",
         **options: Any) -> tuple[Any, fake.FakeTriton]:
    """client.<method>(*args) over ``protocol`` against a fake server; (the answer, the fake)."""
    cls, fake_cls = CLIENTS[protocol]
    server = fake_cls(respond)
    client = fake.attach(cls("127.0.0.1:1", model=model, **options), server, *models)
    if protocol.startswith("aio"):
        return asyncio.run(getattr(client, method)(*args)), server
    return getattr(client, method)(*args), server


@pytest.mark.parametrize("protocol", list(CLIENTS))
@pytest.mark.parametrize("check_model", [True, False], ids=["checked", "unchecked"])
def test_infer_names_no_output_and_returns_every_one(protocol: str, check_model: bool) -> None:
    ids = np.arange(6, dtype=np.int64).reshape(2, 3)
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    got, server = call(protocol, "infer", feed, models=(TOKENS,), model="tokens", check_model=check_model)
    assert [r.outputs for r in server.requests] == [None], "no output named: the server returns them all"
    assert sorted(got) == ["logits", "token_scores"]
    np.testing.assert_array_equal(got["logits"], [[3, 3], [12, 3]])
    np.testing.assert_array_equal(got["token_scores"], ids * 2)
    np.testing.assert_array_equal(server.requests[0].inputs["input_ids"], ids)


@pytest.mark.parametrize("protocol", list(CLIENTS))
def test_infer_returns_only_the_outputs_named(protocol: str) -> None:
    ids = np.ones((1, 4), dtype=np.int64)
    cls, fake_cls = CLIENTS[protocol]
    server = fake_cls(respond)
    client = fake.attach(cls("127.0.0.1:1", model="tokens"), server, TOKENS)
    result = client.infer({"input_ids": ids, "attention_mask": ids}, outputs=["token_scores"])
    got = asyncio.run(result) if protocol.startswith("aio") else result
    assert list(got) == ["token_scores"] and server.requests[0].outputs == ["token_scores"]


@pytest.mark.parametrize("protocol", list(CLIENTS))
def test_classify_sends_text_rows_in_max_batch_size_chunks_and_reads_each_row(protocol: str) -> None:
    results, server = call(protocol, "classify", TEXTS, models=(SENTIMENT,), model="sentiment")
    assert sorted(len(r.inputs["TEXT"]) for r in server.requests) == [1, 2, 2]  # max_batch_size 2
    assert all(list(r.inputs) == ["TEXT"] and r.inputs["TEXT"].shape[1] == 1 for r in server.requests)
    assert all(r.outputs == ["logits", "label", "score"] for r in server.requests)
    assert [r.label for r in results] == ["court", "court", "long", "long", "long"]
    assert [r.score for r in results] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])
    assert all(isinstance(r, Classification) and isinstance(r.score, float) for r in results)
    np.testing.assert_array_equal(np.stack([r.logits for r in results]),
                                  [[n, -n, n / 2] for n in range(1, 6)])
    assert results[2] == Classification("long", results[2].score, np.array([3, -3, 1.5], dtype=np.float32))


@pytest.mark.parametrize("protocol", list(CLIENTS))
def test_rerank_sends_one_pair_per_row_in_chunks_and_keeps_passage_order(protocol: str) -> None:
    scores, server = call(protocol, "rerank", "rain?", TEXTS, models=(RERANKER,), model="reranker")
    assert scores.dtype == np.float32 and scores.shape == (5,)
    np.testing.assert_allclose(scores, [0.01, 0.02, 0.03, 0.04, 0.05], rtol=1e-6)
    assert sorted(len(r.inputs["TEXT"]) for r in server.requests) == [1, 2, 2]
    for r in server.requests:
        assert sorted(r.inputs) == ["QUERY", "TEXT"] and r.inputs["QUERY"].shape == r.inputs["TEXT"].shape
        assert {bytes(q) for q in r.inputs["QUERY"].reshape(-1)} == {b"rain?"}
        assert r.outputs == ["logits", "score"], "Triton 2.51 ensembles fail a request naming score alone"
    sent = [bytes(t).decode() for r in sorted(server.requests, key=lambda r: bytes(r.inputs["TEXT"][0, 0]))
            for t in r.inputs["TEXT"].reshape(-1)]
    assert sent == TEXTS


@pytest.mark.parametrize("protocol", list(CLIENTS))
@pytest.mark.parametrize(("model", "method", "args", "message"), [
    (TOKENS, "embed", (["x"],), r"model 'tokens' .* is a tensor model with inputs \[input_ids \(INT64\), "
                                r"attention_mask \(INT64\)\]; embed\(\) sends \[TEXT \(BYTES\)\] .*call infer\("),
    (MINILM, "classify", (["x"],), r"model 'minilm' .* is a text-embedding model .*call embed\(\) instead"),
    (SENTIMENT, "rerank", ("q", ["x"]), r"sends \[QUERY \(BYTES\), TEXT \(BYTES\)\] to text-pair models: "
                                        r"call classify\(\) instead"),
    (RERANKER, "embed", (["x"],), r"is a text-pair model .*call rerank\(\) instead"),
])
def test_a_method_that_does_not_fit_the_models_task_fails_before_sending(
    protocol: str, model: Any, method: str, args: tuple[Any, ...], message: str
) -> None:
    cls, fake_cls = CLIENTS[protocol]
    server = fake_cls(respond)
    client = fake.attach(cls("127.0.0.1:1", model=model.name), server, model)
    with pytest.raises(MetadataMismatchError, match=message):
        result = getattr(client, method)(*args)
        if protocol.startswith("aio"):
            asyncio.run(result)
    assert server.requests == []


def test_a_model_without_a_task_parameter_is_read_from_its_tensors() -> None:
    text_model = fake.info("other", {"TEXT": "BYTES"}, {"label": "BYTES", "score": "FP32"})
    assert text_model.task is None and text_model.kind() == "text-embedding"
    results, server = call("http", "classify", ["ab"], models=(fake.info(
        "sentiment", {"TEXT": "BYTES"}, {"logits": "FP32", "label": "BYTES", "score": "FP32"}),), model="sentiment")
    assert results[0].label == "court" and server.requests[0].outputs == ["logits", "label", "score"]
    with pytest.raises(MetadataMismatchError, match=r"has outputs \['embedding'\], but classify\(\) reads "
                                                    r"\['label', 'score'\]: call embed\(\) instead"):
        call("grpc", "classify", ["x"], models=(fake.info("minilm", {"TEXT": "BYTES"}, {"embedding": "FP32"}),),
             model="minilm")
    pixels = fake.info("image", {"pixels": "FP32"}, {"logits": "FP32"})
    assert pixels.kind() == "tensor"
    with pytest.raises(MetadataMismatchError, match=r"model 'image' .* has inputs \[pixels \(FP32\)\], but embed\(\) "
                                                    r"sends \[TEXT \(BYTES\)\]: call infer\("):
        call("http", "embed", ["x"], models=(pixels,), model="image")
    pair = fake.info("pairs", {"QUERY": "BYTES", "TEXT": "BYTES"}, {"score": "FP32"})
    assert pair.kind() == "text-pair"
    scores, _ = call("grpc", "rerank", "q", ["abc"], models=(pair,), model="pairs")
    assert scores.tolist() == pytest.approx([0.03])


def test_no_rows_and_a_list_for_the_query_are_refused_before_sending() -> None:
    with pytest.raises(InvalidInputError, match="no texts"):
        call("http", "classify", [], models=(SENTIMENT,), model="sentiment")
    with pytest.raises(InvalidInputError, match="no passages"):
        call("grpc", "rerank", "q", [], models=(RERANKER,), model="reranker")
    with pytest.raises(TypeError, match="query must be one string, not list"):
        call("http", "rerank", ["q"], ["x"], models=(RERANKER,), model="reranker")
    with pytest.raises(TypeError, match="not a single string"):
        call("http", "rerank", "q", "passage", models=(RERANKER,), model="reranker")


@pytest.mark.parametrize("protocol", list(CLIENTS))
def test_token_ids_outside_the_encoders_vocabulary_are_refused_before_sending(protocol: str) -> None:
    """A TensorRT plan gathers with whatever ids it is sent; the encoder's config says its vocabulary."""
    encoder = fake.info("minilm_encoder", {"input_ids": "INT64", "attention_mask": "INT64"}, {"embedding": "FP32"},
                        max_batch_size=8, parameters=contract.EncoderParameters(
                            padding_policy="ragged", padding_targets=(), max_sequence_length=16,
                            vocab_sizes={"input_ids": 30522}).to_parameters())
    with pytest.raises(InvalidInputError, match=r"input_ids holds 30522 at \[1, 2\]: token ids must lie in \[0, 30522\)"):
        call(protocol, "embed_tokens", [[101, 7592, 102], [101, 7, 30522, 102]], models=(MINILM, encoder), model="minilm")
    (_, server) = call(protocol, "embed_tokens", [[101, 30521, 102]], models=(MINILM, encoder), model="minilm")
    assert [r.model for r in server.requests] == ["minilm_encoder"]


@pytest.mark.parametrize("protocol", list(CLIENTS))
def test_every_request_gets_its_own_headers_dict(protocol: str) -> None:
    """tritonclient writes each request's header length into the dict it is given: a shared dict let
    threads send each other's lengths."""
    cls, fake_cls = CLIENTS[protocol]
    server = fake_cls(respond)
    client = fake.attach(cls("127.0.0.1:1", model="sentiment", headers={"x-tenant": "a"}), server, SENTIMENT)
    for _ in range(2):
        result = client.classify(TEXTS[:1])
        if protocol.startswith("aio"):
            asyncio.run(result)
    sent = [r.headers for r in server.requests]
    assert client.headers == {"x-tenant": "a"}, "the client's own dict is never written to"
    assert len(sent) == 2 and sent[0] is not sent[1] and all(h is not None and h["x-tenant"] == "a" for h in sent)
