"""Measure what the edge is for: the bodies that crash Triton, and what the edge costs.

    # The stack a Triton container survives: the smallest crashing depth of JSON nesting, bisected by
    # sending bodies straight to its HTTP port (not through the edge). Crashes the server on purpose:
    # run it against a throwaway stack whose triton container restarts (compose's restart policy).
    python docker/edge/measure.py crash --url http://TRITON_IP:8000 --container NAME [--shape in_request]

    # Latency of the extra hop: median of N calls of /v2/health/ready and of N small embeddings (HTTP and
    # gRPC, the bundle's clients), straight to Triton and through the edge.
    python docker/edge/measure.py hop --direct TRITON_IP:8000 --edge EDGE_IP:8080 \
        --direct-grpc TRITON_IP:8001 --edge-grpc EDGE_IP:8081 [--calls 200]

    # Overload: greedy callers keep --concurrency requests each in flight (pausing --pause-s after a refusal)
    # from --sources client addresses for --duration-s, while a polite caller sends --polite-rate requests a
    # second, one at a time, and a prober times single requests (both in processes of their own); every
    # answer's status, kind and latency. Run it where several 127.0.0.x source addresses reach the edge as
    # distinct clients: natively, or in a container sharing the edge's network namespace (docker run
    # --network container:EDGE ...). Standard library only.
    python docker/edge/measure.py overload --url 127.0.0.1:8080 --sources 127.0.0.10*10 --concurrency 65 \
        --duration-s 10 [--polite-source 127.0.0.2 --polite-rate 4] [--probe-source 127.0.0.3 --probe-rate 20]

    # Half-sent requests: --connections connections from --sources, each sending a request line and a header
    # but never the blank line that ends the headers, held open; meanwhile another client (--other-source)
    # embeds. How many the edge kept, how fast it closed the rest, and what the other client got.
    python docker/edge/measure.py halfsent --url 127.0.0.1:8080 --sources 127.0.0.3 --connections 8200 \
        --other-source 127.0.0.4 [--other-requests 20]

Shapes (each a request body of the given nesting depth n):
  unbalanced   "[" * n                                    (the JSON parser's recursion)
  in_request   a real request whose BYTES data is [[...["x"]...]] n deep  (parser + Triton's data walker)
  string       a real request with one JSON string of n bytes
The figures and the commands that produced them are in docker/README.md ("The edge").
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import ipaddress
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
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


# -- overload and half-sent requests (standard library only: runs in any image with Python 3.10+) --------
SENTENCE = "A man is playing a guitar on the stage of a small club."


def sources(spec: str) -> list[str]:
    """"127.0.0.10" -> that address; "127.0.0.10*4" -> 127.0.0.10 .. 127.0.0.13."""
    first, _, count = spec.partition("*")
    start = ipaddress.ip_address(first)
    return [str(start + i) for i in range(int(count or 1))]


def infer_request(host: str, *, text: str = SENTENCE, model: str = "minilm") -> bytes:
    body = json.dumps({"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": [text]}]}).encode()
    head = (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 answer: status, headers (lower-case names), body (Content-Length or chunked)."""
    line = await reader.readline()
    if not line:
        raise ConnectionResetError("closed before an answer")
    status = int(line.split(b" ", 2)[1])
    headers: dict[str, str] = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            if size == 0:
                await reader.readline()
                break
            body += await reader.readexactly(size)
            await reader.readline()
    else:
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


def kind_of(status: int, body: bytes) -> str:
    """What an answer was: ok, a refusal by the edge (which limit), or Triton's own refusal or error."""
    if status == 200:
        return "ok"
    try:
        error = str(json.loads(body).get("error", ""))
    except ValueError:
        error = body[:80].decode(errors="replace")
    if error.startswith("too many requests in flight at the tritonbundle edge"):
        return f"{status} edge: requests per client or in all"
    if error.startswith("Triton is full"):
        return f"{status} edge: Triton full"
    if "tritonbundle edge" in error:
        return f"{status} edge: {error[:60]}"
    return f"{status} Triton: {error[:60]}"


def is_edge_refusal(kind: str) -> bool:
    """A refusal by the edge itself: one of its 503s for a limit, or a connection it closed at accept."""
    return kind.startswith("503 edge: requests") or kind == "503 edge: Triton full" or kind == "connection closed by the edge"


