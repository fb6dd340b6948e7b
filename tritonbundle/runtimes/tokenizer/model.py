"""Triton Python-backend model: text in, ``input_ids``/``attention_mask`` (and ``token_type_ids`` when
the config has a third token output) out, and ``tokens`` (each row's token count) when the config has it. With ``pairs`` it reads ``QUERY`` and ``TEXT`` and tokenizes each
row's two texts together (a text-pair model).

Settings: :class:`tritonbundle.contract.TokenizerParameters` in the config's ``parameters``:
  tokenizer_file     tokenizer.json in the version directory (Hugging Face ``tokenizers`` format)
  max_length         longer texts are truncated to this many tokens (documented behaviour)
  max_text_bytes     longer texts are refused (INVALID_ARG) before tokenizing: a guard against
                     multi-megabyte bodies, far beyond what truncation to max_length keeps anyway.
                     Texts within it are cut (runtimes.text.cut) to what max_length tokens can hold before
                     tokenizing (a megabyte took about a second of a core to tokenize, only to be
                     truncated to max_length tokens)
  padding_targets    each request is padded to the smallest target that holds its longest text
                     (:func:`tritonbundle.contract.pad_length`), so that same-shape requests meet in
                     the dynamic batcher (TensorRT profiles). Empty: pad to the request's own longest
                     text (ragged policy).
Bad input (empty text, bytes that are not UTF-8, wrong rank) gets an INVALID_ARG error naming the
problem and the position of the text in the request.

With ``$TRITONBUNDLE_STATS_DIR`` set, each instance counts its calls (texts, time reading, tokenizing
and answering, and a histogram of each call's time) for the benchmark (:mod:`tritonbundle.runtimes.stats`).
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
if (_HERE / "tritonbundle").is_dir() and sys.path[:1] != [str(_HERE)]:
    sys.path.insert(0, str(_HERE))  # the package modules the build copied next to this file


from tritonbundle.contract import (  # noqa: E402
    QUERY_INPUT,
    TEXT_INPUT,
    TOKENS_OUTPUT,
    TokenizerParameters,
    shape_problem,
    token_counts,
)
from tritonbundle.runtimes.stacks import dump_stacks_on_signal  # noqa: E402
from tritonbundle.runtimes.stats import new_stats, observe, writer_for  # noqa: E402
from tritonbundle.runtimes.text import Row, TextError, load_tokenizer, pairs, read_texts, tokenize  # noqa: E402

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported outside Triton (tests, type checks)
    pb_utils = None


def _error(message: str) -> Any:
    code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
    if code is None:
        return pb_utils.TritonError(message)
    return pb_utils.TritonError(message, code)


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        dump_stacks_on_signal()  # a stalled model can be read: runtimes/stacks.py
        config = json.loads(args["model_config"])
        params = TokenizerParameters.from_config(config)
        version_dir = Path(args["model_repository"]) / args["model_version"]
        self.max_length = params.max_length
        self.max_text_bytes = params.max_text_bytes
        self.targets = params.padding_targets
        self.tokenizer = load_tokenizer(str(version_dir / params.tokenizer_file), self.max_length, params.threads)
        self.pad_id = params.pad_id
        self.pairs = params.pairs
        self.max_batch = int(config.get("max_batch_size", 0)) or (1 << 30)
        names = [o["name"] for o in config["output"]]
        self.counts = TOKENS_OUTPUT in names
        self.outputs = [n for n in names if n != TOKENS_OUTPUT]  # the encoder's inputs, in order
        self.stats = new_stats("tokenizer")
        name = config.get("name", "tokenizer")
        self.writer = writer_for(name, self.stats, {"model": name, "instance": args.get("model_instance_name", ""),
                                                    "threads": params.threads}, kind="tokenizer")
        gc.freeze()  # what initialize() loaded lives as long as the process: keep full collections off it

    def _read(self, request: Any, name: str) -> list[str]:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if tensor is None:
            raise TextError(f"input {name} is missing")
        problem = shape_problem(name, tensor.shape(), (1,), max_batch=self.max_batch)
        if problem:  # from the tensor's header: its data is never read
            raise TextError(problem)
        return read_texts(tensor.as_numpy(), name, self.max_text_bytes, self.max_length)

    def _texts(self, request: Any) -> list[Row]:
        if self.pairs:
            return list(pairs(self._read(request, QUERY_INPUT), self._read(request, TEXT_INPUT), QUERY_INPUT, TEXT_INPUT))
        return list(self._read(request, TEXT_INPUT))

    def execute(self, requests: list[Any]) -> list[Any]:
        """One tokenizer call for every text of every request in the dynamic batch."""
        t0 = time.perf_counter()
        responses: list[Any] = [None] * len(requests)
        texts: list[Row] = []
        good: list[tuple[int, int, int]] = []  # (request, first text, number of texts)
        for index, request in enumerate(requests):
            try:
                mine = self._texts(request)
            except TextError as e:
                responses[index] = pb_utils.InferenceResponse(output_tensors=[], error=_error(str(e)))
                continue
            good.append((index, len(texts), len(mine)))
            texts.extend(mine)
        t1 = time.perf_counter()
        tokens = tokenize(self.tokenizer, texts, [(s, n) for _, s, n in good], self.targets, self.pad_id,
                          type_ids=len(self.outputs) > 2)
        t2 = time.perf_counter()
        for (index, _, _), arrays in zip(good, tokens):
            tensors = [pb_utils.Tensor(name, a) for name, a in zip(self.outputs, arrays)]
            if self.counts:
                tensors.append(pb_utils.Tensor(TOKENS_OUTPUT, token_counts(arrays[1])))
            responses[index] = pb_utils.InferenceResponse(output_tensors=tensors)
        self._count(len(requests), len(requests) - len(good), len(texts), t0, t1, t2)
        return responses

    def _count(self, requests: int, errors: int, texts: int, t0: float, t1: float, t2: float) -> None:
        """One call's statistics: read until ``t1``, tokenized until ``t2``, answered until now."""
        t3 = time.perf_counter()
        stats = self.stats
        stats["executes"] += 1
        stats["requests"] += requests
        stats["errors"] += errors
        stats["texts"] += texts
        stats["t_read_s"] += t1 - t0
        stats["t_tokenize_s"] += t2 - t1
        stats["t_respond_s"] += t3 - t2
        stats["t_execute_s"] += t3 - t0
        stats["t_execute_by_request_s"] += requests * (t3 - t0)
        observe(stats, "execute_ms", 1000.0 * (t3 - t0))

    def finalize(self) -> None:
        if self.writer is not None:
            self.writer.stop()
