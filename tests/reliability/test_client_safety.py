"""The clients under threads, bursts and a restart: one HttpClient shared by threads answers every
call correctly; the asyncio HTTP client refuses past its in-flight window at once instead of queueing;
the default retry policy rides over a server restart within the call's deadline."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.reliability.supervised import call_across_a_restart, spawn_serve, stop_serve, tritonserver_pids
from tritonbundle.clients import ClientBusyError, GrpcClient, HttpClient, RetryPolicy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
TEXTS = [f"sentence number {i} about guitars" for i in range(12)]


def test_one_http_client_shared_by_threads(server: Any) -> None:
    with HttpClient(server.http_url) as client:
        expected = client.embed(TEXTS)
        errors: list[BaseException] = []
        wrong = 0

        def work(seed: int) -> None:
            nonlocal wrong
            rng = np.random.default_rng(seed)
            for _ in range(15):
                i = int(rng.integers(len(TEXTS)))
                try:
                    got = client.embed([TEXTS[i]])
                except BaseException as e:  # noqa: BLE001 - counted
                    errors.append(e)
                    continue
                if not np.allclose(got[0], expected[i], atol=1e-4):
                    wrong += 1

        threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "a call hung"
    assert errors == [] and wrong == 0, (errors[:3], wrong)


def test_async_http_client_refuses_past_its_window_at_once(server: Any) -> None:
    from tritonbundle.clients import AsyncHttpClient

    async def burst() -> tuple[int, int, float]:
        async with AsyncHttpClient(server.http_url, max_in_flight=4, retry=RetryPolicy(max_attempts=1)) as client:
            # The first call fetches the model's metadata, which every call of the burst would otherwise
            # wait for (a CI run read 0.34 s): the timing below is of the refusal alone.
            await client.embed([TEXTS[0]])
            started = time.monotonic()

            async def one(i: int) -> tuple[str, float]:
                t0 = time.monotonic()
                try:
                    await client.embed([TEXTS[i % len(TEXTS)]])
                    return "ok", time.monotonic() - t0
                except ClientBusyError:
                    return "busy", time.monotonic() - t0

            results = await asyncio.gather(*(one(i) for i in range(40)))
            busy = [t for r, t in results if r == "busy"]
            return len(results) - len(busy), len(busy), max(busy, default=0.0) + 0 * (time.monotonic() - started)

    ok, busy, slowest_refusal = asyncio.run(burst())
    assert ok >= 4 and busy > 0, (ok, busy)
    assert slowest_refusal < 0.05, "a refusal must not wait"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_default_retry_policy_rides_over_a_restart(repository: Path, tmp_path: Path, protocol: str) -> None:
    serve, http, grpc = spawn_serve(repository, tmp_path, "--restart")
    try:
        cls = HttpClient if protocol == "http" else GrpcClient
        url = f"127.0.0.1:{http if protocol == 'http' else grpc}"
        with cls(url, connect_timeout_s=180) as client:  # the default RetryPolicy and 30 s deadline
            client.embed(["warm"])
            (victim,) = tritonserver_pids(http)
            os.kill(victim, signal.SIGKILL)
            calls, failures, back = call_across_a_restart(lambda: client.embed(["still there?"]), http, [victim])
            assert back, "the server came back"
        assert failures == [], f"{len(failures)} of {calls} calls failed across the restart: {failures[:2]}"
    finally:
        stop_serve(serve)
