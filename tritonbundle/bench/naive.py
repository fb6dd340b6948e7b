"""The naive system: :mod:`tritonbundle.bench.naive_server` (what a team writes on day one), driven
over HTTP by the same load generator on the same request stream."""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tritonbundle import proc
from tritonbundle.bench.answers import check_answers, references
from tritonbundle.bench.options import client_timeout_s, setup_timeout_s
from tritonbundle.bench.phase import Context, NoRate, sweep
from tritonbundle.bench.records import NaiveResult
from tritonbundle.bench.workspace import Built
from tritonbundle.errors import TritonBundleError
from tritonbundle.measure.levels import Probes, SystemDown, wait_idle
from tritonbundle.measure.loadgen import LoadPool
from tritonbundle.measure.probes import CpuMeter
from tritonbundle.proc import free_port
from tritonbundle.recipes import Recipe


@contextlib.contextmanager
def http_server(module: str, args: list[str], log: Path, timeout_s: float, what: str) -> Iterator[tuple[str, int]]:
    """Run ``python -m module ARGS --port P`` in its own process group until it answers /health."""
    port = free_port()
    server = proc.start_group([sys.executable, "-m", module, *args, "--port", str(port)], log=log, env=proc.python_child_env())
    try:
        try:
            proc.wait_until(lambda: proc.http_ok(f"http://127.0.0.1:{port}/health", timeout_s=1), timeout_s=timeout_s,
                            proc=server, what=what, interval_s=0.2)
        except TritonBundleError as e:
            raise TritonBundleError(f"{e}: {proc.tail(log)}") from e
        yield f"127.0.0.1:{port}", server.pid
    finally:
        proc.stop_group(server)


def post_texts(url: str, texts: list[str]) -> list[Any]:
    """Each text's embedding from a JSON-over-HTTP server (``{"text": ...}`` -> ``{"embedding": [...]}``)."""
    answers = []
    for text in texts:
        request = urllib.request.Request(url, data=json.dumps({"text": text}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as r:  # noqa: S310 - our own servers
            answers.append(json.loads(r.read())["embedding"])
    return answers


def health_s(url: str) -> float:
    """Seconds the naive server takes to answer /health (its event loop is blocked while it computes)."""
    start = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - our own server
            r.read()
    except OSError:
        return math.inf
    return time.monotonic() - start


def http_probes(ctx: Context, system: str, pid: int, pool: LoadPool, url: str) -> Probes:
    """Around each level of an HTTP server: CPU of the server and the load generators; before it, wait
    until /health answers within the SLO (the event loop is free again)."""
    meter = CpuMeter({system: pid, **{f"load{i}": p for i, p in enumerate(pool.pids)}})

    def observe() -> dict[str, Any]:
        return {"cpu": meter.read(), "t": time.monotonic()}

    def finish(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
        return {"cpu_cores": CpuMeter.delta(before["cpu"], after["cpu"], after["t"] - before["t"])}

    def drain(max_s: float) -> float:
        return wait_idle(lambda: health_s(f"http://{url}/health"), max_s, ctx.options.slo_ms / 1000.0)

    return Probes(observe=observe, finish=finish, drain=drain)


def run_naive(ctx: Context, built: Built, recipe: Recipe, deadline: float) -> NaiveResult:
    o = ctx.options
    procs = max(1, min(2, o.load_procs or 2))
    name = recipe.model_name
    log = ctx.logs / f"naive-{name}.log"
    texts, expected = references(ctx, built)
    args = ["--weights", str(built.version_dir), "--tokenizer", str(ctx.tokenizer), "--device", o.device]
    with http_server("tritonbundle.bench.naive_server", args, log, min(180.0, max(30.0, deadline - time.monotonic())),
                     "the naive server") as (url, pid):
        correctness = check_answers("the naive server", post_texts(f"http://{url}/embed", texts), expected)
        with LoadPool(procs, ctx.logs, f"naive-{name}", uvloop=True) as pool:
            pool.setup(kind="http", url=url, model=name, traffic=str(ctx.traffic_path), seed=o.seed,
                       timeout_s=client_timeout_s(o), ready_timeout_s=setup_timeout_s(deadline))
            try:
                result, failed = sweep(ctx, pool, deadline, "naive", http_probes(ctx, "naive", pid, pool, url)), None
            except (NoRate, SystemDown) as e:  # failed, and its levels say how
                result, failed = e.sweep, str(e)
    return NaiveResult(status="failed" if failed else "ok", error=failed, sweep=result, best_rps=result.best_rps, load_processes=procs,
                       correctness=correctness, protocol="http (aiohttp)", precision="fp32",
                       padding="none (each request at its own length)", computed_per_useful=1.0)
