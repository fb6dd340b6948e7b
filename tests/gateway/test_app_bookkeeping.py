"""The gateway application's own bookkeeping, in-process (the ASGI app called directly, a double standing
in for the gRPC client to Triton): a tenant's place in flight is given back and the request metered
whatever ends it, and a 404 names only the models the caller's key may use. The gateway in front of the
real tritonserver is test_gateway.py and test_tenants_served.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np

from tritonbundle.gateway.app import Backend, create_app
from tritonbundle.gateway.metering import Meter
from tritonbundle.gateway.tenants import parse

KEY_A, KEY_B = "a-key-of-tenant-a-0001", "b-key-of-tenant-b-0002"


class _Client:
    """Embeds every text as ones (3 tokens each); raises ``fail`` once when it is set."""

    def __init__(self) -> None:
        self.fail: BaseException | None = None
        self.texts = 0

    async def embed_counted(self, texts: list[str], headers: Any = None) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        self.texts += len(texts)
        if self.fail is not None:
            fail, self.fail = self.fail, None
            raise fail
        return np.ones((len(texts), 4), np.float32), np.full(len(texts), 3)


def _app(client: _Client, tenants: object, dims: int | None = 4) -> tuple[Any, Meter]:
    """The gateway over ``client`` for two models of ``dims`` dimensions (None: left dynamic)."""
    backend = Backend("127.0.0.1:1", ["public", "secret"])
    backend.clients = {"public": client, "secret": client}  # type: ignore[dict-item]
    backend.dims = {"public": dims, "secret": dims}
    backend.max_lengths = {"public": 16, "secret": None}
    backend.vocab = {"public": 200, "secret": None}
    backend.token_refusal = {"public": None, "secret": "its encoder 'secret_encoder' also takes ['token_type_ids']"}
    meter = Meter()
    return create_app(backend, parse(tenants, where="tenants.yaml"), meter), meter


def _post(app: Any, body: dict[str, Any] | bytes, key: str) -> tuple[int, dict[str, Any]]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    scope = {"type": "http", "method": "POST", "path": "/v1/embeddings", "raw_path": b"/v1/embeddings",
             "query_string": b"", "http_version": "1.1", "scheme": "http", "server": ("127.0.0.1", 80),
             "client": ("127.0.0.1", 1), "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()),
                         (b"authorization", f"Bearer {key}".encode())]}
    answer: dict[str, Any] = {"body": b""}
    received = [False]

    async def receive() -> dict[str, Any]:
        if not received[0]:
            received[0] = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await asyncio.sleep(60)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
        elif message["type"] == "http.response.body":
            answer["body"] += message.get("body", b"")

    try:
        asyncio.run(asyncio.wait_for(app(scope, receive, send), 10))
    except Exception:  # noqa: BLE001 - Starlette raises an unexpected error again once its handler answered
        assert "status" in answer, "no answer was sent"
    return answer["status"], json.loads(answer["body"])


def _requests(meter: Meter, tenant: str, outcome: str) -> float:
    return sum(s.value for m in meter.requests.collect() for s in m.samples
               if s.name.endswith("_total") and s.labels["tenant"] == tenant and s.labels["outcome"] == outcome)


def test_an_unexpected_failure_gives_back_the_tenants_place_in_flight_and_is_metered() -> None:
    client = _Client()
    app, meter = _app(client, {"tenants": [{"name": "alpha", "keys": [KEY_A], "limits": {"concurrent_requests": 1}}]})
    client.fail = RuntimeError("boom")
    status, body = _post(app, {"model": "public", "input": ["hi"]}, KEY_A)
    assert status == 500 and body["error"]["type"] == "server_error" and "RuntimeError: boom" in body["error"]["message"]
    for _ in range(3):  # the one place in flight is free again
        status, body = _post(app, {"model": "public", "input": ["hi"]}, KEY_A)
        assert status == 200, body
    assert _requests(meter, "alpha", "error") == 1 and _requests(meter, "alpha", "ok") == 3


def test_a_model_the_gateway_does_not_serve_is_a_404_naming_only_the_callers_models() -> None:
    app, _ = _app(_Client(), {"tenants": [{"name": "alpha", "keys": [KEY_A], "models": ["public", "kserve-only"]},
                                          {"name": "beta", "keys": [KEY_B]}]})
    status, body = _post(app, {"model": "kserve-only", "input": ["hi"]}, KEY_A)
    assert status == 404 and "'kserve-only'" in body["error"]["message"]
    assert "['public']" in body["error"]["message"] and "secret" not in body["error"]["message"], body
    status, body = _post(app, {"model": "nothing", "input": ["hi"]}, KEY_B)  # a key that may use every model
    assert status == 404 and "['public', 'secret']" in body["error"]["message"], body


def test_a_request_reserves_the_tokens_it_may_use_and_one_larger_than_the_quota_is_refused() -> None:
    """One request of many texts was admitted while the bucket held anything: 33 minutes of a tenant's
    tokens in one call. Texts are reserved by an estimate from above (bytes + 2, at most the model's 16
    tokens here, at most the whole bucket) and refused as too large by one from below (their words)."""
    client = _Client()
    app, meter = _app(client, {"tenants": [{"name": "alpha", "keys": [KEY_A], "limits": {"tokens_per_min": 1000}}]})
    status, body = _post(app, {"model": "public", "input": ["hello world"] * 501}, KEY_A)  # 501 x 2 words
    assert status == 400 and body["error"]["code"] == "request_too_large", body
    assert "at least 1002 tokens" in body["error"]["message"] and client.texts == 0
    # 80 x 13 = 1,040 by bytes, over the minute's 1,000, but 160 by words: the whole bucket is reserved,
    # 240 are used, 760 are left.
    status, body = _post(app, {"model": "public", "input": ["hello world"] * 80}, KEY_A)
    assert status == 200 and body["usage"]["prompt_tokens"] == 240
    status, body = _post(app, {"model": "public", "input": ["x" * 100] * 50}, KEY_A)  # 50 x 16 = 800 > 760 left
    assert status == 429 and "760 left, this request may use up to 800" in body["error"]["message"], body
    assert _requests(meter, "alpha", "refused") == 2 and client.texts == 80
    # the 400 (split it) and the 429 (wait) are told apart in the refusals' reasons
    reasons = {s.labels["reason"]: s.value for m in meter.refusals.collect() for s in m.samples if s.name.endswith("_total")}
    assert reasons == {"too_large": 1, "tokens": 1}


def test_text_the_tokenizer_would_refuse_is_a_400_naming_its_index_in_the_request() -> None:
    """A text of control characters passed the gateway, failed in Triton's tokenizer after the other
    chunks ran (billed nothing), and the error named its index within its chunk of 32 (TEXT[7] for 39)."""
    client = _Client()
    app, _ = _app(client, {"tenants": [{"name": "alpha", "keys": [KEY_A]}]})
    status, body = _post(app, {"model": "public", "input": ["fine"] * 39 + ["\x00\x01"]}, KEY_A)
    assert status == 400 and "'input' item 39 is empty" in body["error"]["message"] and client.texts == 0, body
    status, body = _post(app, {"model": "public", "input": ["fine"] * 39 + ["x" * (1 << 20) + "y"]}, KEY_A)
    assert status == 400 and "'input' item 39 is 1048577 bytes" in body["error"]["message"], body


def test_a_body_nested_past_what_json_reads_is_a_400_not_a_server_error() -> None:
    app, meter = _app(_Client(), {"tenants": [{"name": "alpha", "keys": [KEY_A]}]})
    status, body = _post(app, b"[" * 100_000 + b"]" * 100_000, KEY_A)
    assert status == 400 and body["error"]["type"] == "invalid_request_error", body
    assert _requests(meter, "alpha", "error") == 0 and _requests(meter, "alpha", "invalid") == 1




def test_dimensions_are_checked_against_the_answer_when_the_models_size_is_dynamic() -> None:
    """A model whose config leaves the embedding's size dynamic (-1) took any ``dimensions`` and answered
    its own width: a vector store sized for 256 got 4."""
    client = _Client()
    app, _ = _app(client, {"tenants": [{"name": "alpha", "keys": [KEY_A]}]}, dims=None)
    status, body = _post(app, {"model": "public", "input": ["hi"], "dimensions": 4}, KEY_A)
    assert status == 200 and len(body["data"][0]["embedding"]) == 4, body
    status, body = _post(app, {"model": "public", "input": ["hi"], "dimensions": 256}, KEY_A)
    assert status == 400 and body["error"]["param"] == "dimensions", body
    assert "returned 4 dimensions; it cannot return 256" in body["error"]["message"]
    # With a quota, the refused request is charged the tokens it used (3 a text), not its reservation.
    client = _Client()
    app, _ = _app(client, {"tenants": [{"name": "alpha", "keys": [KEY_A], "limits": {"tokens_per_min": 1000}}]}, dims=None)
    status, body = _post(app, {"model": "public", "input": ["hello world"] * 70, "dimensions": 256}, KEY_A)
    assert status == 400, body  # 910 reserved (70 x 13 bytes), 210 used
    status, body = _post(app, {"model": "public", "input": ["x" * 100] * 49}, KEY_A)  # 49 x 16 = 784 <= 790 left
    assert status == 200, body


def test_token_ids_outside_the_vocabulary_are_refused_before_they_take_anything() -> None:
    """A TensorRT plan does not check the ids it gathers with: tiktoken's ids (LangChain's default) or a
    tenant's made-up ones reached it. Refused by the encoder's vocabulary size, from its config."""
    client = _Client()
    app, meter = _app(client, {"tenants": [{"name": "alpha", "keys": [KEY_A], "limits": {"tokens_per_min": 1000}}]})
    status, body = _post(app, {"model": "public", "input": [[101, 150, 102], [101, 200, 102]]}, KEY_A)
    assert status == 400 and body["error"]["param"] == "input", body
    assert "'input' item 1 holds the token id 200" in body["error"]["message"] and "[0, 200)" in body["error"]["message"]
    assert _requests(meter, "alpha", "invalid") == 1


def test_token_rows_the_encoder_cannot_take_are_refused_before_they_take_anything() -> None:
    """A row past the encoder's longest sequence, or token rows for an encoder that takes more inputs:
    both failed in the client after admission, and the tenant was charged its whole reservation
    (150,000 ids against 200,000 a minute locked it out for 45 s) for a request Triton never saw."""
    client = _Client()
    app, meter = _app(client, {"tenants": [{"name": "alpha", "keys": [KEY_A], "limits": {"tokens_per_min": 1000}}]})
    status, body = _post(app, {"model": "public", "input": [[101, 102], [101] * 17]}, KEY_A)
    assert status == 400 and "'input' item 1 has 17 tokens; model 'public' takes at most 16" in body["error"]["message"]
    status, body = _post(app, {"model": "secret", "input": [[101, 102]]}, KEY_A)
    assert status == 400 and "model 'secret' takes texts only: its encoder 'secret_encoder' also takes" in \
        body["error"]["message"], body
    assert _requests(meter, "alpha", "invalid") == 2
    status, body = _post(app, {"model": "public", "input": ["x" * 100] * 62}, KEY_A)  # 62 x 16 = 992: all 1,000 left
    assert status == 200, body
