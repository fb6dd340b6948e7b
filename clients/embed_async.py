"""Many concurrent requests from one asyncio task over gRPC; Triton batches them server-side.

Run a server first (`.venv/bin/tritonbundle serve`), then: `.venv/bin/python clients/embed_async.py`
"""

from __future__ import annotations

import asyncio
import sys
import time

from tritonbundle.clients import AsyncGrpcClient


async def main(url: str = "127.0.0.1:8001", n: int = 200) -> None:
    async with AsyncGrpcClient(url, model="minilm", timeout_s=10.0) as client:
        start = time.perf_counter()
        results = await asyncio.gather(*(client.embed([f"request number {i}"]) for i in range(n)))
        elapsed = time.perf_counter() - start
    print(f"{len(results)} requests in {elapsed:.2f} s ({len(results) / elapsed:.0f} req/s)")


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
