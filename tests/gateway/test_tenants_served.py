"""Tenants on the real stack (the CPU tritonserver, the gateway process, OpenAI's client and raw HTTP):
keys, the models a tenant sees, limits that hold one tenant's burst away from another, and metering that
counts exactly what the tokenizer produced and what was refused."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tests.conftest import token_counts
from tests.gateway.conftest import running_gateway
from tritonbundle.gateway.metering import read, report
from tritonbundle.gateway.tenants import key_hash
from tritonbundle.proc import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

A_KEY, B_KEY = "tb-tenant-a-key-for-the-tests-0001", "tb-tenant-b-key-for-the-tests-0002"
QUOTA_RPS = 8


@pytest.fixture(scope="module")
def gateway(server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    folder = tmp_path_factory.mktemp("tenants")
    (folder / "tenants.yaml").write_text(f"""
tenants:
  - name: team-a
    keys: ["{key_hash(A_KEY)}"]
    models: [minilm]
    limits: {{requests_per_s: {QUOTA_RPS}, burst: 4, concurrent_requests: 8}}
  - name: team-b
    keys: ["{key_hash(B_KEY)}"]
    limits: {{requests_per_s: {QUOTA_RPS}, burst: 4}}
""")
    metrics = free_port()
    with running_gateway(server, folder, "--tenants", str(folder / "tenants.yaml"), "--usage-log",
                         str(folder / "usage.jsonl"), "--metrics-port", str(metrics)) as url:
        yield SimpleNamespace(url=url, folder=folder, metrics=f"http://127.0.0.1:{metrics}/metrics")
    assert A_KEY not in (folder / "gateway.log").read_text()


def test_keys_decide_who_is_served_and_what_they_see(gateway: SimpleNamespace) -> None:
    import openai

    def client(key: str) -> Any:
        return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0, timeout=60)

    with pytest.raises(openai.AuthenticationError, match="not known here") as unknown:
        client("tb-some-key-nobody-was-given-00").embeddings.create(model="minilm", input="hi")
    assert unknown.value.status_code == 401 and "tb-some-key" not in str(unknown.value)
    with pytest.raises(openai.AuthenticationError, match="not known here"):
        client("tb-some-key-nobody-was-given-00").models.list()
    assert [m.id for m in client(A_KEY).models.list()] == ["minilm"]
    with pytest.raises(openai.NotFoundError, match="does not exist here or this key may not use it"):
        client(A_KEY).embeddings.create(model="bert_base", input="hi")
    result = client(B_KEY).embeddings.create(model="minilm", input=["one text", "and another"])
    assert len(result.data) == 2 and result.usage.total_tokens > 0
    request = urllib.request.Request(f"{gateway.url}/v1/embeddings", data=b'{"model": "minilm", "input": "hi"}',
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(request, timeout=30)
    assert missing.value.code == 401 and b"Authorization: Bearer" in missing.value.read()


async def _drive(url: str, key: str, rate: float, seconds: float, tag: str) -> list[dict[str, Any]]:
    """Requests of two texts at evenly spaced times; per request: status, latency, texts, usage."""
    import aiohttp

    results: list[dict[str, Any]] = []
    start = time.monotonic()
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"},
                                     timeout=aiohttp.ClientTimeout(total=30)) as http:
        async def one(i: int) -> None:
            due = start + i / rate
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            texts = [f"{tag} request {i} asks about guitars", f"{tag} request {i} " + "and rivers " * (i % 7)]
            async with http.post(f"{url}/v1/embeddings", json={"model": "minilm", "input": texts}) as answer:
                body = await answer.json()
                results.append({"status": answer.status, "latency_ms": (time.monotonic() - due) * 1000, "texts": texts,
                                "tokens": body.get("usage", {}).get("total_tokens", 0),
                                "retry_after": answer.headers.get("retry-after"), "body": body})

        await asyncio.gather(*(one(i) for i in range(int(rate * seconds))))
    return results


def _p90(results: list[dict[str, Any]]) -> float:
    """The 90th percentile of answered requests' latency: of team-b's 36 requests a p99 is their slowest one,
    which one scheduling hiccup of a busy 2-core machine sets (468 ms beside a 37 ms reference in one CI run)."""
    return float(np.percentile([r["latency_ms"] for r in results if r["status"] == 200], 90))


def test_one_tenants_burst_leaves_the_other_served_and_metering_is_exact(
    gateway: SimpleNamespace, exported_minilm: Path
) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    async def both(a_rate: float, tag: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        a, b = await asyncio.gather(_drive(gateway.url, A_KEY, a_rate, 6, f"a-{tag}"),
                                    _drive(gateway.url, B_KEY, 6, 6, f"b-{tag}"))
        return a, b

    # The reference: team-a at its quota (all of it served) beside team-b; then team-a at 5x its quota.
    a_quota, alone = asyncio.run(both(QUOTA_RPS, "quota"))
    a, b = asyncio.run(both(5 * QUOTA_RPS, "burst"))
    assert all(r["status"] == 200 for r in a_quota + alone + b), \
        [r["body"] for r in a_quota + alone + b if r["status"] != 200][:2]
    refused = [r for r in a if r["status"] == 429]
    served_a = [r for r in a if r["status"] == 200]
    assert len(refused) + len(served_a) == len(a) == 240
    # team-a gets its quota (8/s over 6 s, plus the burst of 4), no more; every refusal says when to retry.
    assert 40 <= len(served_a) <= 4 + QUOTA_RPS * 6 + 4, len(served_a)
    assert all(r["retry_after"] == "1" and r["body"]["error"]["code"] == "rate_limit_exceeded" for r in refused)
    p90_quota, p90_burst = _p90(alone), _p90(b)
    slowest = max(r["latency_ms"] for r in b)
    print(f"\nteam-b p90 with team-a at its quota {p90_quota:.1f} ms, with team-a at 5x its quota {p90_burst:.1f} ms "
          f"(slowest {slowest:.0f} ms); team-a served {len(served_a)} of 240, refused {len(refused)}")
    assert p90_burst <= max(2 * p90_quota, p90_quota + 100), (p90_quota, p90_burst)
    assert slowest < 2000, slowest
    served_a += a_quota

    # Metering: the usage log, `tritonbundle usage` and Prometheus agree with what the callers saw, and the
    # tokens are the tokenizer's own counts of the texts that were answered.
    for r in alone + b + served_a:
        assert r["tokens"] == sum(token_counts(exported_minilm, r["texts"]))
    rows = {row["tenant"]: row for row in report(read(gateway.folder / "usage.jsonl"))}
    tokens_a = sum(r["tokens"] for r in served_a)
    tokens_b = sum(r["tokens"] for r in alone + b)
    assert (rows["team-a"]["ok"], rows["team-a"]["refused"], rows["team-a"]["refusals"]) == \
        (len(served_a), len(refused), {"rate": len(refused)})
    assert rows["team-a"]["tokens"] == tokens_a and rows["team-a"]["texts"] == 2 * len(served_a)
    assert rows["team-b"]["tokens"] >= tokens_b and rows["team-b"]["refused"] == 0  # >=: the keys test's call too
    with urllib.request.urlopen(gateway.metrics, timeout=10) as answer:
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for family in text_string_to_metric_families(answer.read().decode()) for s in family.samples}
    assert samples[("tritonbundle_gateway_tokens_total", (("model", "minilm"), ("tenant", "team-a")))] == tokens_a
    assert samples[("tritonbundle_gateway_refusals_total",
                    (("model", "minilm"), ("reason", "rate"), ("tenant", "team-a")))] == len(refused)
    assert samples[("tritonbundle_gateway_requests_total",
                    (("model", "-"), ("outcome", "refused"), ("tenant", "(unauthenticated)")))] >= 1


ECHO_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("P", np.array([r.parameters().encode()], dtype=object))])
                for r in requests]
'''


def test_the_tenant_header_reaches_the_models_as_a_request_parameter(tmp_path: Path) -> None:
    """tritonserver (as ``serve`` starts it) forwards ``tritonbundle-tenant`` and no other header."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    from tritonbundle.server import ServerOptions, TritonServer

    (tmp_path / "repo" / "echo" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "echo" / "1" / "model.py").write_text(ECHO_MODEL)
    (tmp_path / "repo" / "echo" / "config.pbtxt").write_text(
        'name: "echo"\nbackend: "python"\nmax_batch_size: 0\ninput [{ name: "X", data_type: TYPE_INT32, dims: [1] }]\n'
        'output [{ name: "P", data_type: TYPE_STRING, dims: [1] }]\n')
    server = TritonServer(ServerOptions(tmp_path / "repo", http_port=0, grpc_port=0, metrics_port=0,
                                        log_path=tmp_path / "tritonserver.log", exit_timeout_s=5)).start(ready_timeout_s=120)
    try:
        for module, url, tenant in ((grpcclient, server.grpc_url, "team-a"), (httpclient, server.http_url, "team-b")):
            x = module.InferInput("X", [1], "INT32")
            x.set_data_from_numpy(np.array([1], dtype=np.int32))
            answer = module.InferenceServerClient(url).infer("echo", [x], headers={"tritonbundle-tenant": tenant,
                                                                                   "x-other": "not forwarded"})
            assert answer.as_numpy("P")[0] == f'{{"tritonbundle-tenant":"{tenant}"}}'.encode()
    finally:
        server.stop()
