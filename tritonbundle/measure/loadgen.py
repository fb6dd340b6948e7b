"""Open-model load generation: Poisson arrivals from several processes, same request stream for every
system under test.

Each worker is ``python -m tritonbundle.measure.loadgen``: it reads one JSON command per line on stdin
and answers one JSON line on stdout. ``setup`` connects (gRPC: the project's ``AsyncGrpcClient`` on
the served model; HTTP: aiohttp against the naive server) and builds its request pool from the traffic
sample (gRPC: the model's own requests, :func:`tritonbundle.payloads.for_model`: texts through its
task's method, or tensors of its declared shapes, or token rows to a text model's encoder, each built
once into the bytes it sends, :mod:`tritonbundle.measure.wire`, unless ``TRITONBUNDLE_LOAD_SENDER=client``;
``TRITONBUNDLE_LOAD_SENDER=http``: the same calls as the HTTP client's requests, to the server's HTTP port;
HTTP: texts); ``step`` sends Poisson arrivals at a rate for a while and returns the latencies of the
requests scheduled inside the measured window.

Latency is measured from each request's *scheduled* arrival time to its answer, so a client that
falls behind shows up as latency (no coordinated omission); ``lag_ms`` reports how late sends were,
and ``p99_from_send_ms`` the tail measured from each send (what the server and the wire took).
The texts and arrival times depend only on (seed, worker, level), so every system sees the same stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tritonbundle.measure.gcpause import GcPauses
from tritonbundle.measure.latency import StepResult, percentile, step_result
from tritonbundle.measure.wire import SENDER_ENV, HttpSender, Sender, WireSender, capture, sender
from tritonbundle.proc import python_child_env

#: The load generators' event-loop watch: a timer this often, its lateness sampled (2 ms: ~500 wake-ups a
#: second, a small cost beside thousands of requests).
LOOP_TICK_S = 0.002


def _p99_ms(seconds: Sequence[float]) -> float:
    """The 99th percentile of ``seconds`` as the latencies' (:func:`.latency.percentile`), in ms (0 for none)."""
    return 1000.0 * percentile(seconds, 99) if seconds else 0.0


# -- the worker -------------------------------------------------------------------------------------------
def text_pool(traffic: str, *, seed: int, size: int, max_tokens: int = 512) -> list[tuple[int, str]]:
    """(tokens, text) pairs drawn from the traffic sample; each text tokenizes to exactly ``tokens``."""
    from tritonbundle import traffic as traffic_mod
    from tritonbundle.payloads import PayloadFactory

    factory = PayloadFactory(traffic_mod.load(traffic), seed=seed, max_tokens=max_tokens, max_batch=1)
    out = []
    for _ in range(size):
        tokens, _batch = factory.draw()
        out.append((tokens, factory.text(tokens)))
    return out


