"""What splitting the GPU between processes costs the encoder, with no server around it.

N processes, each one engine as one of the bundle's folded encoder instances holds it (CUDA graphs at
the bundle's padding targets and batch buckets, packing on, fp16), embed calls of ``--rows`` chat-like
rows back to back for ``--seconds``, all at once; for each N in ``--procs``, one JSON line: the rows per
second of all of them together, each process's calls, the mean call, and the GPU's utilisation over the
window, and the engine's own per-call statistics (GPU time by CUDA events, waiting, launches, computed
per useful token, as bench.md reports them for the bundle's encoder), and ``alone_gpu_ms_per_row``: what
the launches made take on the GPU alone, each shape's replay time as the engine timed it at start-up. Everything an instance does in the
server besides ``Engine.embed`` (reading requests, tokenizing, responding, Triton's hand-over) is left out.

Why: on the fifth H100 (docs/benchmarks.md, "A fifth H100") BERT-base's bundle reached 14,135 req/s
with the GPU 92-95 % busy and 7.1-8.1 ms of each 11.5-12.8 ms call waiting for it, where the ceiling
(one process, launches timed back to back) does 18,276 at batch 64: 0.064-0.066 ms of busy GPU per
request against 0.055. Read N = 8 against N = 1 of the same run (the ceiling's figure is an accounting
of full, unpacked launches timed back to back, which real mixed-length calls do not make): if one
process already spends ~0.064 ms of busy GPU per row, the cost is in how calls become launches; if the
GPU per row grows with N and eight processes stop near the bundle's saturated 15.1-15.9k, splitting the
GPU across processes costs it (fewer processes are the lever); if eight processes go well past that, the
loss is in the server's part of the call. ``alone_gpu_ms_per_row`` against ``busy_gpu_ms_per_row`` says
the same from each line alone: the first is what the launch mix costs, the gap what sharing adds.

Run THERE (the GPU machine: torch, transformers, safetensors and nvidia-ml-py are already installed);
the weights are the recipe's (BERT-base: random, seed 0), written to a temporary folder:

    python3 scripts/sharing_gpu_check.py --procs 1,2,4,8 --seconds 15 --mps --out $OUT/sharing.jsonl \\
        > $OUT/sharing.log 2>&1; cat $OUT/sharing.jsonl

``--mps`` starts a private CUDA MPS daemon for the processes (tritonbundle.gpu_sharing), as the bench
does under ``TRITONBUNDLE_GPU_SHARING=mps``. On a machine without a GPU ``--device cpu`` runs the same
loop eagerly (what the test does: it checks the plumbing, not a speed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import queue
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tritonbundle import recipes, traffic  # noqa: E402

#: The hand-picked BERT-base settings whose batch buckets the engines take (``--tuned``).
TUNED = Path(__file__).resolve().parent.parent / "docs" / "tuning" / "h200-handpicked" / "bert-base-fused8-t4-buckets18.json"
#: A process that has not reported this long after its window ended is stuck: the run fails.
GRACE_S = 30.0


def write_weights(recipe: str, folder: Path) -> Path:
    """``config.json`` + ``model.safetensors`` of ``recipe`` in ``folder`` (what the build stage writes)."""
    from safetensors.torch import save_file

    config, state = recipes.load_weights(recipe)
    save_file({k: v.detach().contiguous() for k, v in state.items()}, str(folder / recipes.WEIGHTS_FILE))
    (folder / recipes.CONFIG_FILE).write_text(json.dumps(config))
    return folder


def bench_targets(buckets: int = 16) -> list[int]:
    """The padding targets the bench plans for the bundle: the planner's edges over the bench's chat
    sample (10,000 requests, seed 0, clipped to 512), ``--sequence-buckets`` of them."""
    from tritonbundle.plan import choose_edges

    return list(choose_edges(traffic.synthetic("chat", n=10_000, seed=0).clipped(512).row_lengths(), buckets, 512))


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


def worker(index: int, options: dict[str, Any], go: Any, results: Any) -> None:
    """One instance's engine: prepare, say it is ready, wait for the start, embed calls back to back for
    the window, report what it did (the engine's own per-call statistics, as the served model keeps them)."""
    try:
        import gc

        from tritonbundle.runtimes.pytorch.engine import Engine
        from tritonbundle.runtimes.pytorch.launch import used_lengths
        from tritonbundle.runtimes.stats import new_stats

        t0 = time.monotonic()
        engine = Engine(options["weights"], device=options["device"], precision=options["precision"],
                        targets=options["targets"], batch_buckets=options["buckets"], packing=True,
                        max_sequence_length=512).prepare()
        work = calls(options["rows"], options["calls"], seed=index)
        for ids, masks in work[:2]:  # the first calls of a process pay for lazy set-up
            engine.embed(ids, masks, used_lengths(masks))
        gc.freeze()  # as the served model does after its start-up (runtimes/pytorch/model.py)
        results.put({"index": index, "ready": True, "graphs": len(engine.graphs), "graph_error": engine.graph_error,
                     "prepare_s": round(time.monotonic() - t0, 1)})
        if not go.wait(timeout=options["prepare_timeout_s"]):
            return
        stats = new_stats()
        done = rows = 0
        start = time.perf_counter()
        stop = time.monotonic() + options["seconds"]
        while time.monotonic() < stop:
            ids, masks = work[done % len(work)]
            engine.embed(ids, masks, used_lengths(masks), stats)
            done += 1
            rows += int(ids.shape[0])
        results.put({"index": index, "calls": done, "rows": rows, "seconds": time.perf_counter() - start,
                     "stats": {k: v for k, v in stats.items() if not k.startswith("h_")}})
    except Exception as e:  # noqa: BLE001 - reported to the parent, which fails the run
        results.put({"index": index, "error": f"{type(e).__name__}: {e}"})


def _collect(results: Any, workers: list[Any], want: str, count: int, deadline: float) -> tuple[dict[int, dict], str]:
    """Messages carrying ``want`` from ``count`` workers, until ``deadline``; the first error, a worker
    that exited without its message (a crash, a kill) or the deadline ends it early, and says so."""
    got: dict[int, dict[str, Any]] = {}
    while len(got) < count:
        with contextlib.suppress(queue.Empty):
            message = results.get(timeout=0.5)
            if "error" in message:
                return got, f"process {message['index']}: {message['error']}"
            if want in message:
                got[message["index"]] = message
                continue
        dead = [(i, w.exitcode) for i, w in enumerate(workers) if w.exitcode is not None and i not in got]
        if dead and results.empty():
            return got, "; ".join(f"process {i} exited with code {code} before it reported" for i, code in dead)
        if time.monotonic() > deadline:
            return got, f"{count - len(got)} process(es) did not report within the time allowed"
    return got, ""


def measure(procs: int, options: dict[str, Any], mps_servers: Any = None) -> dict[str, Any]:
    """``procs`` workers at once: their reports summed, and the GPU over the window (its first second
    left out: the utilisation NVML reports covers the second before each sample)."""
    from tritonbundle.measure.probes import GpuSampler

    ctx = mp.get_context("spawn")  # CUDA cannot be used in a forked child
    go, results = ctx.Event(), ctx.Queue()
    workers = [ctx.Process(target=worker, args=(i, options, go, results), daemon=True) for i in range(procs)]
    for w in workers:
        w.start()
    sampler = GpuSampler().start() if options["device"] == "cuda" else None
    line: dict[str, Any] = {"procs": procs, "ok": False}
    try:
        ready, error = _collect(results, workers, "ready", procs, time.monotonic() + options["prepare_timeout_s"])
        expected = len(options["targets"]) * len(options["buckets"]) if options["device"] == "cuda" else 0
        short = {i: r for i, r in ready.items() if r["graphs"] != expected}
        if not error and short:
            error = "; ".join(f"process {i} captured {r['graphs']} of {expected} CUDA graphs ({r['graph_error'] or 'no error'})"
                              for i, r in short.items())
        if error:
            return {**line, "error": error}
        go.set()
        t0 = time.monotonic()
        servers = mps_servers() if mps_servers is not None else None
        done, error = _collect(results, workers, "calls", procs, t0 + options["seconds"] + GRACE_S)
        if error:
            return {**line, "error": f"during the window: {error}"}
        if mps_servers is not None and not servers:
            return {**line, "error": "no MPS server ran: the processes did not reach the MPS daemon"}
        gpu = sampler.window(t0 + 1.0, t0 + options["seconds"]) if sampler is not None else {}
    finally:
        if sampler is not None:
            sampler.stop()
        for w in workers:
            w.join(timeout=10)
            if w.is_alive():
                w.kill()
    reports = [done[i] for i in sorted(done)]
    rows_per_s = sum(r["rows"] / r["seconds"] for r in reports)
    total = {k: sum(r["stats"][k] for r in reports) for k in reports[0]["stats"]}
    n_calls = max(1, sum(r["calls"] for r in reports))
    util = gpu.get("gpu_util_mean")
    return {**line, "ok": True, "rows_per_s": round(rows_per_s, 1), "calls": [r["calls"] for r in reports],
            "rows_per_call": options["rows"],
            "ms_per_call_mean": round(1000.0 * sum(r["seconds"] for r in reports) / n_calls, 3),
            "gpu_ms_per_call": round(1000.0 * total["gpu_s"] / n_calls, 3) if total.get("gpu_s") else None,
            "alone_gpu_ms_per_row": round(1000.0 * total["gpu_alone_s"] / max(1, sum(r["rows"] for r in reports)), 4)
            if total.get("gpu_alone_s") else None,
            "wait_ms_per_call": round(1000.0 * total["t_wait_s"] / n_calls, 3),
            "launches_per_call": round(total["launches"] / n_calls, 2),
            "computed_per_useful": round(total["computed_tokens"] / total["useful_tokens"], 3) if total["useful_tokens"] else None,
            "busy_gpu_ms_per_row": round(util / 100.0 * 1000.0 / rows_per_s, 4) if util is not None and rows_per_s else None,
            **{k: gpu.get(k) for k in ("gpu_util_mean", "gpu_samples", "gpu_sm_mhz_mean", "gpu_slowed_share")},
            "mps_servers": servers, "prepare_s_max": max(r["prepare_s"] for r in ready.values()),
            "graphs": expected}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", default="1,2,4,8", help="the process counts to measure, in turn")
    parser.add_argument("--seconds", type=float, default=15.0, help="each count's window")
    parser.add_argument("--rows", type=int, default=64, help="rows per call (the bundle's calls held 61-63 of 64)")
    parser.add_argument("--calls", type=int, default=64, help="distinct calls each process cycles through")
    parser.add_argument("--recipe", default="bert-base-random", choices=sorted(recipes.RECIPES))
    parser.add_argument("--weights", type=Path, help="a folder with config.json + model.safetensors (a built "
                        "encoder's version folder) instead of the recipe's weights")
    parser.add_argument("--targets", help="padding targets (comma-separated; default: the bench's 16 for the chat traffic)")
    parser.add_argument("--buckets", help="batch buckets (comma-separated; default: those of --tuned)")
    parser.add_argument("--tuned", type=Path, default=TUNED, help="the settings file whose batch buckets to take")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--precision", default="fp16", choices=("fp16", "bf16", "fp32"))
    parser.add_argument("--prepare-timeout-s", type=float, default=150.0,
                        help="how long the processes may take to be ready (8 x 288 CUDA graphs: ~30-35 s)")
    parser.add_argument("--mps", action="store_true", help="start a private CUDA MPS daemon for the processes")
    parser.add_argument("--out", type=Path, help="also append each JSON line to this file (the device tool "
                        "returns only the tail of the output, where the workers' warnings land too)")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.procs.split(",")]
    if any(n < 1 for n in counts):
        parser.error(f"--procs: counts must be at least 1, not {args.procs}")
    with tempfile.TemporaryDirectory(prefix="sharing-") as tmp, contextlib.ExitStack() as stack:
        weights = args.weights or write_weights(args.recipe, Path(tmp))
        options = {"weights": str(weights), "device": args.device,
                   "precision": args.precision, "rows": args.rows, "calls": args.calls, "seconds": args.seconds,
                   "targets": [int(t) for t in args.targets.split(",")] if args.targets else bench_targets(),
                   "buckets": ([int(b) for b in args.buckets.split(",")] if args.buckets else
                               json.loads(args.tuned.read_text())["winner"]["config"]["batch_buckets"]),
                   "prepare_timeout_s": args.prepare_timeout_s}
        servers = None
        if args.mps:
            import os

            from tritonbundle.gpu_sharing import MpsDaemon

            daemon = MpsDaemon()
            os.environ.update(daemon.start(die_with_parent=True))  # the spawned workers inherit it
            stack.callback(daemon.stop)
            servers = daemon.servers
        for n in counts:
            line = {"weights": str(args.weights) if args.weights else args.recipe, "mps": args.mps,
                    **measure(n, options, servers)}
            text = json.dumps(line)
            print(text, flush=True)
            if args.out is not None:
                with args.out.open("a") as f:
                    f.write(text + "\n")
            if not line["ok"]:
                return 1  # a larger count would fail the same way, or worse (out of memory): stop here
    return 0


if __name__ == "__main__":
    sys.exit(main())