class Tally:
    """Outcomes and latencies (ms) of one caller role."""

    def __init__(self) -> None:
        self.ms: dict[str, list[float]] = {}
        self.retry_after: Counter[str] = Counter()

    def add(self, kind: str, ms: float) -> None:
        self.ms.setdefault(kind, []).append(ms)

    def summary(self) -> dict[str, object]:
        out: dict[str, object] = {"requests": sum(len(v) for v in self.ms.values())}
        ok = len(self.ms.get("ok", []))
        out["ok"] = ok
        out["ok_fraction"] = round(ok / out["requests"], 4) if out["requests"] else None  # type: ignore[operator]
        kinds = {}
        for kind, ms in sorted(self.ms.items()):
            ms = sorted(ms)
            kinds[kind] = {"count": len(ms), "median_ms": round(statistics.median(ms), 2),
                           "p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 2), "max_ms": round(ms[-1], 2)}
        out["kinds"] = kinds
        for name, chosen in (("refused", lambda kind: kind != "ok"), ("refused_by_the_edge", is_edge_refusal)):
            ms = sorted(m for kind, values in self.ms.items() if chosen(kind) for m in values)
            if ms:
                out[name] = {"count": len(ms), "median_ms": round(statistics.median(ms), 2),
                             "p90_ms": round(ms[int(0.9 * (len(ms) - 1))], 2),
                             "p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 2), "max_ms": round(ms[-1], 2)}
        if self.retry_after:
            out["retry_after"] = dict(self.retry_after)
        return out


async def caller(host: str, port: int, source: str, deadline: float, tally: Tally, *, pause_s: float,
                 interval_s: float = 0.0, timeout_s: float = 30.0) -> None:
    """Send requests one after the other on a keep-alive connection until the deadline; a refused request is
    followed by a pause; a closed connection is opened again. interval_s > 0: at most one request per interval."""
    request = infer_request(f"{host}:{port}")
    conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    while time.monotonic() < deadline:
        started = time.monotonic()
        sent = time.perf_counter()  # from the connect, when a new connection is needed
        try:
            if conn is None:
                conn = await asyncio.wait_for(asyncio.open_connection(host, port, local_addr=(source, 0)), timeout_s)
            reader, writer = conn
            writer.write(request)
            await writer.drain()
            status, headers, body = await asyncio.wait_for(read_answer(reader), timeout_s)
            kind = kind_of(status, body)
            if "retry-after" in headers:
                tally.retry_after[headers["retry-after"]] += 1
            if headers.get("connection", "").lower() == "close":
                writer.close()
                conn = None
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError, IndexError) as e:
            kind = "connection closed by the edge" if isinstance(e, (ConnectionError, asyncio.IncompleteReadError)) \
                else f"error: {type(e).__name__}"
            if conn is not None:
                conn[1].close()
            conn = None
        tally.add(kind, (time.perf_counter() - sent) * 1000)
        if kind != "ok" and pause_s:
            await asyncio.sleep(pause_s)
        if interval_s:
            await asyncio.sleep(max(0.0, interval_s - (time.monotonic() - started)))
    if conn is not None:
        conn[1].close()


async def overload_run(args: argparse.Namespace) -> dict[str, object]:
    raise_open_files_limit()
    host, port = args.url.rsplit(":", 1)
    # The polite caller and the prober run in processes of their own: their timings are not delayed by the
    # greedy callers' event loop (the prober measures what one refused request costs a client).
    others = {}
    for role, source, rate in (("polite", args.polite_source, args.polite_rate), ("probe", args.probe_source, args.probe_rate)):
        if source:
            others[role] = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "probe", "--url", args.url, "--source", source, "--rate", str(rate),
                "--duration-s", str(args.duration_s), "--callers", str(args.probe_callers if role == "probe" else 1),
                stdout=asyncio.subprocess.PIPE)
    deadline = time.monotonic() + args.duration_s
    greedy = Tally()
    started = time.monotonic()
    # The greedy callers yield the CPU to the polite caller and the prober (which keep their priority): on a
    # machine whose cores Triton keeps busy, a loaded load generator would otherwise time its own backlog.
    os.nice(args.greedy_nice)
    await asyncio.gather(*(caller(host, int(port), source, deadline, greedy, pause_s=args.pause_s)
                           for source in sources(args.sources) for _ in range(args.concurrency)))
    result: dict[str, object] = {"url": args.url, "sources": sources(args.sources), "concurrency_per_source": args.concurrency,
                                 "seconds": round(time.monotonic() - started, 2), "greedy": greedy.summary()}
    for role, process in others.items():
        out, _ = await process.communicate()
        result[role] = json.loads(out)
    return result


def overload(args: argparse.Namespace) -> None:
    print(json.dumps(asyncio.run(overload_run(args)), indent=2))


async def probe_run(args: argparse.Namespace) -> dict[str, object]:
    host, port = args.url.rsplit(":", 1)
    tally = Tally()
    deadline = time.monotonic() + args.duration_s
    await asyncio.gather(*(caller(host, int(port), args.source, deadline, tally, pause_s=0.0, interval_s=1 / args.rate)
                           for _ in range(args.callers)))
    return {"source": args.source, "rate": args.rate, "callers": args.callers, **tally.summary()}


def probe(args: argparse.Namespace) -> None:
    print(json.dumps(asyncio.run(probe_run(args))))