class _Worker:
    def __init__(self) -> None:
        self.kind = ""
        #: (tokens, request): texts for HTTP; for gRPC the WireRequests of a call (wire), else its payloads.Call.
        self.pool: list[tuple[int, Any]] = []
        self.client: Any = None
        #: Requests as bytes (the ``wire`` and ``http`` senders), else None: sent through ``client``.
        self.wire: Sender | None = None
        self.session: Any = None
        self.url = ""
        self.path = "/embed"
        self.timeout_s = 10.0
        self.gc = GcPauses().install()

    async def setup(self, cmd: dict[str, Any]) -> dict[str, Any]:
        await self.close()
        self.kind, self.url, self.timeout_s = cmd["kind"], cmd["url"], float(cmd.get("timeout_s", 10.0))
        self.path = str(cmd.get("path") or "/embed")
        if self.kind == "grpc":
            from tritonbundle import traffic as traffic_mod
            from tritonbundle.clients.aio import AsyncGrpcClient
            from tritonbundle.clients.core import RetryPolicy
            from tritonbundle.payloads import for_model

            self.client = AsyncGrpcClient(self.url, model=cmd["model"], timeout_s=self.timeout_s,
                                          retry=RetryPolicy(max_attempts=1), connect_timeout_s=30.0)
            await self.client.connect()
            info = await self.client.model_info(cmd["model"])
            requests = for_model(info, traffic_mod.load(cmd["traffic"]), seed=int(cmd["seed"]),
                                 max_batch=int(cmd.get("max_batch", 1)), kind=str(cmd.get("requests", "auto")))
            calls = [requests.next() for _ in range(int(cmd.get("pool", 2000)))]
            self.pool = [(c.tokens * c.rows, c) for c in calls]
            how = str(cmd.get("sender", "wire"))
            if how in ("wire", "http"):
                # One call through the client (its answer decoded and checked), then the pool as bytes:
                # gRPC's, or the HTTP client's to the server's HTTP endpoint.
                await self.one(calls[0])
                http = str(cmd["http_url"]) if how == "http" else None
                self.pool = [(tokens, await capture(self.client, c.send, http_host=http)) for tokens, c in self.pool]
                self.wire = HttpSender(http, timeout_s=self.timeout_s) if http else WireSender(self.url, timeout_s=self.timeout_s)
        elif self.kind == "http":
            self.pool = text_pool(cmd["traffic"], seed=int(cmd["seed"]), size=int(cmd.get("pool", 2000)))
            import aiohttp

            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            )
        else:
            raise ValueError(f"unknown kind {self.kind!r}")
        # One call to check the path end to end before any measurement.
        await self.one(self.pool[0][1])
        # What setup made lives as long as the process: out of the collector's sight, a full collection
        # walks only what the levels make. Of a gRPC wire pool of 2,000 (47,500 tracked objects) a full
        # collection took 5-8 ms on the development machine, 0.0 ms after the freeze, and a 10 ms pause
        # sent a level's requests 10 ms late (docs/benchmarks.md, "the load generators' collector").
        gc.collect()
        gc.freeze()
        return {"ok": True, "pool": len(self.pool), "pid": os.getpid()}

    async def one(self, request: Any) -> None:
        if self.wire is not None:
            await self.wire.send(request)
        elif self.kind == "grpc":
            await request.send(self.client)
        else:
            text = request
            async with self.session.post(f"http://{self.url}{self.path}", json={"text": text}) as response:
                if response.status != 200:
                    raise RuntimeError(f"HTTP {response.status}: {(await response.text())[:200]}")
                await response.read()

    async def step(self, cmd: dict[str, Any]) -> dict[str, Any]:
        rate, warmup_s, window_s = float(cmd["rate"]), float(cmd["warmup_s"]), float(cmd["window_s"])
        grace_s = float(cmd.get("grace_s", 2.0))
        rng = random.Random(int(cmd["seed"]))
        loop = asyncio.get_running_loop()
        latencies: list[float] = []
        errors: dict[str, int] = {}
        measured_sent = 0
        tokens_sent = 0
        lag_sum = 0.0
        lag_max = 0.0
        lates: list[float] = []
        from_send: list[float] = []
        sent = 0

        async def fire(text: str, scheduled: float, measured: bool) -> None:
            started = loop.time()
            try:
                await self.one(text)
            except Exception as e:  # noqa: BLE001 - every failure is counted, by type
                if measured:
                    key = f"{type(e).__name__}: {str(e)[:120]}"
                    errors[key] = errors.get(key, 0) + 1
                return
            if measured:
                done = loop.time()
                latencies.append((done - scheduled) * 1000.0)
                from_send.append((done - started) * 1000.0)

        tasks: list[asyncio.Task[None]] = []
        t0 = loop.time() + 0.05
        t = 0.0
        end = warmup_s + window_s
        loop_lags: list[float] = []

        async def watch_loop() -> None:
            """How late this process's event loop wakes a timer over the measured window: what an answer
            that has arrived may wait before its latency is taken (the load generator's share of the tail)."""
            while loop.time() < t0 + end:
                before = loop.time()
                await asyncio.sleep(LOOP_TICK_S)
                if before >= t0 + warmup_s:
                    loop_lags.append(max(0.0, loop.time() - before - LOOP_TICK_S))

        watcher = asyncio.ensure_future(watch_loop())
        self.gc.take()  # the level's collections from here (its warm-up included)
        try:
            while True:
                t += rng.expovariate(rate)
                if t >= end:
                    break
                tokens, text = self.pool[rng.randrange(len(self.pool))]
                when = t0 + t
                delay = when - loop.time()
                if delay > 0.0005:
                    await asyncio.sleep(delay)
                now = loop.time()
                late = max(0.0, now - when)
                measured = t >= warmup_s
                if measured:
                    measured_sent += 1
                    tokens_sent += tokens
                    lag_sum += late
                    lag_max = max(lag_max, late)
                    lates.append(late)
                tasks.append(asyncio.ensure_future(fire(text, when, measured)))
                sent += 1
            deadline = t0 + end + grace_s
            pending = [x for x in tasks if not x.done()]
            if pending:
                _done, pending_set = await asyncio.wait(pending, timeout=max(0.0, deadline - loop.time()))
                for task in pending_set:
                    task.cancel()
                if pending_set:
                    await asyncio.gather(*pending_set, return_exceptions=True)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        lost = measured_sent - len(latencies) - sum(errors.values())
        if lost > 0:
            errors["no answer within the grace period"] = errors.get("no answer within the grace period", 0) + lost
        return {
            "latencies_ms": latencies, "errors": errors, "sent": measured_sent, "tokens": tokens_sent,
            "lag_mean_ms": lag_sum / measured_sent * 1000.0 if measured_sent else 0.0, "lag_max_ms": lag_max * 1000.0,
            "lag_p99_ms": _p99_ms(lates), "loop_lag_p99_ms": _p99_ms(loop_lags), "total_sent": sent,
            "from_send_ms": from_send, **self.gc.take(),
        }

    async def close(self) -> None:
        gc.unfreeze()  # the pool setup froze may go now
        if self.wire is not None:
            with contextlib.suppress(Exception):
                await self.wire.close()
            self.wire = None
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.close()
            self.client = None
        if self.session is not None:
            with contextlib.suppress(Exception):
                await self.session.close()
            self.session = None


