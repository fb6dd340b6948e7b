"""The ceiling: the same encoder engine in this process, no server: every (batch, padding target)
launch timed (CUDA graphs with CUDA events on a GPU, eager launches on the CPU), combined with the
traffic's share of rows per target (:func:`tritonbundle.bench.accounting.ceiling`)."""

from __future__ import annotations

import contextlib
import gc
import time
from typing import Any

import numpy as np

from tritonbundle.bench.accounting import bucket_shares, ceiling
from tritonbundle.bench.phase import Context
from tritonbundle.bench.records import CeilingResult, FixedShape
from tritonbundle.bench.workspace import Built
from tritonbundle.log import LOG
from tritonbundle.recipes import Recipe


def time_eager(engine: Any, batches: tuple[int, ...], targets: list[int], deadline: float) -> dict[tuple[int, int], float]:
    """Seconds per eager launch at each (batch, target), second of two runs (the first warms up)."""
    timings: dict[tuple[int, int], float] = {}
    for b in batches:
        for s in targets:
            if time.monotonic() > deadline:
                return timings
            ids = np.full((b, s), 1000, dtype=np.int64)
            masks, lengths = np.ones_like(ids), np.full(b, s)
            engine.embed(ids, masks, lengths)
            start = time.perf_counter()
            engine.embed(ids, masks, lengths)  # returns host arrays: the device work is finished
            timings[(b, s)] = time.perf_counter() - start
    return timings


def run_ceiling(ctx: Context, built: Built, recipe: Recipe, deadline: float) -> CeilingResult:
    from tritonbundle.runtimes.pytorch.engine import Engine, shape_name

    o = ctx.options
    targets = list(built.plan.padding_targets)
    lengths = ctx.sample.clipped(512).row_lengths()
    shares = bucket_shares(lengths, targets)
    mean_tokens = float(lengths.mean())
    t0 = time.monotonic()
    fixed: dict[tuple[int, int], float] = {}
    if o.device == "cuda":
        engine = Engine(built.version_dir, device="cuda", precision=o.precision, targets=targets,
                        batch_buckets=o.ceiling_batches, cuda_graphs=True).prepare()
        w0 = time.monotonic()
        if engine.use_graphs:
            timings = engine.time_shapes(reps=5)
            near = min(targets, key=lambda t: abs(t - 128))
            fixed_batch = max((b for b in o.ceiling_batches if b <= 128), default=0)
            if (fixed_batch, near) in engine.graphs:
                fixed = engine.time_shapes(reps=20, shapes=[(fixed_batch, near)])
        else:  # capture failed: an eager ceiling, labelled as such, rather than none
            LOG.warning("    ceiling: CUDA graph capture failed (%s); timing eager launches", engine.graph_error)
            timings = time_eager(engine, o.ceiling_batches, targets, deadline)
        w1 = time.monotonic()
    else:
        engine = Engine(built.version_dir, device="cpu", precision="fp32", targets=targets, cuda_graphs=False).prepare()
        w0 = time.monotonic()
        timings = time_eager(engine, o.ceiling_batches, targets, deadline)
        w1 = time.monotonic()
    per_batch, best = ceiling(timings, shares, mean_tokens, o.slo_ms / 1000.0)
    gpu = ctx.gpu.window(w0, w1) if ctx.gpu is not None else {}
    describe = engine.describe()
    mode = "cuda graphs" if describe["cuda_graphs"] else ("eager (graph capture failed)" if describe["graph_error"] else "eager")
    del engine
    gc.collect()
    if o.device == "cuda":
        with contextlib.suppress(Exception):
            import torch

            torch.cuda.empty_cache()
    fixed_shape = None
    if fixed:
        (b, s), t = next(iter(fixed.items()))
        fixed_shape = FixedShape(batch=b, length=s, ms=t * 1000.0, tokens_per_s=b * s / t)
    return CeilingResult(
        status="ok", best_rps=best.requests_per_s if best else None, best=best, per_batch=per_batch,
        mean_tokens=mean_tokens, shares={str(k): v for k, v in shares.items()},
        timings_ms={shape_name(shape): round(t * 1000.0, 4) for shape, t in sorted(timings.items())},
        computed_per_useful=sum(share * s for s, share in shares.items()) / mean_tokens,
        engine=describe, mode=mode, seconds=round(time.monotonic() - t0, 1), gpu=gpu, fixed_shape=fixed_shape,
    )
