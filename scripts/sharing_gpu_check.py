"""What splitting the GPU between processes costs the encoder, with no server around it.

N processes, each one engine as one of the bundle's folded encoder instances holds it (CUDA graphs at
the bundle's padding targets and batch buckets, packing on, fp16), embed calls of ``--rows`` chat-like
rows back to back for ``--seconds``, all at once; for each N in ``--procs``, one JSON line: the rows per
second of all of them together, each process's calls, the mean call, and the GPU's utilisation over the
window. Everything an instance does in the server besides ``Engine.embed`` (reading requests,
tokenizing, responding, Triton's hand-over) is left out.

Why: on the fifth H100 (docs/benchmarks.md, "A fifth H100") BERT-base's bundle reached 14,135 req/s
with the GPU 92-95 % busy and 7.1-8.1 ms of each 11.5-12.8 ms call waiting for it, where the ceiling
(one process, launches timed back to back) does 18,276 at batch 64: 0.064-0.066 ms of busy GPU per
request against 0.055. If eight processes here also stop near 14-15k, splitting the GPU across
processes is what costs the difference (and fewer processes, or lanes in one, are the lever); if they
reach the ceiling, the loss is in the server's part of the call.

Run THERE (the GPU machine), after ``scripts/device_bench.sh install``; the weights are the recipe's
(BERT-base: random, seed 0), written to a temporary folder:

    python3 scripts/sharing_gpu_check.py --procs 1,2,4,8 --seconds 15 --mps

``--mps`` starts a private CUDA MPS daemon for the processes (tritonbundle.gpu_sharing), as the bench
does under ``TRITONBUNDLE_GPU_SHARING=mps``. On a machine without a GPU ``--device cpu`` runs the same
loop eagerly (what the test does: it checks the plumbing, not a speed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tritonbundle import recipes, traffic  # noqa: E402

#: The hand-picked BERT-base settings' engine (docs/tuning/h200-handpicked/bert-base-fused8-t4-buckets18.json,
#: and the padding targets the bench planned for them from the chat traffic: bench.md, "repository").
TARGETS = "22,32,41,50,59,71,85,102,121,143,169,199,241,299,384,512"
BUCKETS = "1,2,3,4,6,8,10,12,14,16,20,24,28,32,40,48,56,64"
#: A process that has not reported this long after its window ended is stuck: the run fails.
GRACE_S = 120.0


def write_weights(recipe: str, folder: Path) -> Path:
    """``config.json`` + ``model.safetensors`` of ``recipe`` in ``folder`` (what the build stage writes)."""
    from safetensors.torch import save_file

    config, state = recipes.load_weights(recipe)
    save_file({k: v.detach().contiguous() for k, v in state.items()}, str(folder / recipes.WEIGHTS_FILE))
    (folder / recipes.CONFIG_FILE).write_text(json.dumps(config))
    return folder


def calls(rows: int, count: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``count`` calls of ``rows`` rows, their lengths drawn from the chat traffic (clipped to 512), token
    ids random in the vocabulary's common range after a [CLS]; each call padded to its longest row."""
    from tritonbundle.runtimes.pytorch.engine import stack_rows

    lengths = traffic.synthetic("chat", n=4000, seed=seed).clipped(512).row_lengths()
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        batch = []
        for length in rng.choice(lengths, size=rows):
            ids = rng.integers(1000, 20000, size=max(2, int(length)))
            ids[0] = 101
            batch.append(ids.astype(np.int64))
        out.append(stack_rows(batch))
    return out


def worker(index: int, options: dict[str, Any], barrier: Any, results: Any) -> None:
    """One instance's engine: prepare, wait for the others, embed calls back to back for the window."""
    try:
        from tritonbundle.runtimes.pytorch.engine import Engine
        from tritonbundle.runtimes.pytorch.launch import used_lengths

        t0 = time.monotonic()
        engine = Engine(options["weights"], device=options["device"], precision=options["precision"],
                        targets=options["targets"], batch_buckets=options["buckets"], packing=True,
                        max_sequence_length=512).prepare()
        work = calls(options["rows"], options["calls"], seed=index)
        for ids, masks in work[:2]:  # the first calls of a process pay for lazy set-up
            engine.embed(ids, masks, used_lengths(masks))
        prepare_s = time.monotonic() - t0
        barrier.wait(timeout=options["prepare_timeout_s"])
        done = rows = 0
        start = time.perf_counter()
        stop = time.monotonic() + options["seconds"]
        while time.monotonic() < stop:
            ids, masks = work[done % len(work)]
            engine.embed(ids, masks, used_lengths(masks))
            done += 1
            rows += int(ids.shape[0])
        wall = time.perf_counter() - start
        results.put({"index": index, "calls": done, "rows": rows, "seconds": wall, "prepare_s": round(prepare_s, 1),
                     "graphs": len(engine.graphs)})
    except Exception as e:  # noqa: BLE001 - reported to the parent, which fails the run
        with contextlib.suppress(Exception):
            barrier.abort()
        results.put({"index": index, "error": f"{type(e).__name__}: {e}"})


