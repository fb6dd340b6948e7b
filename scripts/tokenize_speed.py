"""The tokenizer's time per text: the whole Hugging Face tokenizer, the plain-text path of
``runtimes/text.py`` (BERT's normalizer done in Python for printable ASCII) with the Rust WordPiece, and
that path with the word cache of ``runtimes/wordpiece.py`` (the default), all through ``tokenize()`` as
the serving models call it, in batches of ``--batch`` texts, ``--repeat`` runs each, interleaved;
prints the median and the range per tokenizer and thread count. The first run of each tokenizer is
also printed apart: for the word cache it is the cold one (every word new).

``--words bench``: the bench's texts (one-token words, ``payloads.ONE_TOKEN_WORDS``: a warm cache at
once). ``--words zipf``: words of the tokenizer's vocabulary drawn by a Zipf law (s = 1.2), 30 % of
them glued to another word (rare compounds WordPiece splits), 10 % capitalised, 10 % with punctuation.

    .venv/bin/python scripts/tokenize_speed.py --threads 1,2,4 --batch 60 --repeat 5 --words zipf

``--spans call`` tokenizes each batch as one span, as the encoder that tokenizes its own texts does
(``tokenize_in_encoder``); the default, a span per text, is the tokenizer model's one-text requests.
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
from tritonbundle.runtimes.text import NORMALIZER_ENV, WORDS_ENV, load_tokenizer, tokenize
from tritonbundle.traffic import synthetic


def loaded(path: str, threads: int, env: dict[str, str]) -> Any:
    """The tokenizer as serving loads it, with ``env`` (the A/B switches) set while it loads."""
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return load_tokenizer(path, 512, threads)
    finally:
        for k, v in before.items():
            os.environ.pop(k)
            if v is not None:
                os.environ[k] = v


def texts_of(kind: str, count: int, path: str) -> list[str]:
    rng = np.random.default_rng(0)
    lengths = synthetic("chat", n=count).lengths
    if kind == "bench":
        return [" ".join(rng.choice(ONE_TOKEN_WORDS, size=max(1, int(n) - 2))) for n in lengths]
    from tokenizers import Tokenizer

    vocab = sorted(w for w in Tokenizer.from_file(path).get_vocab() if w.isascii() and w.isalpha())
    vocab = [vocab[i] for i in rng.permutation(len(vocab))]

    def word() -> str:
        w = vocab[int(rng.zipf(1.2)) % len(vocab)]
        if rng.random() < 0.3:
            w += vocab[int(rng.integers(len(vocab)))]
        if rng.random() < 0.1:
            w = w.capitalize()
        return w + (str(rng.choice(list(",.?!;:"))) if rng.random() < 0.1 else "")

    return [" ".join(word() for _ in range(max(1, int(n) // 2))) for n in lengths]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokenizer", default=None, help="tokenizer.json (default: MiniLM's, the example model)")
    p.add_argument("--texts", type=int, default=600)
    p.add_argument("--batch", type=int, default=60)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--words", choices=("bench", "zipf"), default="bench")
    p.add_argument("--spans", choices=("request", "call"), default="request",
                   help="request: a request per text (the tokenizer model); call: the batch's texts in one span "
                        "(the folded encoder, tokenize_in_encoder)")
    args = p.parse_args()
    path = args.tokenizer or str(tokenizer_file("minilm"))
    texts = texts_of(args.words, args.texts, path)
    for threads in (int(t) for t in args.threads.split(",")):
        tokenizers = {"whole": loaded(path, threads, {NORMALIZER_ENV: "rust"}),
                      "plain-text": loaded(path, threads, {WORDS_ENV: "rust"}),
                      "word cache": loaded(path, threads, {})}
        runs: dict[str, list[float]] = {name: [] for name in tokenizers}
        for _ in range(args.repeat):
            for name, tok in tokenizers.items():
                t0 = time.perf_counter()
                for i in range(0, len(texts), args.batch):
                    chunk = texts[i : i + args.batch]
                    spans = [(0, len(chunk))] if args.spans == "call" else [(k, 1) for k in range(len(chunk))]
                    tokenize(tok, chunk, spans, (), 0)
                runs[name].append((time.perf_counter() - t0) / len(texts) * 1000)
        for name, got in runs.items():
            print(f"threads {threads}, {name:10s}: {statistics.median(got):.4f} ms per text "
                  f"[{min(got):.4f}-{max(got):.4f}], first run {got[0]:.4f} ({args.repeat} runs of {len(texts)} "
                  f"{args.words} texts, batches of {args.batch}, a span per {args.spans})")


if __name__ == "__main__":
    main()
