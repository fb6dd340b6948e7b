"""Classify texts with a text-classification model and rank passages with a text-pair model (a
cross-encoder), over gRPC.

Run a server with both first (`tritonbundle init classifier/model.onnx --name sentiment`, `tritonbundle
init reranker.onnx --task text-pair --tokenizer tokenizer.json`, `build`, `serve`), then:
`.venv/bin/python clients/classify_rerank.py [CLASSIFIER] [RERANKER] [GRPC_URL]`
"""

from __future__ import annotations

import sys

import numpy as np

from tritonbundle.clients import GrpcClient

REVIEWS = ["What a delight from start to finish.", "Two dull hours I will not get back."]
QUERY = "How does Triton batch requests?"
PASSAGES = [
    "Bananas are rich in potassium.",
    "The dynamic batcher groups requests into batches.",
    "Triton serves models over HTTP and gRPC.",
]


def main(classifier: str = "sentiment", reranker: str = "reranker", url: str = "127.0.0.1:8001") -> None:
    with GrpcClient(url, model=classifier, timeout_s=10.0) as client:
        for text, result in zip(REVIEWS, client.classify(REVIEWS)):
            print(f"{result.label:>10} {result.score:.3f}  {text}")
    with GrpcClient(url, model=reranker, timeout_s=10.0) as client:
        scores = client.rerank(QUERY, PASSAGES)  # one score per passage, in the passages' order
    print(f"query: {QUERY}")
    for i in np.argsort(-scores):
        print(f"{scores[i]:.3f}  {PASSAGES[i]}")


if __name__ == "__main__":
    main(*sys.argv[1:])
