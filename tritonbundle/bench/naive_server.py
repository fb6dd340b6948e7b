"""The naive baseline: what a team writes on day one.

A plain aiohttp server; ``POST /embed {"text": "..."}`` tokenizes on the server, runs the recipe's
encoder (:func:`tritonbundle.recipes.encoder`, the same network every system runs) in PyTorch FP32
eagerly, one request at a time (the model call blocks the event loop, so requests are served
strictly one by one), and answers ``{"embedding": [...]}``. No batching, no padding buckets, no
graphs: naive by how it runs the model, not by running a different one.

    python -m tritonbundle.bench.naive_server --weights DIR --tokenizer tokenizer.json --port 8080
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any


def build_app(weights: Path, tokenizer_file: Path, device: str, max_length: int = 512) -> Any:
    import torch
    from aiohttp import web
    from tokenizers import Tokenizer

    from tritonbundle import recipes

    config, state = recipes.load_folder(weights)
    model = recipes.encoder(config, state, dtype=torch.float32, device=torch.device(device))
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_length)

    def embed(text: str) -> list[float]:
        ids = torch.tensor([tokenizer.encode(text).ids], dtype=torch.long, device=device)
        with torch.no_grad():
            vector = model(ids, torch.ones_like(ids))[0]
        return vector.cpu().tolist()  # type: ignore[no-any-return]

    embed("warm up")

    async def handle(request: web.Request) -> web.Response:
        if request.transport is None or request.transport.is_closing():
            # The client gave up (its deadline passed) while this request waited: skip the work.
            return web.Response(status=499)
        try:
            body = await request.json()
            text = body["text"]
            if not isinstance(text, str) or not text.strip():
                raise ValueError("'text' must be a non-empty string")
        except Exception as e:  # noqa: BLE001
            return web.json_response({"error": str(e)}, status=400)
        return web.json_response({"embedding": embed(text)})

    async def health(_request: web.Request) -> web.Response:
        return web.json_response({"ready": True})

    app = web.Application()
    app.router.add_post("/embed", handle)
    app.router.add_get("/health", health)
    return app


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--weights", type=Path, required=True, help="folder with config.json + model.safetensors")
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--ready-file", type=Path)
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from aiohttp import web

    app = build_app(args.weights, args.tokenizer, args.device)

    async def on_startup(_app: Any) -> None:
        if args.ready_file:
            args.ready_file.write_text(json.dumps({"url": f"{args.host}:{args.port}"}))

    app.on_startup.append(on_startup)
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
