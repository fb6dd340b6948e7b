"""Check, on a GPU, that an engine's lanes (``batches_in_flight``) run at once and answer right.

Run THERE (the GPU machine; the CPU tests cannot capture CUDA graphs). One engine with ``--lanes``
lanes and real CUDA graphs: every batch is first embedded alone on lane 0 (the reference), then one
thread per lane embeds the batches over and over for ``--seconds``, all at once. A result that differs
from its reference (cosine < 0.999) or a thread that does not finish within a bound is a failure; the
exit code says which (0 ok, 1 wrong answers, 2 a lane hung). Prints one JSON line with the figures.

    python3 scripts/lanes_gpu_check.py <version folder with config.json + model.safetensors> \\
        --lanes 2 --seconds 30
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tritonbundle.runtimes.pytorch.engine import Engine, stack_rows  # noqa: E402
from tritonbundle.runtimes.pytorch.launch import used_lengths  # noqa: E402


def batches(count: int, seed: int, max_rows: int, max_length: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Batches of 1..max_rows token rows of 2..max_length tokens (ids and masks, padded to the longest)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        rows = []
        for length in rng.integers(2, max_length + 1, size=int(rng.integers(1, max_rows + 1))):
            ids = rng.integers(1000, 20000, size=int(length))
            ids[0] = 101
            rows.append(ids.astype(np.int64))
        out.append(stack_rows(rows))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("weights", type=Path)
    parser.add_argument("--lanes", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--batches", type=int, default=24)
    parser.add_argument("--max-rows", type=int, default=128)
    parser.add_argument("--max-length", type=int, default=300)
    parser.add_argument("--targets", default="32,64,128,256,512")
    parser.add_argument("--buckets", default="1,2,4,8,16,32,64,128")
    parser.add_argument("--shared-capture-stream", action="store_true",
                        help="capture every lane's graphs on PyTorch's one default capture stream, as the engine "
                             "did before each lane captured on its own (engine.py, 'Lanes'): the A/B of that fix")
    args = parser.parse_args()
    if args.shared_capture_stream:
        import torch

        class SharedStreamGraph(torch.cuda.graph):  # type: ignore[misc,name-defined]
            def __init__(self, cuda_graph: object, pool: object = None, stream: object = None, **kw: object) -> None:
                super().__init__(cuda_graph, pool=pool, stream=None, **kw)

        torch.cuda.graph = SharedStreamGraph  # type: ignore[misc,assignment]
    t0 = time.monotonic()
    engine = Engine(args.weights, device="cuda", precision="fp16", targets=[int(t) for t in args.targets.split(",")],
                    batch_buckets=[int(b) for b in args.buckets.split(",")], max_sequence_length=512,
                    lanes=args.lanes).prepare()
    prepare_s = time.monotonic() - t0
    work = batches(args.batches, 0, args.max_rows, args.max_length)
    reference = [engine.embed(ids, masks, used_lengths(masks), lane=0) for ids, masks in work]
    done = [0] * args.lanes
    wrong = [0] * args.lanes
    worst = [1.0] * args.lanes
    stop = time.monotonic() + args.seconds

    def lane_loop(lane: int) -> None:
        i = lane  # the lanes start on different batches, so different shapes run at once
        while time.monotonic() < stop:
            ids, masks = work[i % len(work)]
            got = engine.embed(ids, masks, used_lengths(masks), lane=lane)
            want = reference[i % len(work)]
            cosine = float(np.min(np.sum(got * want, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))))
            worst[lane] = min(worst[lane], cosine)
            wrong[lane] += int(cosine < 0.999)
            done[lane] += 1
            i += 1

    threads = [threading.Thread(target=lane_loop, args=(lane,), daemon=True) for lane in range(args.lanes)]
    for thread in threads:
        thread.start()
    bound = stop + 30.0  # a batch takes milliseconds: a lane still busy 30 s after the end is hung
    for thread in threads:
        thread.join(timeout=max(0.1, bound - time.monotonic()))
    hung = [lane for lane, thread in enumerate(threads) if thread.is_alive()]
    rows = sum(int(ids.shape[0]) for ids, _ in work) / len(work)
    print(json.dumps({"lanes": args.lanes, "shared_capture_stream": args.shared_capture_stream, "graphs": len(engine.graphs), "prepare_s": round(prepare_s, 1),
                      "seconds": args.seconds, "batches_done": done, "wrong": wrong, "worst_cosine": worst,
                      "hung_lanes": hung, "mean_rows_per_batch": round(rows, 1),
                      "rows_per_s": round(sum(done) * rows / args.seconds, 1)}), flush=True)
    if hung:
        return 2
    return 1 if any(wrong) else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # a hung lane's thread would keep the interpreter alive
