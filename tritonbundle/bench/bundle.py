"""The bundle: the real ``tritonserver`` serving the repository the build stage writes (tokenizer +
encoder + ensemble, dynamic batching, padding targets, CUDA graphs), driven over gRPC by
``AsyncGrpcClient`` from several load generator processes."""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

from tritonbundle.bench.accounting import tokens_ratio
from tritonbundle.bench.answers import check_answers, references
from tritonbundle.bench.breakdown import breakdown
from tritonbundle.bench.options import client_timeout_s, setup_timeout_s
from tritonbundle.bench.phase import Context, sweep, wait_idle
from tritonbundle.bench.workspace import SERVER_ARGS, Built, load_procs
from tritonbundle.log import LOG
from tritonbundle.measure import triton_metrics
from tritonbundle.measure.loadgen import LoadPool
from tritonbundle.measure.probes import CpuMeter
from tritonbundle.recipes import Recipe
from tritonbundle.runtimes.pytorch.stats import STATS_DIR_ENV, read_stats, read_stats_info
from tritonbundle.server import ServerOptions, TritonServer


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after}


def run_bundle(ctx: Context, built: Built, recipe: Recipe, deadline: float) -> dict[str, Any]:
    o = ctx.options
    name = recipe.model_name
    procs = load_procs(o.load_procs)
    stats_dir = ctx.work / name / "stats"
    shutil.rmtree(stats_dir, ignore_errors=True)
    stats_dir.mkdir(parents=True)
    os.environ[STATS_DIR_ENV] = str(stats_dir)
    server = TritonServer(ServerOptions(
        built.repository, http_port=0, grpc_port=0, metrics_port=0, log_path=ctx.logs / f"tritonserver-{name}.log",
        exit_timeout_s=5,
        extra_args=list(SERVER_ARGS),
    ))
    texts, expected = references(ctx, built)
    t_start = time.monotonic()
    try:
        server.start(wait=False)
        server.wait_ready(timeout_s=min(300.0, max(30.0, deadline - time.monotonic())))
        startup_s = time.monotonic() - t_start
        LOG.info("    bundle: tritonserver ready in %.1f s (%s)", startup_s, server.installation.description if server.installation else "")
        info = read_stats_info(stats_dir)
        from tritonbundle.clients import GrpcClient

        with GrpcClient(server.grpc_url, model=name, timeout_s=60.0) as client:
            correctness = check_answers("the bundle", client.embed(texts), expected)
        assert server.process is not None
        with LoadPool(procs, ctx.logs, f"bundle-{name}") as pool:
            pool.setup(kind="grpc", url=server.grpc_url, model=name, traffic=str(ctx.traffic_path), seed=o.seed,
                       timeout_s=client_timeout_s(o), ready_timeout_s=setup_timeout_s(deadline))
            meter = CpuMeter({"server": server.process.pid, **{f"load{i}": p for i, p in enumerate(pool.pids)}})

            def observe() -> dict[str, Any]:
                time.sleep(0.3)  # let the encoder's statistics file catch up (written every 0.25 s)
                try:
                    sample = triton_metrics.scrape(server.metrics_url)
                except OSError:
                    sample = {}
                return {"metrics": sample, "stats": read_stats(stats_dir), "cpu": meter.read(), "t": time.monotonic()}

            def finish(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
                views = {v.model: v.to_json() for v in triton_metrics.view(before["metrics"], after["metrics"])}
                return {
                    "triton": views, "encoder": _delta(before["stats"], after["stats"]),
                    "cpu_cores": CpuMeter.delta(before["cpu"], after["cpu"], after["t"] - before["t"]),
                }

            def drain(max_s: float) -> float:
                return wait_idle(lambda: triton_metrics.pending_requests(server.metrics_url), max_s, 0.0)

            result = sweep(ctx, pool, deadline, "bundle", observe, finish, drain, server.down_reason)
    finally:
        server.stop(timeout_s=20)
        os.environ.pop(STATS_DIR_ENV, None)
    ref_step = result.best or (max(result.steps, key=lambda s: s.offered_rps) if result.steps else None)
    padding = tokens_ratio(ref_step.extra.get("encoder", {})) if ref_step else {}
    return {
        "status": "ok", "sweep": result.to_json(), "best_rps": result.best_rps, "load_processes": procs,
        "startup_s": round(startup_s, 1), "correctness": correctness, "protocol": "grpc (tritonbundle.clients.AsyncGrpcClient)",
        "precision": o.precision, "encoder_instances": info, "padding": padding,
        "computed_per_useful": padding.get("computed_per_useful"),
        "seq_padded_per_useful": padding.get("seq_padded_per_useful"),
        "breakdown": breakdown(recipe, ref_step, o) if ref_step else None,
    }
