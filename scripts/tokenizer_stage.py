"""The tokenizer stage alone on the real tritonserver: where a call's time goes, and whether the Python
backend's work around ``execute()`` grows with the calls or with the requests.

Serves the example repository's tokenizer model by itself (one instance, its queue delay set per run),
sends one-text requests from ``--concurrency`` callers over gRPC for ``--seconds``, then prints, per
queue delay: requests/s, texts per call, the model's own split of ``execute()`` (read, tokenize,
respond: ``runtimes/stats.py``) and what Triton counts as the tokenizer's compute beyond it, per
request (each request counting its call's time). When that stays flat as calls gather more requests,
the work around a call is paid per request: fuller calls do not help, only fewer requests do (token
rows from the client, or tokenizing in the encoder); when it falls, it is paid per call.

    .venv/bin/python scripts/tokenizer_stage.py --seconds 8 --concurrency 32 --delays 0,2000
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from tritonbundle.measure import triton_metrics
from tritonbundle.measure.probes import thread_times
from tritonbundle.payloads import PayloadFactory
from tritonbundle.runtimes.stats import read_stats
from tritonbundle.served import ServedRepository
from tritonbundle.traffic import synthetic

ROOT = Path(__file__).resolve().parents[1]
MODEL = "minilm_tokenizer"


def repository(into: Path, delay_us: int, threads: int, instances: int = 1) -> Path:
    """The example tokenizer, alone: ``instances``, ``delay_us`` of queue delay, ``threads`` per call."""
    repo = into / "model_repository"
    shutil.copytree(ROOT / "model_repository" / MODEL, repo / MODEL, ignore=shutil.ignore_patterns("__pycache__"))
    config = repo / MODEL / "config.pbtxt"
    text = config.read_text()
    text = re.sub(r"count: \d+", f"count: {instances}", text)
    text = text.replace("dynamic_batching {", f"dynamic_batching {{\n  max_queue_delay_microseconds: {delay_us}", 1)
    text = re.sub(r'(key: "threads"\n  value \{\n    string_value: )"\d+"', rf'\1"{threads}"', text)
    config.write_text(text)
    return repo


async def drive(url: str, texts: list[str], concurrency: int, seconds: float) -> int:
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(url)
    answered = 0
    stop = time.monotonic() + seconds

    async def caller(start: int) -> None:
        nonlocal answered
        i = start
        while time.monotonic() < stop:
            tensor = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[texts[i % len(texts)].encode()]], dtype=object))
            await client.infer(MODEL, [tensor])
            answered += 1
            i += concurrency

    await asyncio.gather(*(caller(k) for k in range(concurrency)))
    await client.close()
    return answered


def measure(delay_us: int, threads: int, texts: list[str], concurrency: int, seconds: float, instances: int = 1) -> str:
    with tempfile.TemporaryDirectory(prefix="tokenizer-stage-") as tmp:
        folder = Path(tmp)
        with ServedRepository(repository(folder, delay_us, threads, instances), folder) as served:
            served.start(120)
            asyncio.run(drive(served.grpc_url, texts[:64], 4, 2.0))  # warm up
            pid = served.server.process.pid if served.server.process else 0
            before = (triton_metrics.scrape(served.server.metrics_url), read_stats(served.stats_dir, "tokenizer"))
            threads_before, t0 = thread_times(pid), time.monotonic()
            answered = asyncio.run(drive(served.grpc_url, texts, concurrency, seconds))
            wall = time.monotonic() - t0
            threads_after = thread_times(pid)
            time.sleep(0.4)  # the statistics file is written every 0.25 s
            after = (triton_metrics.scrape(served.server.metrics_url), read_stats(served.stats_dir, "tokenizer"))
    views = {v.model: v for v in triton_metrics.view(before[0], after[0])}
    triton = views[MODEL].to_json()
    stats = {k: v - before[1].get(k, 0.0) for k, v in after[1].items()}
    calls = stats["executes"]
    per_call = {k: 1000.0 * stats[f"t_{k}_s"] / calls for k in ("read", "tokenize", "respond", "execute")}
    # Triton counts each call's compute once per request it held; so does t_execute_by_request_s.
    outside = triton["compute_ms_per_request"] - 1000.0 * stats["t_execute_by_request_s"] / stats["requests"]
    per_request = stats["requests"] / calls
    # tritonserver's own threads (not the stub's): its CPU per answered request, all of it and its busiest
    # three threads' (Triton 2.51 handles every gRPC ModelInfer on two threads, src/grpc/grpc_server.cc)
    spent = sorted(((cpu - threads_before.get(k, (name, 0.0))[1], name) for k, (name, cpu) in threads_after.items()),
                   reverse=True)
    us = [(1e6 * v / max(1, answered), name) for v, name in spent]
    return (f"delay {delay_us:>5} us, threads {threads}, instances {instances}: {answered / wall:7.1f} req/s, {per_request:4.1f} requests/call; "
            "per call (ms): " + ", ".join(f"{k} {v:.3f}" for k, v in per_call.items())
            + f"; Triton's compute beyond execute() {outside:.3f} ms per request; queue "
            f"{triton['queue_ms_per_request']:.2f} ms; tritonserver CPU per request {sum(u for u, _ in us):.0f} us, "
            f"its busiest threads {', '.join(f'{u:.0f} ({name})' for u, name in us[:5])} us ({len(us)} threads)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--delays", default="0,2000", help="tokenizer queue delays to run, microseconds")
    parser.add_argument("--threads", default="1", help="tokenizer threads per call to run")
    parser.add_argument("--instances", default="1", help="tokenizer instances to run")
    parser.add_argument("--repeat", type=int, default=1, help="rounds over every setting, interleaved")
    args = parser.parse_args()
    factory = PayloadFactory(synthetic("chat", n=2000, seed=0), seed=0, max_batch=1)
    texts = [factory.text(factory.draw()[0]) for _ in range(2000)]
    for _ in range(args.repeat):
        for threads in (int(t) for t in args.threads.split(",")):
            for delay in (int(d) for d in args.delays.split(",")):
                for n in (int(i) for i in args.instances.split(",")):
                    print(measure(delay, threads, texts, args.concurrency, args.seconds, n), flush=True)


if __name__ == "__main__":
    main()
