"""Measure what the edge is for: the bodies that crash Triton, and what the edge costs.

    # The stack a Triton container survives: the smallest crashing depth of JSON nesting, bisected by
    # sending bodies straight to its HTTP port (not through the edge). Crashes the server on purpose:
    # run it against a throwaway stack whose triton container restarts (compose's restart policy).
    python docker/edge/measure.py crash --url http://TRITON_IP:8000 --container NAME [--shape in_request]

    # Latency of the extra hop: median of N calls of /v2/health/ready and of N small embeddings (HTTP and
    # gRPC, the bundle's clients), straight to Triton and through the edge.
    python docker/edge/measure.py hop --direct TRITON_IP:8000 --edge EDGE_IP:8080 \
        --direct-grpc TRITON_IP:8001 --edge-grpc EDGE_IP:8081 [--calls 200]

Shapes (each a request body of the given nesting depth n):
  unbalanced   "[" * n                                    (the JSON parser's recursion)
  in_request   a real request whose BYTES data is [[...["x"]...]] n deep  (parser + Triton's data walker)
  string       a real request with one JSON string of n bytes
The figures and the commands that produced them are in docker/README.md ("The edge").
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from urllib.parse import urlsplit

SHAPES: dict[str, Callable[[int], bytes]] = {
    "unbalanced": lambda n: b"[" * n,
    "in_request": lambda n: (b'{"inputs":[{"name":"TEXT","datatype":"BYTES","shape":[1,1],"data":'
                             + b"[" * n + b'"x"' + b"]" * n + b"}]}"),
    "string": lambda n: b'{"inputs":[{"name":"TEXT","datatype":"BYTES","shape":[1,1],"data":["' + b"a" * n + b'"]}]}',
}


def post(url: str, body: bytes, *, timeout_s: float = 60) -> tuple[str, str]:
    """POST a body to minilm's infer endpoint: (status or exception name, the answer's start)."""
    parts = urlsplit(url)
    try:
        conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout_s)
        conn.request("POST", "/v2/models/minilm/infer", body=body, headers={"Content-Type": "application/json"})
        answer = conn.getresponse()
        return str(answer.status), answer.read(160).decode(errors="replace")
    except (OSError, http.client.HTTPException) as e:
        return type(e).__name__, str(e)[:160]


def ready(url: str, *, timeout_s: float) -> bool:
    parts = urlsplit(url)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=3)
            conn.request("GET", "/v2/health/ready")
            if conn.getresponse().status == 200:
                return True
        except (OSError, http.client.HTTPException):
            pass
        time.sleep(0.5)
    return False


def restarts(container: str) -> str:
    return subprocess.run(["docker", "inspect", "-f", "{{.RestartCount}} {{.State.StartedAt}}", container],
                          capture_output=True, text=True, timeout=30, check=True).stdout.strip()


def crashed(url: str, container: str, body: bytes) -> tuple[bool, str]:
    """Send one body; True when the server died of it (then wait until it is back)."""
    before = restarts(container)
    status, text = post(url, body)
    time.sleep(1.5)
    died = restarts(container) != before or not ready(url, timeout_s=3)
    if died and not ready(url, timeout_s=240):
        sys.exit(f"{url} did not come back within 240 s")
    return died, f"{status} {text[:80]!r}"


def crash(args: argparse.Namespace) -> None:
    make = SHAPES[args.shape]
    lo, hi = args.low, args.high
    for n, expect in ((lo, False), (hi, True)):
        died, answer = crashed(args.url, args.container, make(n))
        print(f"{args.shape} n={n} body={len(make(n))} B: {'CRASH' if died else 'answered'} {answer}", flush=True)
        if died != expect:
            sys.exit(f"n={n} {'crashed' if died else 'did not crash'}: pick another --low/--high")
    while hi - lo > args.resolution:
        mid = (lo + hi) // 2
        died, answer = crashed(args.url, args.container, make(mid))
        print(f"{args.shape} n={mid} body={len(make(mid))} B: {'CRASH' if died else 'answered'} {answer}", flush=True)
        lo, hi = (lo, mid) if died else (mid, hi)
    print(json.dumps({"shape": args.shape, "survives_n": lo, "survives_body_bytes": len(make(lo)),
                      "crashes_n": hi, "crashes_body_bytes": len(make(hi))}))


def hop(args: argparse.Namespace) -> None:
    from tritonbundle.clients import GrpcClient, HttpClient

    def timed(client: HttpClient | GrpcClient) -> list[float]:
        with client:
            for _ in range(20):  # warm-up: connections, the models' first calls
                client.embed(["warm up"])
            out = []
            for i in range(args.calls):
                started = time.perf_counter()
                client.embed([f"A man is playing a guitar. {i}"])
                out.append((time.perf_counter() - started) * 1000)
            return out

    def ready_calls(address: str) -> list[float]:
        """GET /v2/health/ready on one keep-alive connection: the hop alone, no model in the way."""
        host, port = address.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        out = []
        for i in range(20 + args.calls):
            started = time.perf_counter()
            conn.request("GET", "/v2/health/ready")
            answer = conn.getresponse()
            answer.read()
            if i >= 20:
                out.append((time.perf_counter() - started) * 1000)
        conn.close()
        return out

    results: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for path, url in (("direct", args.direct), ("edge", args.edge)):
            results.setdefault(f"ready {path}", []).extend(ready_calls(url))
    pairs = [("http", HttpClient, args.direct, args.edge), ("grpc", GrpcClient, args.direct_grpc, args.edge_grpc)]
    for _ in range(args.rounds):  # interleaved rounds: drift in the machine's load hits both paths alike
        for protocol, cls, direct, edge in pairs:
            if not direct or not edge:
                continue
            for path, url in (("direct", direct), ("edge", edge)):
                results.setdefault(f"{protocol} {path}", []).extend(timed(cls(url, model="minilm", timeout_s=30)))
    summary = {}
    for name, ms in results.items():
        ms.sort()
        summary[name] = {"calls": len(ms), "median_ms": round(statistics.median(ms), 3),
                         "p90_ms": round(ms[int(0.9 * (len(ms) - 1))], 3)}
    for protocol in ("ready", "http", "grpc"):
        if f"{protocol} edge" in summary:
            summary[f"{protocol} extra median ms"] = round(
                summary[f"{protocol} edge"]["median_ms"] - summary[f"{protocol} direct"]["median_ms"], 3)
    print(json.dumps(summary, indent=2))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("crash", help="bisect the nesting depth that crashes a Triton (destructive)")
    c.add_argument("--url", required=True, help="Triton's own HTTP address, http://IP:8000 (not the edge)")
    c.add_argument("--container", required=True, help="its container (restart count tells a crash)")
    c.add_argument("--shape", choices=sorted(SHAPES), default="in_request")
    c.add_argument("--low", type=int, default=10_000, help="a depth (or string size) that does not crash")
    c.add_argument("--high", type=int, default=2_000_000, help="one that does")
    c.add_argument("--resolution", type=int, default=10_000)
    c.set_defaults(run=crash)
    h = sub.add_parser("hop", help="median latency of small embeddings, direct vs through the edge")
    h.add_argument("--direct", required=True, help="Triton's HTTP host:port")
    h.add_argument("--edge", required=True, help="the edge's HTTP host:port")
    h.add_argument("--direct-grpc", help="Triton's gRPC host:port")
    h.add_argument("--edge-grpc", help="the edge's gRPC host:port")
    h.add_argument("--calls", type=int, default=200, help="calls per path and round")
    h.add_argument("--rounds", type=int, default=1)
    h.set_defaults(run=hop)
    args = ap.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
