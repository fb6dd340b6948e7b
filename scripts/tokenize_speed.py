"""The tokenizer's time per text on the traffic sample's texts: the whole Hugging Face tokenizer against
the plain-text path of ``runtimes/text.py`` (BERT's normalizer done in Python for printable ASCII),
both through ``tokenize()`` as the serving models call it, in batches of ``--batch`` texts, ``--repeat``
runs each, interleaved; prints the median and the range per tokenizer and thread count.

    .venv/bin/python scripts/tokenize_speed.py --threads 1,2,4 --batch 60 --repeat 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import numpy as np

from tritonbundle.payloads import ONE_TOKEN_WORDS
from tritonbundle.recipes import tokenizer_file
from tritonbundle.runtimes.text import NORMALIZER_ENV, load_tokenizer, tokenize
from tritonbundle.traffic import synthetic


def whole(path: str, max_length: int, threads: int) -> Any:
    """The tokenizer as serving loads it with the plain-text path off (``TRITONBUNDLE_TOKENIZER_NORMALIZER=rust``)."""
    before = os.environ.get(NORMALIZER_ENV)
    os.environ[NORMALIZER_ENV] = "rust"
    try:
        return load_tokenizer(path, max_length, threads)
    finally:
        os.environ.pop(NORMALIZER_ENV)
        if before is not None:
            os.environ[NORMALIZER_ENV] = before


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokenizer", default=None, help="tokenizer.json (default: MiniLM's, the example model)")
    p.add_argument("--texts", type=int, default=600)
    p.add_argument("--batch", type=int, default=60)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    path = args.tokenizer or str(tokenizer_file("minilm"))
    rng = np.random.default_rng(0)
    lengths = synthetic("chat", n=args.texts).lengths
    texts = [" ".join(rng.choice(ONE_TOKEN_WORDS, size=max(1, int(n) - 2))) for n in lengths]
    for threads in (int(t) for t in args.threads.split(",")):
        tokenizers = {"whole": whole(path, 512, threads), "plain-text": load_tokenizer(path, 512, threads)}
        runs: dict[str, list[float]] = {name: [] for name in tokenizers}
        for _ in range(args.repeat):
            for name, tok in tokenizers.items():
                t0 = time.perf_counter()
                for i in range(0, len(texts), args.batch):
                    chunk = texts[i : i + args.batch]
                    tokenize(tok, chunk, [(k, 1) for k in range(len(chunk))], (), 0)
                runs[name].append((time.perf_counter() - t0) / len(texts) * 1000)
        for name, got in runs.items():
            print(f"threads {threads}, {name:10s}: {statistics.median(got):.4f} ms per text "
                  f"[{min(got):.4f}-{max(got):.4f}] ({args.repeat} runs of {len(texts)} texts, batches of {args.batch})")


if __name__ == "__main__":
    main()