def measure(procs: int, options: dict[str, Any]) -> dict[str, Any]:
    """``procs`` workers at once: their reports summed, and the GPU's utilisation over the window."""
    from tritonbundle.measure.probes import GpuSampler

    ctx = mp.get_context("spawn")  # CUDA cannot be used in a forked child
    barrier, results = ctx.Barrier(procs + 1), ctx.Queue()
    workers = [ctx.Process(target=worker, args=(i, options, barrier, results), daemon=True) for i in range(procs)]
    for w in workers:
        w.start()
    sampler = GpuSampler().start() if options["device"] == "cuda" else None
    reports: list[dict[str, Any]] = []
    try:
        barrier.wait(timeout=options["prepare_timeout_s"])
        window = (time.monotonic(), time.monotonic() + options["seconds"])
    except Exception:  # noqa: BLE001 - a worker failed or never got ready: its report says why
        window = None
    deadline = time.monotonic() + options["seconds"] + GRACE_S
    while len(reports) < procs and time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            reports.append(results.get(timeout=1.0))
        if window is None and not any(w.is_alive() for w in workers) and results.empty():
            break
    gpu = sampler.window(*window) if sampler is not None and window is not None else {}
    if sampler is not None:
        sampler.stop()
    for w in workers:
        w.join(timeout=5)
        if w.is_alive():
            w.kill()
    errors = list(dict.fromkeys(r["error"] for r in reports if "error" in r))
    if errors or len(reports) < procs or window is None:
        return {"procs": procs, "ok": False,
                "error": "; ".join(errors) or f"{procs - len(reports)} process(es) did not report"}
    rows_per_s = sum(r["rows"] / r["seconds"] for r in reports)
    ms_per_call = [1000.0 * r["seconds"] / max(1, r["calls"]) for r in reports]
    return {"procs": procs, "ok": True, "rows_per_s": round(rows_per_s, 1),
            "calls": [r["calls"] for r in sorted(reports, key=lambda r: r["index"])],
            "ms_per_call_mean": round(sum(ms_per_call) / len(ms_per_call), 3), "rows_per_call": options["rows"],
            "gpu_ms_per_row": (round(gpu["gpu_util_mean"] / 100.0 * 1000.0 / rows_per_s, 4)
                               if gpu.get("gpu_util_mean") is not None and rows_per_s else None),
            "gpu_util_mean": gpu.get("gpu_util_mean"), "prepare_s_max": max(r["prepare_s"] for r in reports),
            "graphs": reports[0]["graphs"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", default="1,2,4,8", help="the process counts to measure, in turn")
    parser.add_argument("--seconds", type=float, default=15.0, help="each count's window")
    parser.add_argument("--rows", type=int, default=64, help="rows per call (the bundle's calls held 61-63 of 64)")
    parser.add_argument("--calls", type=int, default=64, help="distinct calls each process cycles through")
    parser.add_argument("--recipe", default="bert-base-random", choices=sorted(recipes.RECIPES))
    parser.add_argument("--weights", type=Path, help="a folder with config.json + model.safetensors (a built "
                        "encoder's version folder) instead of the recipe's weights")
    parser.add_argument("--targets", default=TARGETS, help="padding targets (comma-separated)")
    parser.add_argument("--buckets", default=BUCKETS, help="batch buckets (comma-separated)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--precision", default="fp16", choices=("fp16", "bf16", "fp32"))
    parser.add_argument("--prepare-timeout-s", type=float, default=240.0)
    parser.add_argument("--mps", action="store_true", help="start a private CUDA MPS daemon for the processes")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.procs.split(",")]
    if any(n < 1 for n in counts):
        parser.error(f"--procs: counts must be at least 1, not {args.procs}")
    with tempfile.TemporaryDirectory(prefix="sharing-") as tmp, contextlib.ExitStack() as stack:
        weights = args.weights or write_weights(args.recipe, Path(tmp))
        options = {"weights": str(weights), "device": args.device,
                   "precision": args.precision, "rows": args.rows, "calls": args.calls, "seconds": args.seconds,
                   "targets": [int(t) for t in args.targets.split(",")],
                   "buckets": [int(b) for b in args.buckets.split(",")], "prepare_timeout_s": args.prepare_timeout_s}
        if args.mps:
            import os

            from tritonbundle.gpu_sharing import MpsDaemon

            daemon = MpsDaemon()
            os.environ.update(daemon.start(die_with_parent=True))  # the spawned workers inherit it
            stack.callback(daemon.stop)
        failed = False
        for n in counts:
            line = {"weights": str(args.weights) if args.weights else args.recipe, "mps": args.mps, **measure(n, options)}
            print(json.dumps(line), flush=True)
            failed |= not line["ok"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
