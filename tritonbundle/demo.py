"""``make demo`` / ``tritonbundle demo``: the bundle's main job, end to end on this machine.

Export MiniLM to ONNX (checked against PyTorch), write the model repository, start a real
tritonserver, embed sentences over HTTP and over gRPC, print each sentence's nearest neighbour
with its cosine similarity, and stop the server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tritonbundle.build.stage import BuildOptions, build
from tritonbundle.clients import GrpcClient, HttpClient
from tritonbundle.log import LOG, step
from tritonbundle.server import ServerOptions, TritonServer

SENTENCES = (
    "A man is playing a guitar.",
    "The cat is sleeping on the sofa.",
    "How do I reset my password?",
    "Stock markets fell sharply today.",
    "Someone strums an acoustic guitar on stage.",
    "A kitten naps on the couch in the afternoon.",
    "I forgot my login credentials and cannot sign in.",
    "Shares dropped steeply at the close of trading.",
)


def nearest_neighbours(embeddings: np.ndarray[Any, Any]) -> list[tuple[int, float]]:
    """For each row, the index of the most similar other row and their cosine similarity."""
    unit = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    sims = unit @ unit.T
    np.fill_diagonal(sims, -np.inf)
    best = sims.argmax(axis=1)
    return [(int(j), float(sims[i, j])) for i, j in enumerate(best)]


def run_demo(*, manifest: Path, repository: Path, artifacts: Path, log_file: Path) -> int:
    build(BuildOptions(manifest=manifest, repository=repository, artifacts=artifacts))
    server = TritonServer(ServerOptions(repository, http_port=0, grpc_port=0, metrics_port=0, log_path=log_file))
    step(f"start {server.installation.description if server.installation else 'tritonserver'}")
    with server.start(ready_timeout_s=180):
        LOG.info("    ready: HTTP %s, gRPC %s (log: %s)", server.http_url, server.grpc_url, log_file)
        step(f"embed {len(SENTENCES)} sentences over HTTP")
        with HttpClient(server.http_url, model="minilm") as http:
            over_http = http.embed(SENTENCES)
        step(f"embed {len(SENTENCES)} sentences over gRPC")
        with GrpcClient(server.grpc_url, model="minilm") as grpc:
            over_grpc = grpc.embed(SENTENCES)
        diff = float(np.abs(over_http - over_grpc).max())
        LOG.info("    %d x %d embeddings; HTTP and gRPC agree to %.1e", *over_http.shape, diff)
        step("nearest neighbour of each sentence (cosine similarity)")
        width = max(len(s) for s in SENTENCES)
        for i, (j, sim) in enumerate(nearest_neighbours(over_http)):
            print(f"  {SENTENCES[i]:<{width}}  ->  {SENTENCES[j]:<{width}}  {sim:.3f}")
        step("stop the server")
    LOG.info("    stopped cleanly")
    return 0
