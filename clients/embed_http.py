"""Embed sentences over HTTP and rank them by similarity to a query.

Run a server first (`.venv/bin/tritonbundle serve`), then: `.venv/bin/python clients/embed_http.py`
"""

from __future__ import annotations

import sys

from tritonbundle.clients import HttpClient

DOCUMENTS = [
    "Triton serves models over HTTP and gRPC.",
    "The dynamic batcher groups requests into batches.",
    "Bananas are rich in potassium.",
]


def main(url: str = "127.0.0.1:8000") -> None:
    with HttpClient(url, model="minilm", timeout_s=5.0) as client:
        docs = client.embed(DOCUMENTS)
        (query,) = client.embed(["How does Triton batch requests?"])
    for score, text in sorted(zip(docs @ query, DOCUMENTS), reverse=True):
        print(f"{score:.3f}  {text}")


if __name__ == "__main__":
    main(*sys.argv[1:])
