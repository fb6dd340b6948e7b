"""Correctness before speed: every server's answers are checked against the FP32 reference first."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from tritonbundle.bench.phase import Context
from tritonbundle.bench.records import AnswersCheck
from tritonbundle.bench.workspace import Built
from tritonbundle.errors import TritonBundleError

MIN_COSINE = 0.99


def reference(texts: list[str], built: Built, tokenizer: Any) -> Any:
    """The texts' embeddings from the same engine in FP32 on the CPU (eager, no batching tricks)."""
    from tritonbundle.runtimes.pytorch.engine import Engine, stack_rows

    rows = [np.array(tokenizer.encode(t).ids, dtype=np.int64) for t in texts]
    engine = Engine(built.version_dir, device="cpu", precision="fp32", targets=built.plan.padding_targets or (512,),
                    cuda_graphs=False)
    ids, masks = stack_rows(rows)
    return engine.embed(ids, masks, np.array([len(r) for r in rows]))


def check_answers(system: str, got: Any, expected: Any) -> AnswersCheck:
    """Cosine of each answer with the FP32 reference; raise when a system computes something else."""
    got = np.asarray(got, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if got.shape != expected.shape:
        raise TritonBundleError(f"{system} answered shape {list(got.shape)}, expected {list(expected.shape)}")
    cosine = (got * expected).sum(axis=1) / np.maximum(np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1), 1e-12)
    worst = float(np.nan_to_num(cosine, nan=-1.0).min())
    if not worst >= MIN_COSINE:
        raise TritonBundleError(f"{system} answers differ from the FP32 reference (min cosine {worst:.4f} < {MIN_COSINE}): "
                                "its throughput would mean nothing")
    return AnswersCheck(texts=int(got.shape[0]), min_cosine=worst)


def check_answers_at_once(system: str, embed: Callable[[list[str]], Any], texts: list[str], expected: Any, *,
                          callers: int = 16, rounds: int = 8) -> AnswersCheck:
    """:func:`check_answers` for one text per request from ``callers`` threads at once, every text
    ``rounds`` times: batches formed from concurrent requests, several in flight where the server allows
    it (``batches_in_flight``, whose lanes once shared a cuBLAS workspace and answered wrong only then)."""
    order = [i for _ in range(rounds) for i in range(len(texts))]
    with ThreadPoolExecutor(callers) as pool:
        got = list(pool.map(lambda i: np.asarray(embed([texts[i]]))[0], order))
    result = check_answers(f"{system} (requests at once)", np.stack(got), np.asarray(expected)[order])
    return dataclasses.replace(result, callers=callers)


def references(ctx: Context, built: Built) -> tuple[list[str], Any]:
    """A few texts from the traffic sample and their FP32 reference embeddings (computed once per model)."""
    key = built.spec.name
    if key not in ctx.references:
        from tokenizers import Tokenizer

        from tritonbundle.measure.loadgen import text_pool

        texts = [t for _, t in text_pool(str(ctx.traffic_path), seed=12345, size=8)]
        tok = Tokenizer.from_file(str(ctx.tokenizer))
        tok.no_padding()
        tok.enable_truncation(max_length=512)
        ctx.references[key] = (texts, reference(texts, built, tok))
    return ctx.references[key]
