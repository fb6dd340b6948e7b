"""The peer system: a LitServe embedding server (:mod:`tritonbundle.bench.peer_server`) at its
documented best settings, driven over HTTP by the same load generator on the same request stream as
the others, its answers checked against the FP32 reference first.

Why LitServe: it installs from PyPI and runs anywhere torch does (the GPU machine has no network, so
what it needs is carried as wheels), it is what a team picks to serve a PyTorch model with dynamic
batching, and its batching loop is its own, not Triton's. infinity-emb needs sentence-transformers < 4
and transformers < 5 in an environment of its own and, measured on the H200 before, stayed far behind
its own warm-up figures; Hugging Face's text-embeddings-inference is a Rust binary that cannot be
installed here.
"""

from __future__ import annotations

import time
from typing import Any

from tritonbundle import proc
from tritonbundle.bench.answers import check_answers, references
from tritonbundle.bench.naive import http_probes, http_server, post_texts
from tritonbundle.bench.options import client_timeout_s, setup_timeout_s
from tritonbundle.bench.peer_server import SETTINGS
from tritonbundle.bench.phase import Context, NoRate, sweep
from tritonbundle.bench.records import PeerResult
from tritonbundle.bench.workspace import Built
from tritonbundle.measure.levels import SystemDown
from tritonbundle.measure.loadgen import LoadPool
from tritonbundle.recipes import Recipe


def settings(device: str) -> dict[str, Any]:
    """The peer's settings here: its documented ones, scaled to this machine's cores."""
    cores = len(proc.usable_cpus())
    out = dict(SETTINGS)
    if device != "cuda" or cores < 8:  # a small machine (the CPU smoke test): one of each
        out.update(workers_per_device=1, num_api_servers=1)
    return out


def run_peer(ctx: Context, built: Built, recipe: Recipe, deadline: float) -> PeerResult:
    o = ctx.options
    name = recipe.model_name
    procs = o.load_procs or 2
    chosen = settings(o.device)
    args = ["--weights", str(built.version_dir), "--tokenizer", str(ctx.tokenizer), "--device", o.device]
    for key, value in chosen.items():
        args += [f"--{key.replace('_', '-')}", str(int(value) if isinstance(value, bool) else value)]
    texts, expected = references(ctx, built)
    with http_server("tritonbundle.bench.peer_server", args, ctx.logs / f"peer-{name}.log",
                     min(240.0, max(30.0, deadline - time.monotonic())), "the LitServe peer") as (url, pid):
        correctness = check_answers("the LitServe peer", post_texts(f"http://{url}/predict", texts), expected)
        with LoadPool(procs, ctx.logs, f"peer-{name}", uvloop=True) as pool:
            pool.setup(kind="http", url=url, path="/predict", model=name, traffic=str(ctx.traffic_path), seed=o.seed,
                       timeout_s=client_timeout_s(o), ready_timeout_s=setup_timeout_s(deadline))
            try:
                result, failed = sweep(ctx, pool, deadline, "peer", http_probes(ctx, "peer", pid, pool, url)), None
            except (NoRate, SystemDown) as e:  # failed, and its levels say how
                result, failed = e.sweep, str(e)
    return PeerResult(
        status="failed" if failed else "ok", error=failed, sweep=result, best_rps=result.best_rps, load_processes=procs, correctness=correctness,
        protocol="http (LitServe, FastAPI)", system="LitServe 0.2.x", settings=chosen,
        precision="fp16" if o.device == "cuda" else "fp32", padding="each batch to its longest text", changed=[
            "torch.backends.cuda.enable_cudnn_sdp(False): cuDNN attention plans every new shape (80-90 ms each)",
            "warm-up at every length range before the server reports healthy",
        ])
