"""End to end on the real CPU server: served embeddings equal ONNX Runtime's, semantics hold,
dynamic batching happens, and bad input gets a clear error while the server stays up."""

from __future__ import annotations

import concurrent.futures
import re
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import token_counts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SENTENCES = ["A man is playing a guitar.", "Someone strums an acoustic guitar.", "The stock market fell today."]


def _direct_onnxruntime(artifacts: Path, texts: list[str]) -> np.ndarray:
    import onnxruntime as ort
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(artifacts / "tokenizer.json"))
    tok.no_padding()  # tokenizer.json ships with fixed padding to 128
    tok.enable_truncation(max_length=512)
    session = ort.InferenceSession(str(artifacts / "model.onnx"), providers=["CPUExecutionProvider"])
    rows = []
    for text in texts:  # one at a time: no padding at all
        ids = np.array([tok.encode(text).ids], dtype=np.int64)
        rows.append(session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0][0])
    return np.stack(rows)


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_served_embeddings_equal_direct_onnxruntime(server: object, exported_minilm: Path, protocol: str) -> None:
    from tritonbundle.clients import connect

    url = server.http_url if protocol == "http" else server.grpc_url  # type: ignore[attr-defined]
    with connect(url, protocol=protocol, timeout_s=30) as client:
        served = client.embed(SENTENCES)
    expected = _direct_onnxruntime(exported_minilm, SENTENCES)
    assert served.shape == (3, 384)
    assert served.dtype == np.float32
    assert np.all(_cos(served, expected) >= 0.9999)
    np.testing.assert_allclose(np.linalg.norm(served, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_every_text_comes_back_with_its_token_count(server: object, exported_minilm: Path, protocol: str) -> None:
    """``tokens``: what the tokenizer that fed the encoder made of each text, truncation included (what
    usage is metered in)."""
    from tritonbundle.clients import connect

    texts = [*SENTENCES, "word " * 2000]
    url = server.http_url if protocol == "http" else server.grpc_url  # type: ignore[attr-defined]
    with connect(url, protocol=protocol, timeout_s=30) as client:
        out = client.infer({"TEXT": np.array([[t.encode()] for t in texts], dtype=object)}, model="minilm")
    assert out["tokens"].dtype == np.int32 and out["tokens"].shape == (len(texts), 1)
    assert out["tokens"][:, 0].tolist() == token_counts(exported_minilm, texts)
    assert out["tokens"][-1, 0] == 512 and out["embedding"].shape == (len(texts), 384)


def test_close_sentences_score_higher_than_unrelated(server: object) -> None:
    from tritonbundle.clients import HttpClient

    with HttpClient(server.http_url) as client:  # type: ignore[attr-defined]
        e = client.embed(SENTENCES)
    related = float(e[0] @ e[1])
    unrelated = max(float(e[0] @ e[2]), float(e[1] @ e[2]))
    assert related > unrelated + 0.2


def test_long_text_is_truncated_to_512_tokens_not_refused(server: object) -> None:
    from tritonbundle.clients import HttpClient

    long_text = "word " * 2000
    with HttpClient(server.http_url) as client:  # type: ignore[attr-defined]
        a, b = client.embed([long_text, "word " * 600])
    # Both are cut to the same first 512 tokens, so they embed identically.
    assert float(a @ b) > 0.9999


def _encoder_stats(server: object) -> tuple[int, int]:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.http_url)  # type: ignore[attr-defined]
    stats = client.get_inference_statistics("minilm_encoder")["model_stats"][0]
    client.close()
    return int(stats["inference_count"]), int(stats["execution_count"])


def test_dynamic_batching_forms_batches_larger_than_one(server: object) -> None:
    from tritonbundle.clients import GrpcClient

    before_inferences, before_executions = _encoder_stats(server)
    texts = [f"sentence number {i} about batching" for i in range(64)]
    with GrpcClient(server.grpc_url, pool_size=4, timeout_s=60) as client:  # type: ignore[attr-defined]
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda t: client.embed([t]), texts))
    # Triton counts a request when it releases it, which may come after its response reached the
    # client (a CI run read 61 of 64): read the statistics until they hold all 64, for at most 10 s.
    deadline = time.monotonic() + 10
    while True:
        inferences, executions = _encoder_stats(server)
        d_inf, d_exec = inferences - before_inferences, executions - before_executions
        if d_inf >= 64 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert d_inf == 64
    assert d_exec < d_inf, f"{d_inf} requests ran in {d_exec} executions: no batch was larger than 1"


BAD_TEXT = [
    ("empty string", [b""], "TEXT[0] is empty"),
    ("whitespace only", [b"   "], "TEXT[0] is empty"),
    ("non-UTF-8 bytes", [b"ok", b"\xff\xfeabc"], "TEXT[1] is not valid UTF-8"),
]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize(("case", "texts", "message"), BAD_TEXT, ids=[c[0] for c in BAD_TEXT])
def test_bad_text_gets_a_clear_invalid_argument_and_server_stays_ready(
    server: object, protocol: str, case: str, texts: list[bytes], message: str
) -> None:
    from tritonbundle.clients import InvalidInputError, connect

    url = server.http_url if protocol == "http" else server.grpc_url  # type: ignore[attr-defined]
    with connect(url, protocol=protocol) as client:
        with pytest.raises(InvalidInputError, match=re.escape(message)) as e:
            client.embed(texts)
        assert e.value.status in ("400", "INVALID_ARGUMENT")
        assert e.value.attempts == 1, "invalid input must not be retried"
        assert client.health() == {"live": True, "ready": True}
        assert client.embed(["the next good request"]).shape == (1, 384)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_unknown_model_and_wrong_dtype_are_refused_by_name(server: object, protocol: str) -> None:
    from tritonbundle.clients import InvalidInputError, ModelNotFoundError, connect

    url = server.http_url if protocol == "http" else server.grpc_url  # type: ignore[attr-defined]
    with connect(url, protocol=protocol, check_model=False) as client:
        with pytest.raises(ModelNotFoundError, match="unknown model: 'no_such_model'"):
            client.infer({"TEXT": np.array([[b"x"]], dtype=object)}, model="no_such_model", outputs=["embedding"])
        with pytest.raises(InvalidInputError, match="data-type is 'FP32', but model 'minilm' expects 'BYTES'"):
            client.infer({"TEXT": np.zeros((1, 1), np.float32)}, outputs=["embedding"])
        assert client.embed(["still serving"]).shape == (1, 384)
