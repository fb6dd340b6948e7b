"""What the OpenAI gateway adds per request: latency and its own CPU, against the same texts sent
straight to Triton over gRPC with the project's client.

Starts the CPU server on the committed repository (or --url of a running one) and `tritonbundle
gateway` in front of it, then sends --requests one-text requests of the chat traffic's lengths, one at a
time, alternating direct and through the gateway (OpenAI's Python client, base64 and float), and prints
p50/p99 of each path and the gateway process's CPU time per request.

    .venv/bin/python scripts/gateway_overhead.py --requests 400
    .venv/bin/python scripts/gateway_overhead.py --requests 400 --tenants   # keys, limits and metering on
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", help="gRPC address of a running Triton (default: start the CPU server here)")
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--tenants", action="store_true",
                    help="run the gateway as a shared service: a tenants file (one tenant with limits it never meets), "
                         "the usage log and the metrics port")
    args = ap.parse_args()

    import openai
    import psutil

    from tritonbundle import traffic
    from tritonbundle.clients import GrpcClient
    from tritonbundle.payloads import PayloadFactory
    from tritonbundle.proc import free_ports
    from tritonbundle.server import ServerOptions, TritonServer

    server = None
    if args.url is None:
        server = TritonServer(ServerOptions(ROOT / "model_repository", http_port=0, grpc_port=0, metrics_port=0))
        server.start(ready_timeout_s=180)
        args.url = server.grpc_url
    port, metrics_port = [p for p in free_ports(3) if p != args.port][:2]
    port = args.port or port
    argv = [sys.executable, "-m", "tritonbundle", "gateway", "--url", args.url, "--port", str(port)]
    key = "unused"
    work = tempfile.TemporaryDirectory(prefix="gateway-overhead-")
    if args.tenants:
        from tritonbundle.gateway.tenants import key_hash

        key = "tb-gateway-overhead-measurement-key"
        tenants = Path(work.name) / "tenants.yaml"
        tenants.write_text(f'tenants:\n  - name: bench\n    keys: ["{key_hash(key)}"]\n'
                           "    limits: {requests_per_s: 100000, tokens_per_min: 1000000000, concurrent_requests: 1000}\n")
        argv += ["--tenants", str(tenants), "--usage-log", str(Path(work.name) / "usage.jsonl"),
                 "--metrics-port", str(metrics_port)]
    gateway = subprocess.Popen(argv, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline or gateway.poll() is not None:
                    raise SystemExit("the gateway did not come up") from None
                time.sleep(0.2)
        factory = PayloadFactory(traffic.load(ROOT / "build" / "traffic" / "chat.jsonl"), seed=0, max_batch=1)
        texts = [factory.text(factory.draw()[0]) for _ in range(args.requests)]
        ai = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0)
        times: dict[str, list[float]] = {"direct gRPC": [], "gateway, float": [], "gateway, base64": []}
        cpu = psutil.Process(gateway.pid)
        with GrpcClient(args.url) as client:
            client.embed(texts[:1])
            ai.embeddings.create(model="minilm", input=texts[0])
            before = cpu.cpu_times()
            for i, text in enumerate(texts):
                t0 = time.perf_counter()
                client.embed([text])
                times["direct gRPC"].append((time.perf_counter() - t0) * 1000)
                encoding = "float" if i % 2 else "base64"
                t0 = time.perf_counter()
                ai.embeddings.create(model="minilm", input=text, encoding_format=encoding)  # type: ignore[arg-type]
                times[f"gateway, {encoding}"].append((time.perf_counter() - t0) * 1000)
            after = cpu.cpu_times()
        used_ms = (after.user + after.system - before.user - before.system) * 1000
        print(f"{args.requests} one-text requests of the chat traffic's lengths, sequential, Triton at {args.url}"
              + ("; gateway with tenants, usage log and metrics" if args.tenants else ""))
        for name, values in times.items():
            print(f"  {name:18s} p50 {statistics.median(values):7.2f} ms   p99 {_pct(values, 0.99):7.2f} ms   "
                  f"({len(values)} requests)")
        direct = statistics.median(times["direct gRPC"])
        through = statistics.median(times["gateway, float"] + times["gateway, base64"])
        print(f"  added by the gateway: {through - direct:.2f} ms at p50; its CPU {used_ms / args.requests:.2f} ms "
              "per request (the gateway process, both encodings)")
    finally:
        gateway.terminate()
        gateway.wait(timeout=20)
        work.cleanup()
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
