"""``tritonbundle gateway`` on the real tritonserver, called with OpenAI's own Python client: the answers
equal the project's client's, usage equals the tokenizer's counts, and errors keep OpenAI's shape while
the gateway and the server stay up."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import token_counts
from tests.gateway.conftest import running_gateway
from tritonbundle.proc import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["A man is playing a guitar.", "The stock market fell today.", "word " * 2000]


@pytest.fixture(scope="module")
def gateway(server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_gateway(server, tmp_path_factory.mktemp("gateway")) as url:
        yield f"{url}/v1"


@pytest.fixture(scope="module")
def openai_client(gateway: str) -> Any:
    import openai

    return openai.OpenAI(base_url=gateway, api_key="not-checked-without-tenants", max_retries=0, timeout=60)


@pytest.mark.parametrize("encoding", ["float", "base64"])
def test_openai_client_embeddings_equal_the_project_client_and_usage_the_tokenizer(
    server: Any, openai_client: Any, exported_minilm: Path, encoding: str
) -> None:
    from tritonbundle.clients import GrpcClient

    result = openai_client.embeddings.create(model="minilm", input=TEXTS, encoding_format=encoding)
    got = np.array([d.embedding for d in sorted(result.data, key=lambda d: d.index)], dtype=np.float32) \
        if encoding == "float" else None
    if got is None:  # this client leaves base64 as the string it received
        import base64

        got = np.stack([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in result.data])
    with GrpcClient(server.grpc_url) as client:
        expected = client.embed(TEXTS)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert result.model == "minilm" and len(result.data) == 3
    assert result.usage.prompt_tokens == result.usage.total_tokens == sum(token_counts(exported_minilm, TEXTS))


def test_one_string_and_token_arrays_are_embedded_too(server: Any, openai_client: Any, exported_minilm: Path) -> None:
    one = openai_client.embeddings.create(model="minilm", input=TEXTS[0])
    assert len(one.data) == 1 and len(one.data[0].embedding) == 384 and one.usage.prompt_tokens == token_counts(exported_minilm, TEXTS[:1])[0]
    rows = [[101, 1037, 2158, 2003, 2652, 1037, 2858, 1012, 102], [101, 7592, 102]]
    tokens = openai_client.embeddings.create(model="minilm", input=rows)
    assert tokens.usage.prompt_tokens == 12
    from tritonbundle.clients import GrpcClient

    with GrpcClient(server.grpc_url) as client:
        expected = client.embed_tokens(rows)
    np.testing.assert_allclose(np.array([d.embedding for d in tokens.data]), expected, rtol=1e-5, atol=1e-6)


def test_the_models_are_listed(openai_client: Any) -> None:
    assert [m.id for m in openai_client.models.list()] == ["minilm"]
    assert openai_client.models.retrieve("minilm").owned_by == "tritonbundle"


def test_bad_requests_get_openai_errors_and_the_gateway_keeps_serving(openai_client: Any) -> None:
    import openai

    with pytest.raises(openai.NotFoundError, match="does not exist here"):
        openai_client.embeddings.create(model="text-embedding-3-small", input="hi")
    with pytest.raises(openai.BadRequestError, match="item 1 is empty"):
        openai_client.embeddings.create(model="minilm", input=["fine", " "])
    with pytest.raises(openai.BadRequestError, match="384 dimensions"):
        openai_client.embeddings.create(model="minilm", input="hi", dimensions=256)
    # The encoder's vocabulary, from its config: refused by the gateway before Triton sees it.
    with pytest.raises(openai.BadRequestError, match=r"item 0 holds the token id 99999999: .* \[0, 30522\)"):
        openai_client.embeddings.create(model="minilm", input=[[101, 99999999, 102]])
    assert len(openai_client.embeddings.create(model="minilm", input="still here").data) == 1


def test_every_other_error_keeps_openais_shape(gateway: str) -> None:
    import json
    import urllib.error

    def call(path: str, data: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
        request = urllib.request.Request(gateway.removesuffix("/v1") + path, data=data, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    status, body = call("/v2/models/minilm/infer")
    assert status == 404 and "serves /v1/embeddings" in body["error"]["message"]
    status, body = call("/v1/models", data=b"{}")
    assert status == 405 and body["error"]["message"]
    status, body = call("/v1/embeddings", data=b"{not json", headers={"Content-Type": "application/json"})
    assert status == 400 and "not JSON" in body["error"]["message"]
    # Refused from the header, before the body is read (sending 16 MB first would meet a closed connection).
    status, body = call("/v1/embeddings", data=b"{}", headers={"Content-Type": "application/json",
                                                                "Content-Length": str(16 << 20 | 1)})
    assert status == 413 and body["error"]["param"] == "input"


def test_a_model_that_is_not_a_text_embedding_model_stops_the_start_in_one_line(server: Any) -> None:
    done = subprocess.run([sys.executable, "-m", "tritonbundle", "gateway", "--url", server.grpc_url, "--port",
                           str(free_port()), "--model", "minilm_encoder", "--timeout-s", "10"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode != 0
    assert "tritonbundle gateway: error: model 'minilm_encoder'" in done.stderr and "not a text-embedding model" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr
