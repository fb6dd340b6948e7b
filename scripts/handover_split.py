"""The Python backend's hand-over around a call, as Triton counts it, for a model that does next to
nothing: the real tritonserver serving ``identity`` (``scripts/loadgen_cost.py``: 16 floats back as they
came, one instance, batched to 64, each batch held ``--sleep-ms`` so that calls fill up), driven by the
bench's own load generator at ``--rate`` for ``--seconds`` with each ``--senders`` in turn, ``--rounds``
times. Prints, per run, Triton's parts of a call (``measure/triton_metrics.py``): staging the requests
(compute_input), the round trip to the stub less the sleep (compute_infer: the stub's side with an
execute() of next to nothing), and the responses (compute_output), per call and per request.

Which part is paid per call and which per request, and whether the responses' part depends on the
frontend (gRPC or HTTP), is what the H200/H100 reports cannot separate: there the calls' size follows
the load.

    .venv/bin/python scripts/handover_split.py --rate 2000 --sleep-ms 20 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from loadgen_cost import identity_repository

from tritonbundle.measure import triton_metrics
from tritonbundle.measure.loadgen import LoadPool
from tritonbundle.measure.wire import SENDER_ENV, SENDERS
from tritonbundle.served import ServedRepository
from tritonbundle.traffic import dump, synthetic


def measure(repository: Path, folder: Path, traffic: Path, sender: str, rate: float, seconds: float, sleep_ms: float,
            seed: int) -> dict[str, float]:
    """One run: Triton's view of ``identity`` over the measured window, its parts per call (ms)."""
    os.environ[SENDER_ENV] = sender
    with ServedRepository(repository, folder) as served:
        served.start(120)
        with LoadPool(1, folder, sender) as pool:
            pool.setup(kind="grpc", url=served.grpc_url, http_url=served.server.http_url, model="identity",
                       traffic=str(traffic), seed=seed, timeout_s=10.0, pool=500)
            pool.step(rate, warmup_s=0.0, window_s=3.0, grace_s=3.0, seed=seed)
            before = triton_metrics.scrape(served.server.metrics_url)
            step = pool.step(rate, warmup_s=0.0, window_s=seconds, grace_s=5.0, seed=seed)
            after = triton_metrics.scrape(served.server.metrics_url)
    (view,) = [v for v in triton_metrics.view(before, after) if v.model == "identity"]
    per_call = {"requests": view.avg_batch_size, "staging": view.compute_input_ms_per_request,
                "stub": view.compute_ms_per_request - sleep_ms, "responses": view.compute_output_ms_per_request}
    n = view.avg_batch_size
    print(f"{sender:6s}: {step.sent / seconds:6.0f} req/s, {step.failed} failed, {n:5.1f} requests a call; per call "
          f"(ms): staging {per_call['staging']:.3f}, the stub's side {per_call['stub']:.3f}, responses "
          f"{per_call['responses']:.3f}; per request (us): {1000 * per_call['staging'] / n:5.1f}, "
          f"{1000 * per_call['stub'] / n:5.1f}, {1000 * per_call['responses'] / n:5.1f}", flush=True)
    return per_call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=2000.0, help="offered requests per second")
    parser.add_argument("--sleep-ms", type=float, default=20.0, help="each batch held this long")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--senders", default="wire,http", help=f"comma-separated, of {', '.join(SENDERS)}")
    args = parser.parse_args()
    senders = args.senders.split(",")
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in senders}
    with tempfile.TemporaryDirectory(prefix="handover-split-") as tmp:
        folder = Path(tmp)
        traffic = dump(synthetic("fixed", fixed_tokens=16), folder / "traffic.jsonl")
        repository = identity_repository(folder, args.sleep_ms / 1000.0, max_batch=64, instances=1)
        for r in range(args.rounds):
            for sender in senders:
                runs[sender].append(measure(repository, folder / f"run-{r}-{sender}", traffic, sender, args.rate,
                                            args.seconds, args.sleep_ms, r))
    for sender, got in runs.items():
        parts = {k: [g[k] / g["requests"] for g in got] for k in ("staging", "stub", "responses")}
        print(f"{sender}: per request (us), median [range] over {len(got)} runs: " + ", ".join(
            f"{k} {1000 * statistics.median(v):.1f} [{1000 * min(v):.1f}-{1000 * max(v):.1f}]" for k, v in parts.items()))


if __name__ == "__main__":
    main()
