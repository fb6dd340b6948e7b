"""The load generators' garbage collector: its pauses are counted per level, and what a worker's setup
made is frozen out of full collections (a 14-15 ms full collection in 2 of 16 levels sent requests 11-15
ms late on the development machine; with the freeze none over 1.6 ms: docs/benchmarks.md)."""

from __future__ import annotations

import asyncio
import gc
import socket
from pathlib import Path

from tritonbundle.measure.gcpause import GcPauses
from tritonbundle.measure.loadgen import _Worker

TRAFFIC = Path(__file__).resolve().parents[2] / "build" / "traffic" / "chat.jsonl"


def test_a_full_collection_is_counted_with_its_pause() -> None:
    pauses = GcPauses().install()
    try:
        pauses.take()
        garbage = [[i] for i in range(200_000)]  # something for the collector to walk
        gc.collect(2)
        seen = pauses.take()
        del garbage
    finally:
        pauses.uninstall()
    assert seen["gc_collections"] >= 1 and seen["gc_full"] >= 1, seen
    assert 0 < seen["gc_max_ms"] <= seen["gc_ms"], seen
    assert pauses.take() == {"gc_collections": 0, "gc_full": 0, "gc_max_ms": 0.0, "gc_ms": 0.0}


def test_a_workers_setup_freezes_what_it_made_and_its_close_lets_it_go() -> None:
    from aiohttp import web

    async def run() -> tuple[int, int, int]:
        app = web.Application()
        app.router.add_post("/embed", lambda _request: web.json_response({"ok": True}))
        runner = web.AppRunner(app)
        await runner.setup()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        site = web.TCPSite(runner, "127.0.0.1", port)
        await site.start()
        worker = _Worker()
        before = gc.get_freeze_count()
        try:
            await worker.setup({"kind": "http", "url": f"127.0.0.1:{port}", "traffic": str(TRAFFIC), "seed": 0,
                                "pool": 50})
            frozen = gc.get_freeze_count()
        finally:
            await worker.close()
            await runner.cleanup()
        return before, frozen, gc.get_freeze_count()

    before, frozen, after = asyncio.run(run())
    assert frozen > before + 10_000 and after == 0, (before, frozen, after)
