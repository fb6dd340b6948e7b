"""A storm of cancelled gRPC requests against ``serve --restart``. Triton 2.51's gRPC frontend races on a
request's state when the client cancels it (upstream server #7368/#8034, fixed by PRs #7840 and #8078
in 25.04 and later, so in the NGC releases this bundle builds for, 25.08 and 26.07; the CPU tier's
2.51 has neither): SIGSEGV within seconds, sometimes a deadlock in its crash handler. The supervisor
must bring it back after every crash (at once, no backoff) and find a hang (the canary); a
well-behaved caller meanwhile sees outages, bounded. Figures: reports/reliability/cancellations.json."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.reliability.test_canary import REPORT, answers, serve, stop

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
STORM_S = 30.0
CALLERS = 150


async def _storm(grpc_url: str, until: float, counts: dict[str, int]) -> None:
    import tritonclient.grpc.aio as grpcaio
    from tritonclient.grpc import InferInput

    async def caller(seed: int) -> None:
        rng = random.Random(seed)
        client = grpcaio.InferenceServerClient(grpc_url)
        try:
            while time.monotonic() < until:
                text = np.array([[b"a storm of cancelled requests " * rng.randint(1, 20)]], dtype=object)
                inp = InferInput("TEXT", [1, 1], "BYTES")
                inp.set_data_from_numpy(text)
                try:  # a deadline from 5 ms to 1 s: most calls are cancelled by the client mid-flight
                    await client.infer("minilm", [inp], client_timeout=rng.uniform(0.005, 0.3))
                    counts["answered"] += 1
                except Exception:  # noqa: BLE001 - cancelled, refused, or the server is down: all counted
                    counts["failed"] += 1
                    await asyncio.sleep(0.01)
        finally:
            await client.close()

    await asyncio.gather(*(caller(i) for i in range(CALLERS)))


def test_a_cancellation_storm_never_leaves_the_server_down(repository: Path, tmp_path: Path) -> None:
    process, http = serve(repository, tmp_path, "--restart", "--canary-interval-s", "1", "--canary-timeout-s", "2",
                          # After the storm Triton waited out its whole exit timeout (30 s) on the ensemble;
                          # this test checks the server stays up, not how it stops.
                          "--exit-timeout-s", "2")
    log = tmp_path / "serve.log"
    probes: list[tuple[float, bool]] = []
    stop_probing = threading.Event()

    def well_behaved() -> None:  # one embedding every 0.5 s over HTTP, as a client at its normal rate
        while not stop_probing.is_set():
            probes.append((time.monotonic(), answers(http)))
            stop_probing.wait(0.5)

    prober = threading.Thread(target=well_behaved, daemon=True)
    counts = {"answered": 0, "failed": 0}
    try:
        grpc = _grpc_url(tmp_path)
        prober.start()
        t0 = time.monotonic()
        asyncio.run(_storm(grpc, t0 + STORM_S, counts))
        deadline = time.monotonic() + 60
        while not answers(http):  # after the storm: serving again
            assert process.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "not serving 60 s after the storm"
            time.sleep(0.5)
        stop_probing.set()
        prober.join(timeout=10)
        assert process.poll() is None, "serve gave up"
    finally:
        stop_probing.set()
        stop(process)
    text = log.read_text()
    crashes = text.count("restarting tritonserver now")
    outages, down_since = [], None
    for at, ok in probes:
        if not ok and down_since is None:
            down_since = at
        elif ok and down_since is not None:
            outages.append(round(at - down_since, 2))
            down_since = None
    figures = {"callers": CALLERS, "storm_s": STORM_S, "requests_answered": counts["answered"],
               "requests_failed_or_cancelled": counts["failed"], "server_restarts": crashes,
               "hangs_found": text.count("the server is hung"), "well_behaved_outages_s": outages,
               "well_behaved_success": round(sum(ok for _, ok in probes) / max(1, len(probes)), 3)}
    REPORT.mkdir(parents=True, exist_ok=True)
    (REPORT / "cancellations.json").write_text(json.dumps(figures, indent=2))
    print(f"\ncancellation storm: {figures}")
    assert counts["answered"] + counts["failed"] > CALLERS
    assert all(o < 45 for o in outages), f"an outage outlasted 45 s: {figures}"


def _grpc_url(tmp_path: Path) -> str:
    """serve's gRPC address, from its console ("ready: HTTP ...  gRPC 127.0.0.1:PORT ...")."""
    import re

    deadline = time.monotonic() + 20  # tritonserver answers a moment before serve prints its line
    while not (match := re.search(r"gRPC (127\.0\.0\.1:\d+)", (tmp_path / "serve.log").read_text())):
        assert time.monotonic() < deadline, "serve did not print its gRPC address"
        time.sleep(0.2)
    return match.group(1)