async def _serve() -> None:
    worker = _Worker()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    out = sys.stdout
    while True:
        line = await reader.readline()
        if not line:
            break
        cmd = json.loads(line)
        try:
            if cmd["op"] == "setup":
                answer = await worker.setup(cmd)
            elif cmd["op"] == "step":
                answer = await worker.step(cmd)
            elif cmd["op"] == "quit":
                break
            else:
                answer = {"error": f"unknown op {cmd['op']!r}"}
        except Exception as e:  # noqa: BLE001 - reported to the orchestrator, which marks the phase failed
            answer = {"error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()
    await worker.close()


def main() -> None:
    # uvloop only where asked (the HTTP workers): grpc.aio runs on the standard event loop.
    if "--uvloop" in sys.argv[1:]:
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
    asyncio.run(_serve())


# -- the pool, in the orchestrator ------------------------------------------------------------------------
class LoadError(RuntimeError):
    pass


@dataclass
class LoadPool:
    """N worker processes driving one system; ``step(rate)`` splits the rate evenly between them."""

    processes: int
    log_dir: Path
    name: str
    uvloop: bool = False
    #: What each worker runs (this module's ``_serve``): one JSON command per line in, one answer out.
    worker: tuple[str, ...] = (sys.executable, "-m", "tritonbundle.measure.loadgen")

    def __post_init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self._logs: list[Any] = []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def start(self) -> LoadPool:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = python_child_env()
        for i in range(self.processes):
            log = open(self.log_dir / f"loadgen-{self.name}-{i}.log", "a")  # noqa: SIM115 - closed in stop()
            self._logs.append(log)
            self.procs.append(subprocess.Popen(  # noqa: S603
                [*self.worker, *(["--uvloop"] if self.uvloop else [])],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=log, text=True, env=env, bufsize=1,
            ))
        return self

    def _ask_all(self, commands: Sequence[dict[str, Any]], timeout_s: float) -> list[dict[str, Any]]:
        for proc, cmd in zip(self.procs, commands):
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(cmd) + "\n")
            proc.stdin.flush()
        # Every generator's answer is read before any is judged: one left in its pipe would be read as the
        # answer to the next command (a setup's error as a step's result).
        answers, errors, lost = [], [], []
        deadline = time.monotonic() + timeout_s
        for i, proc in enumerate(self.procs):
            line = _readline(proc, deadline)
            if not line:
                lost.append(i)
                continue
            answer = json.loads(line)
            if "error" in answer:
                errors.append(f"load generator {i} ({self.name}): {answer['error']}")
            answers.append(answer)
        if lost:  # one that did not answer may still answer late: the pool starts again, in step
            self.stop()
            self.start()
            raise LoadError(f"load generator(s) {lost} ({self.name}) exited or timed out, and the pool was started "
                            f"again; see loadgen-{self.name}-{lost[0]}.log")
        if errors:
            raise LoadError(errors[0])
        return answers

    def setup(self, *, kind: str, url: str, model: str, traffic: str, seed: int, timeout_s: float, pool: int = 2000,
              ready_timeout_s: float = 120.0, path: str = "/embed", requests: str = "auto",
              http_url: str | None = None) -> None:
        """``requests`` (gRPC): ``auto``, the model's own requests, or ``tokens``, token rows to its encoder.
        gRPC requests go as bytes, through the client, or as HTTP requests to ``http_url`` (the same
        server's HTTP endpoint) as ``TRITONBUNDLE_LOAD_SENDER`` says (:func:`sender`)."""
        how = sender()
        if how == "http" and kind == "grpc" and not http_url:
            raise ValueError(f"{SENDER_ENV}=http: the load generators need the server's HTTP address (http_url)")
        self._ask_all([
            {"op": "setup", "kind": kind, "url": url, "model": model, "traffic": traffic, "seed": seed * 1000 + i,
             "timeout_s": timeout_s, "pool": pool, "path": path, "requests": requests, "sender": how,
             "http_url": http_url}
            for i in range(self.processes)
        ], ready_timeout_s)

    def step(self, rate: float, *, warmup_s: float, window_s: float, grace_s: float, seed: int) -> StepResult:
        per = rate / self.processes
        start = time.monotonic()
        answers = self._ask_all([
            {"op": "step", "rate": per, "warmup_s": warmup_s, "window_s": window_s, "grace_s": grace_s,
             "seed": seed * 7919 + i}
            for i in range(self.processes)
        ], warmup_s + window_s + grace_s + 30.0)
        latencies = [x for a in answers for x in a["latencies_ms"]]
        errors: dict[str, int] = {}
        for a in answers:
            for k, v in a["errors"].items():
                errors[k] = errors.get(k, 0) + v
        sent = sum(a["sent"] for a in answers)
        extra = {
            "errors": errors, "tokens_sent": sum(a["tokens"] for a in answers),
            "client_lag_mean_ms": max(a["lag_mean_ms"] for a in answers),
            "client_lag_max_ms": max(a["lag_max_ms"] for a in answers),
            "client_lag_p99_ms": max(a["lag_p99_ms"] for a in answers),
            "client_loop_lag_p99_ms": max(a["loop_lag_p99_ms"] for a in answers),
            # Latency from each request's send, not its schedule: where it stays within the SLO and the
            # p99 from the schedule does not, the load generators' lateness made the tail.
            "p99_from_send_ms": _p99_ms([x / 1000.0 for a in answers for x in a["from_send_ms"]]),
            # The garbage collector's longest pause in any load generator, and the most time one spent in it.
            "client_gc_max_ms": max(a["gc_max_ms"] for a in answers),
            "client_gc_ms": max(a["gc_ms"] for a in answers),
            "step_wall_s": round(time.monotonic() - start, 3),
        }
        return step_result(rate, window_s, latencies, sum(errors.values()), sent=sent, extra=extra)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(Exception):
                    assert proc.stdin is not None
                    proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                    proc.stdin.flush()
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        for log in self._logs:
            log.close()
        self.procs.clear()
        self._logs.clear()

    def __enter__(self) -> LoadPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _readline(proc: subprocess.Popen[str], deadline: float) -> str:
    """One line from the worker's stdout, or '' if it exits or the deadline passes."""
    import selectors

    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return ""
            if sel.select(timeout=min(left, 1.0)):
                return proc.stdout.readline()
            if proc.poll() is not None:
                return ""


if __name__ == "__main__":
    main()
