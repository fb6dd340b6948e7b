"""The peer: an embedding server an engineer would deploy instead of a Triton bundle, at its best.

LitServe (Lightning AI, PyPI ``litserve``) around the same encoder (:func:`tritonbundle.recipes.encoder`)
with its documented performance settings: dynamic batching (``max_batch_size``, ``batch_timeout``),
several model workers on the GPU (``workers_per_device``), several API server processes
(``num_api_servers``) and the ZMQ queue (``fast_queue=True``). The model runs in FP16 on CUDA with
scaled-dot-product attention; each batch is tokenized in one call of the fast tokenizer and padded
to the batch's longest text. cuDNN attention is turned off: with torch 2.11 on an H200 it plans
every new shape (80-90 ms for a BERT-base batch at a new padded length, 9-10 ms when the shape
repeats), which dynamic padding hits on most batches. Warmed up at every length bucket before it
reports healthy.

    python -m tritonbundle.bench.peer_server --weights DIR --tokenizer tokenizer.json --device cuda --port 8090

``POST /predict {"text": "..."}`` -> ``{"embedding": [...]}``.
"""

# No ``from __future__ import annotations``: LitServe reads decode_request's annotation at run time to
# build its FastAPI endpoint, and a string would not do.
import argparse
import os
from pathlib import Path
from typing import Any

SETTINGS = {"max_batch_size": 64, "batch_timeout": 0.005, "workers_per_device": 2, "num_api_servers": 4,
            "fast_queue": True}

try:  # the orchestrator imports SETTINGS without LitServe; the server process has it
    from litserve import LitAPI as _LitAPI
except ImportError:  # pragma: no cover - the benchmark's orchestrator on a machine without litserve
    _LitAPI = object


class EmbeddingAPI(_LitAPI):  # type: ignore[misc]
    """The encoder behind LitServe (module level: LitServe starts its workers with spawn and pickles this)."""

    def __init__(self, weights: Path, tokenizer_file: Path, device: str, max_batch_size: int, batch_timeout: float) -> None:
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout)
        self.weights, self.tokenizer_file, self.device_kind = weights, tokenizer_file, device
        self.warmup_batch = min(8, max_batch_size)

    def setup(self, device_name: str) -> None:
        import torch
        from tokenizers import Tokenizer

        from tritonbundle import recipes

        self.torch = torch
        self.device = torch.device(device_name if self.device_kind == "cuda" else "cpu")
        dtype = torch.float16 if self.device.type == "cuda" else torch.float32
        if self.device.type == "cuda":
            torch.backends.cuda.enable_cudnn_sdp(False)
        self.model = recipes.encoder(*recipes.load_folder(self.weights), dtype=dtype, device=self.device)
        self.tokenizer = Tokenizer.from_file(str(self.tokenizer_file))
        self.tokenizer.enable_truncation(max_length=512)
        self.tokenizer.enable_padding(pad_id=0)  # to the batch's longest text
        for length in (8, 32, 64, 128, 256, 512):  # warm-up: kernels for every length range
            self.predict(["word " * (length - 2)] * self.warmup_batch)

    def decode_request(self, request: dict[str, Any]) -> str:
        return str(request["text"])

    def batch(self, inputs: list[str]) -> list[str]:
        return inputs

    def predict(self, texts: list[str]) -> Any:
        torch = self.torch
        encodings = self.tokenizer.encode_batch_fast(texts)
        ids = torch.tensor([e.ids for e in encodings], dtype=torch.long)
        mask = torch.tensor([e.attention_mask for e in encodings], dtype=torch.long)
        with torch.inference_mode():
            out = self.model(ids.to(self.device, non_blocking=True), mask.to(self.device, non_blocking=True))
        return out.float().cpu().numpy()

    def unbatch(self, output: Any) -> list[Any]:
        return list(output)

    def encode_response(self, vector: Any) -> dict[str, Any]:
        return {"embedding": vector.tolist()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--weights", type=Path, required=True, help="folder with config.json + model.safetensors")
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--port", type=int, default=8090)
    for key, value in SETTINGS.items():
        ap.add_argument(f"--{key.replace('_', '-')}", type=type(value) if not isinstance(value, bool) else int, default=value)
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import litserve as ls

    api = EmbeddingAPI(args.weights, args.tokenizer, args.device, args.max_batch_size, args.batch_timeout)
    server = ls.LitServer(api, accelerator="cuda" if args.device == "cuda" else "cpu", devices=1,
                          workers_per_device=args.workers_per_device, fast_queue=bool(args.fast_queue), timeout=30)
    server.run(host="127.0.0.1", port=args.port, num_api_servers=args.num_api_servers, generate_client_file=False,
               log_level="warning")


if __name__ == "__main__":
    main()
