"""The clients against the real CPU server: same answers over every protocol, splitting, retries,
deadlines, metadata checks at connect, shared memory cleanup, and the CLI."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.clients.examples import readme_snippets, run_example, run_snippet
from tests.conftest import API_KEY
from tritonbundle.clients import (
    AsyncGrpcClient,
    AsyncHttpClient,
    DeadlineExceededError,
    GrpcClient,
    HttpClient,
    InvalidInputError,
    MetadataMismatchError,
    RetryPolicy,
    ServerUnavailableError,
)
from tritonbundle.clients.shm import leftover_regions

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TEXTS = ["The quick brown fox.", "A slow green turtle.", "Triton serves models.", "é à ü: unicode is fine"]


async def _async_embed(cls: type, url: str, texts: list[str]) -> np.ndarray:
    async with cls(url) as client:
        return await client.embed(texts)  # type: ignore[no-any-return]


def test_every_client_returns_the_same_embeddings(server: Any) -> None:
    with HttpClient(server.http_url) as c:
        http = c.embed(TEXTS)
    with GrpcClient(server.grpc_url) as c:
        grpc = c.embed(TEXTS)
    aio_http = asyncio.run(_async_embed(AsyncHttpClient, server.http_url, TEXTS))
    aio_grpc = asyncio.run(_async_embed(AsyncGrpcClient, server.grpc_url, TEXTS))
    for other in (grpc, aio_http, aio_grpc):
        np.testing.assert_allclose(other, http, atol=1e-6)
    assert http.shape == (4, 384)


def test_three_times_max_batch_size_comes_back_complete_and_in_order(server: Any) -> None:
    texts = [f"sentence {i}: {'alpha beta gamma delta'.split()[i % 4]} number {i * 7}" for i in range(96)]
    with GrpcClient(server.grpc_url) as c:
        assert c.model_info("minilm").max_batch_size == 32
        batch = c.embed(texts)
        singles = np.concatenate([c.embed([texts[i]]) for i in (0, 31, 32, 63, 64, 95)])
    assert batch.shape == (96, 384)
    np.testing.assert_allclose(batch[[0, 31, 32, 63, 64, 95]], singles, atol=1e-5)
    aio = asyncio.run(_async_embed(AsyncHttpClient, server.http_url, texts))
    np.testing.assert_allclose(aio, batch, atol=1e-5)


def test_embed_tokens_pads_to_the_plan_and_matches_text_in(server: Any, exported_minilm: Path) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(exported_minilm / "tokenizer.json"))
    tok.no_padding()
    rows = [tok.encode(t).ids for t in TEXTS]
    with HttpClient(server.http_url) as c:
        via_tokens = c.embed_tokens(rows)
        via_text = c.embed(TEXTS)
    np.testing.assert_allclose(via_tokens, via_text, atol=1e-5)


def test_a_server_started_after_the_client_begins_retrying_is_reached(repository: Path, tmp_path: Path) -> None:
    from tritonbundle.server import ServerOptions, TritonServer

    server = TritonServer(ServerOptions(repository, http_port=0, grpc_port=0, metrics_port=0, log_path=tmp_path / "late.log"))
    starter = threading.Timer(2.0, lambda: server.start(wait=False))
    starter.start()
    try:
        begun = time.monotonic()
        with GrpcClient(server.grpc_url, connect_timeout_s=120) as client:
            assert time.monotonic() - begun >= 2.0
            assert client.embed(["reached"]).shape == (1, 384)
    finally:
        starter.cancel()
        server.stop()


def test_refused_connection_is_retried_with_bounded_attempts() -> None:
    from tritonbundle.proc import free_port

    client = HttpClient(f"127.0.0.1:{free_port()}", check_model=False, timeout_s=30,
                        retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.02))
    client._open()
    started = time.monotonic()
    with pytest.raises(ServerUnavailableError, match=r"after 3 attempts") as e:
        client.infer({"TEXT": np.array([[b"x"]], dtype=object)}, outputs=["embedding"])
    client.close()
    assert e.value.attempts == 3
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_invalid_argument_is_not_retried(server: Any, protocol: str) -> None:
    from tritonbundle.clients import connect

    url = server.http_url if protocol == "http" else server.grpc_url
    policy = RetryPolicy(max_attempts=5, initial_backoff_s=0.2)
    with connect(url, protocol=protocol, retry=policy) as client:
        started = time.monotonic()
        with pytest.raises(InvalidInputError) as e:
            client.embed([""])
        assert e.value.attempts == 1
        assert time.monotonic() - started < 0.2, "no backoff sleep happened"


SLOW_TEXTS = ["lorem ipsum dolor sit amet " * 120] * 32  # 32 rows of 512 tokens: about a second on CPU


def wait_until_idle(server: Any, timeout_s: float = 120) -> None:
    """Abandoned slow requests keep the CPU server busy for a while: wait until a small request is
    served promptly again, so the next test does not meet a full queue."""
    deadline = time.monotonic() + timeout_s
    with HttpClient(server.http_url, retry=RetryPolicy(max_attempts=1)) as client:
        while time.monotonic() < deadline:
            try:
                started = time.monotonic()
                client.embed(["ping"], timeout_s=5)
                if time.monotonic() - started < 0.5:
                    return
            except Exception:  # noqa: BLE001 - still draining
                time.sleep(0.5)
    raise AssertionError(f"the server did not become idle within {timeout_s} s")


@pytest.mark.parametrize("cls", [HttpClient, GrpcClient], ids=["http", "grpc"])
def test_deadline_fails_with_the_project_timeout_error_within_the_deadline(server: Any, cls: type) -> None:
    url = server.http_url if cls is HttpClient else server.grpc_url
    with cls(url) as client:
        started = time.monotonic()
        with pytest.raises(DeadlineExceededError) as e:
            client.embed(SLOW_TEXTS, timeout_s=0.15)
        elapsed = time.monotonic() - started
    assert elapsed < 0.15 + 0.35, f"took {elapsed:.2f} s for a 0.15 s deadline"
    assert "minilm" in str(e.value) and cls.protocol in str(e.value)
    wait_until_idle(server)


@pytest.mark.parametrize("cls", [AsyncHttpClient, AsyncGrpcClient], ids=["aio-http", "aio-grpc"])
def test_async_deadline_fails_within_the_deadline(server: Any, cls: type) -> None:
    url = server.http_url if cls is AsyncHttpClient else server.grpc_url

    async def run() -> float:
        async with cls(url) as client:
            started = time.monotonic()
            with pytest.raises(DeadlineExceededError):
                await client.embed(SLOW_TEXTS, timeout_s=0.15)
            return time.monotonic() - started

    assert asyncio.run(run()) < 0.5
    wait_until_idle(server)


def test_wrong_model_name_fails_at_connect_naming_both_sides(server: Any) -> None:
    with pytest.raises(MetadataMismatchError) as e:
        HttpClient(server.http_url, model="minilm_v2", api_key=API_KEY).connect()
    message = str(e.value)
    assert "expects model 'minilm_v2'" in message and "models there: minilm, minilm_encoder, minilm_tokenizer" in message


@pytest.mark.parametrize("cls", [HttpClient, GrpcClient], ids=["http", "grpc"])
def test_wrong_input_name_fails_at_connect_naming_both_sides(server: Any, cls: type) -> None:
    url = server.http_url if cls is HttpClient else server.grpc_url
    with pytest.raises(MetadataMismatchError, match=r"has inputs \[TEXT \(BYTES\)\], but the client expects \[SENTENCE \(BYTES\)\]"):
        cls(url, text_input="SENTENCE").connect()


def test_wrong_output_name_fails_at_connect(server: Any) -> None:
    with pytest.raises(MetadataMismatchError, match=r"has outputs \['embedding', 'tokens'\], but the client expects 'vector'"):
        GrpcClient(server.grpc_url, output="vector").connect()


@pytest.mark.parametrize("cls", [HttpClient, GrpcClient], ids=["http", "grpc"])
def test_shared_memory_regions_are_gone_after_success_and_after_failure(server: Any, cls: type) -> None:
    import tritonclient.http as httpclient

    url = server.http_url if cls is HttpClient else server.grpc_url
    status = httpclient.InferenceServerClient(server.http_url)
    status_headers = {"tritonbundle-key": API_KEY}
    with cls(url, shared_memory=True, shared_memory_min_bytes=0, api_key=API_KEY) as client:
        via_shm = client.embed(TEXTS)
        assert leftover_regions() == []
        assert status.get_system_shared_memory_status(headers=status_headers) == []
        with pytest.raises(InvalidInputError, match="is empty"):
            client.embed(["fine", ""])
        assert leftover_regions() == []
        assert status.get_system_shared_memory_status(headers=status_headers) == []
    with cls(url) as plain:
        np.testing.assert_allclose(via_shm, plain.embed(TEXTS), atol=1e-6)
    status.close()


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    import os

    env = {**os.environ, "TRITONBUNDLE_API_KEY": API_KEY}
    return subprocess.run([sys.executable, "-m", "tritonbundle", *args], input=stdin, capture_output=True, text=True,
                          timeout=120, env=env)


def test_cli_infer_reads_arguments_or_stdin_and_prints_json(server: Any) -> None:
    out = _cli("infer", "--url", server.http_url, "hello world", "second text")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [r["text"] for r in rows] == ["hello world", "second text"]
    assert len(rows[0]["embedding"]) == 384
    out = _cli("infer", "--protocol", "grpc", "--url", server.grpc_url, "--compact", stdin="from stdin\n\nanother\n")
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)) == 2


def test_cli_health_and_models(server: Any) -> None:
    out = _cli("health", "--url", server.grpc_url, "--protocol", "grpc")
    assert out.returncode == 0 and json.loads(out.stdout) == {"live": True, "ready": True, "url": server.grpc_url}
    out = _cli("models", "--url", server.http_url)
    assert out.returncode == 0, out.stderr
    assert "minilm_encoder" in out.stdout and "READY" in out.stdout and "dynamic (preferred [8, 32]" in out.stdout
    rows = json.loads(_cli("models", "--url", server.grpc_url, "--protocol", "grpc", "--json").stdout)
    assert {r["name"]: r["max_batch_size"] for r in rows} == {"minilm": 32, "minilm_encoder": 32, "minilm_tokenizer": 32}


def test_cli_bad_input_is_a_one_line_error_with_nonzero_exit(server: Any) -> None:
    out = _cli("infer", "--url", server.http_url, "")
    assert out.returncode == 1
    assert out.stderr.strip().count("\n") == 0 and "TEXT[0] is empty" in out.stderr


@pytest.mark.parametrize("example", ["embed_http.py", "embed_async.py"])
def test_the_embedding_examples_run(server: Any, example: str) -> None:
    out = run_example(example, server.http_url if example == "embed_http.py" else server.grpc_url)
    if example == "embed_http.py":
        assert out.splitlines()[0].endswith("The dynamic batcher groups requests into batches."), out
    else:
        assert "200 requests in" in out


def test_the_readme_embedding_snippet_runs_as_written(server: Any) -> None:
    (code,) = [code for code in readme_snippets() if 'model="minilm"' in code]
    vectors = run_snippet(code, server)["vectors"]  # the last call's: one token row, as its comments say
    assert vectors.dtype == np.float32 and vectors.shape == (1, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3)