def raise_open_files_limit() -> None:
    """As many open files as the hard limit allows (one socket each; Docker 25+ sets a soft limit of 1024)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def halfsent_run(args: argparse.Namespace) -> dict[str, object]:
    raise_open_files_limit()
    host, port = args.url.rsplit(":", 1)
    partial = f"POST /v2/models/minilm/infer HTTP/1.1\r\nHost: {args.url}\r\nContent-Type: application/json\r\n".encode()
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    failed: Counter[str] = Counter()
    addresses = sources(args.sources)
    started = time.monotonic()

    async def open_one(i: int) -> None:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, int(port), local_addr=(addresses[i % len(addresses)], 0)), 10)
            writer.write(partial)
            await writer.drain()
            held.append((reader, writer))
        except (OSError, asyncio.TimeoutError) as e:
            failed[type(e).__name__] += 1

    for first in range(0, args.connections, 500):
        await asyncio.gather(*(open_one(i) for i in range(first, min(first + 500, args.connections))))
    opened_s = time.monotonic() - started

    async def still_open() -> int:
        async def probe(reader: asyncio.StreamReader) -> bool:
            try:
                return await asyncio.wait_for(reader.read(1), 0.05) != b""
            except asyncio.TimeoutError:
                return True
            except OSError:
                return False
        return sum(await asyncio.gather(*(probe(r) for r, _ in held)))

    await asyncio.sleep(0.5)
    kept_after_open = await still_open()
    # The other client, while the half-sent connections are held: one request at a time, a new connection each.
    other = Tally()
    request = infer_request(args.url)
    for _ in range(args.other_requests):
        sent = time.perf_counter()
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, int(port), local_addr=(args.other_source, 0)), 10)
            writer.write(request)
            await writer.drain()
            status, _, body = await asyncio.wait_for(read_answer(reader), 30)
            writer.close()
            kind = kind_of(status, body)
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError) as e:
            kind = f"error: {type(e).__name__}"
        other.add(kind, (time.perf_counter() - sent) * 1000)
    kept_after_other = await still_open()
    kept_at_hold = None
    if args.hold_s:
        await asyncio.sleep(max(0.0, args.hold_s - (time.monotonic() - started)))
        kept_at_hold = await still_open()
    for _, writer in held:
        writer.close()
    return {"url": args.url, "sources": addresses, "connections": args.connections,
            "opened": len(held), "open_failed": dict(failed), "seconds_to_open": round(opened_s, 2),
            "still_open_after_0_5_s": kept_after_open, "still_open_after_the_other_client": kept_after_other,
            **({f"still_open_after_{args.hold_s:g}_s": kept_at_hold} if args.hold_s else {}),
            "seconds": round(time.monotonic() - started, 2), "other": {"source": args.other_source, **other.summary()}}


def halfsent(args: argparse.Namespace) -> None:
    print(json.dumps(asyncio.run(halfsent_run(args)), indent=2))


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
    o = sub.add_parser("overload", help="greedy callers at a multiple of capacity, and a polite one")
    o.add_argument("--url", required=True, help="the edge's (or Triton's) HTTP host:port")
    o.add_argument("--sources", default="127.0.0.10", help="greedy client addresses: A or A*N (N from A on)")
    o.add_argument("--concurrency", type=int, default=65, help="requests each greedy address keeps in flight")
    o.add_argument("--pause-s", type=float, default=0.25, help="a greedy caller's pause after a refusal")
    o.add_argument("--duration-s", type=float, default=10)
    o.add_argument("--polite-source", default="", help="the polite caller's address (none: no polite caller)")
    o.add_argument("--polite-rate", type=float, default=4, help="its requests a second, one at a time")
    o.add_argument("--probe-source", default="", help="a prober's address (one of --sources: the greedy "
                   "client's refusals; another: the limits in all), timing requests from a process of its own")
    o.add_argument("--probe-rate", type=float, default=20, help="its requests a second, one at a time")
    o.add_argument("--probe-callers", type=int, default=4, help="probing callers (one request at a time each)")
    o.add_argument("--greedy-nice", type=int, default=10, help="niceness of the greedy callers' process")
    o.set_defaults(run=overload)
    p = sub.add_parser("probe", help="one caller: --rate requests a second, one at a time (overload runs it)")
    p.add_argument("--url", required=True)
    p.add_argument("--source", required=True)
    p.add_argument("--rate", type=float, default=4, help="requests a second of each caller, one at a time")
    p.add_argument("--callers", type=int, default=1)
    p.add_argument("--duration-s", type=float, default=10)
    p.set_defaults(run=probe)
    s = sub.add_parser("halfsent", help="connections that never finish their headers, and another client")
    s.add_argument("--url", required=True, help="the edge's HTTP host:port")
    s.add_argument("--sources", default="127.0.0.3", help="their client addresses: A or A*N")
    s.add_argument("--connections", type=int, default=8200)
    s.add_argument("--other-source", default="127.0.0.4")
    s.add_argument("--other-requests", type=int, default=20)
    s.add_argument("--hold-s", type=float, default=0, help="then count again this long after the first opened "
                   "(past the edge's 10 s header timeout: none should be left)")
    s.set_defaults(run=halfsent)
    args = ap.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
