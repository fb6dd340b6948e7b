"""Overload: a burst at several times capacity is refused quickly (UNAVAILABLE / 503) by the queue
policy in the generated configs, every request is accounted for, and retries stay bounded."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tritonbundle.clients import AsyncGrpcClient, RetryPolicy, ServerUnavailableError
from tritonbundle.modelconfig import read_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

BURST = 400
DEADLINE_S = 20.0
REPORT = Path(__file__).resolve().parents[2] / "reports" / "reliability"


class CountingClient(AsyncGrpcClient):
    """The real client, recording when each attempt hits the wire."""

    sent: list[float]

    async def _infer(self, *args: Any, **kwargs: Any) -> Any:
        self.sent.append(time.monotonic())
        return await super()._infer(*args, **kwargs)


async def _burst(url: str, n: int, retry: RetryPolicy, sent: list[float] | None = None) -> list[tuple[str, float, int]]:
    """Fire n requests at once; return (outcome, seconds, attempts) for each."""
    client = CountingClient(url, retry=retry, timeout_s=DEADLINE_S, pool_size=8)
    client.sent = sent if sent is not None else []
    async with client:

        async def one(i: int) -> tuple[str, float, int]:
            start = time.monotonic()
            try:
                await asyncio.wait_for(client.embed([f"burst request {i} " + "word " * 40]), DEADLINE_S + 5)
                return "ok", time.monotonic() - start, 1
            except ServerUnavailableError as e:
                return "rejected", time.monotonic() - start, e.attempts
            except asyncio.TimeoutError:
                return "hung", time.monotonic() - start, 0
            except Exception as e:  # noqa: BLE001 - anything else is a finding
                return f"other: {type(e).__name__}: {e}", time.monotonic() - start, 0

        return await asyncio.gather(*(one(i) for i in range(n)))


def test_generated_configs_bound_the_queue_and_reject_on_timeout(default_repository: Path) -> None:
    for model in ("minilm_encoder", "minilm_tokenizer"):
        policy = read_config(default_repository / model / "config.pbtxt").dynamic_batching.default_queue_policy
        assert policy.max_queue_size > 0
        assert policy.default_timeout_microseconds > 0
        assert policy.timeout_action == policy.REJECT


@pytest.fixture(scope="module")
def default_server(default_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A server on the repository exactly as shipped (queue size and timeout as generated)."""
    from tritonbundle.server import ServerOptions, TritonServer

    log = tmp_path_factory.mktemp("overload") / "tritonserver.log"
    server = TritonServer(ServerOptions(default_repository, http_port=0, grpc_port=0, metrics_port=0, log_path=log))
    server.start(ready_timeout_s=120)
    yield server
    server.stop()


def test_a_burst_beyond_capacity_is_refused_fast_and_nothing_is_lost(default_server: Any, default_repository: Path) -> None:
    server = default_server
    policy = read_config(default_repository / "minilm_encoder" / "config.pbtxt").dynamic_batching.default_queue_policy
    queue_timeout_s = policy.default_timeout_microseconds / 1e6
    results = asyncio.run(_burst(server.grpc_url, BURST, RetryPolicy(max_attempts=1)))
    outcomes = [r[0] for r in results]
    ok = np.array([t for o, t, _ in results if o == "ok"])
    rejected = np.array([t for o, t, _ in results if o == "rejected"])
    others = [o for o in outcomes if o not in ("ok", "rejected")]
    figures = {
        "burst": BURST, "accepted": int(ok.size), "rejected": int(rejected.size), "lost_or_hung": len(others),
        "rejected_p99_s": float(np.percentile(rejected, 99)) if rejected.size else None,
        "accepted_p99_s": float(np.percentile(ok, 99)) if ok.size else None,
        "queue_timeout_s": queue_timeout_s, "max_queue_size": policy.max_queue_size, "client_deadline_s": DEADLINE_S,
    }
    REPORT.mkdir(parents=True, exist_ok=True)
    (REPORT / "overload.json").write_text(json.dumps(figures, indent=2))
    assert not others, f"requests neither served nor explicitly rejected: {others[:5]}"
    assert ok.size + rejected.size == BURST
    assert rejected.size > 0, f"a burst of {BURST} was not beyond capacity: {figures}"
    assert ok.size > 0
    # Rejected requests fail fast: well under the client's deadline.
    assert figures["rejected_p99_s"] < DEADLINE_S / 4, figures
    # Accepted requests waited at most the queue timeout, plus the execution of the batches ahead
    # of them (seconds on a busy 2-core machine): far below the deadline they would otherwise hit.
    assert figures["accepted_p99_s"] < queue_timeout_s + 6.0, figures


def test_retries_under_overload_stay_bounded_and_spread(default_server: Any) -> None:
    server = default_server
    attempts_allowed = 3
    sent: list[float] = []
    started = time.monotonic()
    results = asyncio.run(_burst(server.grpc_url, 200, RetryPolicy(max_attempts=attempts_allowed, initial_backoff_s=0.05,
                                                                   max_backoff_s=0.5), sent))
    assert all(o in ("ok", "rejected") for o, _, _ in results)
    assert all(a <= attempts_allowed for o, _, a in results if o == "rejected")
    # No retry storm: at most attempts_allowed requests per call reached the wire...
    assert len(sent) <= 200 * attempts_allowed
    # ...and retries were spread by jitter instead of arriving as a second synchronized burst.
    retries = np.array(sorted(t - started for t in sent))[200:]
    # (288 retries on the idle 2-core machine: the burst is far past the queue's bound)
    assert retries.size > 20, f"only {retries.size} retries: too few to judge their spread"
    busiest_10ms = max(np.sum((retries >= t) & (retries < t + 0.01)) for t in retries)
    assert busiest_10ms < retries.size / 2, f"{busiest_10ms} of {retries.size} retries within 10 ms"
