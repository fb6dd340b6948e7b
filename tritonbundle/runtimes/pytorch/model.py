"""Triton Python-backend model: the recipe's encoder run by PyTorch (the ``pytorch`` runtime).

Loads ``config.json`` + ``model.safetensors`` from the version folder (written by the build stage)
into :class:`~tritonbundle.runtimes.pytorch.engine.Engine`: on a GPU in the configured precision
with CUDA graphs per (batch bucket, padding target), on the CPU eagerly in FP32.

Shapes (the plan's ``targets`` padding policy): the tokenizer pads each request to its bucket's edge;
the inputs allow ragged batching, so requests of different targets share one ``execute``, and the
engine's launch planner groups rows by target. Outputs are cut back per request. Settings come from
the config's parameters as :class:`tritonbundle.contract.PyTorchParameters`. Statistics for the
benchmark: :mod:`tritonbundle.runtimes.pytorch.stats`.

Served as ``<name>`` with a ``TEXT`` input (manifest ``tokenize_in_encoder``), the same model also
tokenizes: every text of the dynamic batch in one call of the fast tokenizer, read and refused exactly
as the tokenizer model does (:mod:`tritonbundle.runtimes.text`), with no ensemble and no second
Python process between the text and the engine. Settings: :class:`~tritonbundle.contract.TextPyTorchParameters`.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
if (_HERE / "tritonbundle").is_dir() and sys.path[:1] != [str(_HERE)]:
    sys.path.insert(0, str(_HERE))  # the package modules the build copied next to this file

import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402

from tritonbundle.contract import (  # noqa: E402
    TEXT_INPUT,
    TOKENS_OUTPUT,
    PyTorchParameters,
    TextPyTorchParameters,
    shape_problem,
    token_counts,
    token_ids_problem,
)
from tritonbundle.runtimes.pytorch.engine import GPU_WAIT_ENV, Engine  # noqa: E402
from tritonbundle.runtimes.pytorch.launch import used_lengths  # noqa: E402
from tritonbundle.runtimes.pytorch.stats import new_stats, writer_for  # noqa: E402
from tritonbundle.runtimes.text import TextError, load_tokenizer, read_texts, tokenize  # noqa: E402

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported outside Triton (tests, type checks)
    pb_utils = None


def _error(message: str, code_name: str = "INVALID_ARG") -> Any:
    code = getattr(pb_utils.TritonError, code_name, None)
    return pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)


class RequestError(ValueError):
    pass


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        version_dir = Path(args["model_repository"]) / args["model_version"]
        self.input_names = [i["name"] for i in config["input"]]
        self.tokenizer: Any = None
        if self.input_names == [TEXT_INPUT]:
            text = TextPyTorchParameters.from_config(config)
            self.tokenizer = load_tokenizer(str(version_dir / text.tokenizer_file), text.max_length, text.threads)
            self.max_length, self.max_text_bytes, self.pad_id = text.max_length, text.max_text_bytes, text.pad_id
            params: PyTorchParameters = text
        else:
            params = PyTorchParameters.from_config(config)
        gpu = args.get("model_instance_kind", "CPU") == "GPU"
        device = f"cuda:{args.get('model_instance_device_id', '0')}" if gpu else "cpu"
        self.max_seq = params.max_sequence_length
        self.max_batch = int(config.get("max_batch_size", 0)) or (1 << 30)
        self.name = args.get("model_name", config.get("name", "encoder"))
        self.output_name = config["output"][0]["name"]
        #: Served as a text model: each text's token count goes out too (when the config has it).
        self.counts = any(o["name"] == TOKENS_OUTPUT for o in config["output"])
        if self.tokenizer is None and len(self.input_names) != 2:
            raise pb_utils.TritonModelException(f"{self.name}: expects two inputs (token ids, attention mask)")
        self.engine = Engine(
            version_dir, device=device, precision=params.precision,
            targets=params.padding_targets or (self.max_seq,), batch_buckets=params.batch_buckets,
            cuda_graphs=params.cuda_graphs, max_sequence_length=self.max_seq, packing=params.packing,
            gpu_wait=os.environ.get(GPU_WAIT_ENV, "block"),
        ).prepare()
        self.stats = new_stats()
        info = {"model": self.name, "instance": args.get("model_instance_name", ""), **self.engine.describe()}
        self._log(f"{self.name}: {json.dumps(info)}")
        self.writer = writer_for(self.name, self.stats, info)
        # What initialize() built (torch, the weights, the graphs: ~200k objects) lives as long as the
        # process: out of the collector's sight, a full collection no longer walks it (90 ms on the
        # dev machine) in the middle of a request.
        gc.freeze()

    def _log(self, message: str) -> None:
        logger = getattr(pb_utils, "Logger", None)
        if logger is not None:
            logger.log_info(message)
        else:
            print(message, flush=True)

    def _read(self, request: Any) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        arrays = []
        for name in self.input_names:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is None:
                raise RequestError(f"input {name} is missing")
            problem = shape_problem(name, tensor.shape(), (-1,), max_batch=self.max_batch, max_dynamic=self.max_seq)
            if problem:  # from the tensor's header: its data is never read
                raise RequestError(problem)
            array = tensor.as_numpy()
            if array.ndim != 2:
                raise RequestError(f"input {name} must have shape [batch, sequence], got {list(array.shape)}")
            if array.dtype != np.int64:
                raise RequestError(f"input {name} must be int64, got {array.dtype.name}")
            arrays.append(array)
        ids, mask = arrays
        if ids.shape != mask.shape:
            raise RequestError(f"inputs disagree on [batch, length]: {list(ids.shape)} vs {list(mask.shape)}")
        if ids.shape[0] == 0:
            raise RequestError(f"input {self.input_names[0]} has no rows")
        if ids.shape[1] > self.max_seq:
            raise RequestError(
                f"input {self.input_names[0]} has shape {list(ids.shape)}: longer than the largest supported "
                f"sequence length {self.max_seq}"
            )
        if ids.shape[1] == 0:
            raise RequestError(f"input {self.input_names[0]} has shape {list(ids.shape)}: the sequence is empty")
        problem = token_ids_problem(self.input_names[0], ids, self.engine.vocab_size)
        if problem:
            raise RequestError(problem)
        return ids, mask

    def _read_texts(self, request: Any) -> list[str]:
        tensor = pb_utils.get_input_tensor_by_name(request, TEXT_INPUT)
        problem = shape_problem(TEXT_INPUT, tensor.shape(), (1,), max_batch=self.max_batch)
        if problem:
            raise TextError(problem)
        array = tensor.as_numpy()
        return read_texts(array, TEXT_INPUT, self.max_text_bytes, self.max_length)

    def _gather(self, good: list[tuple[int, Any]]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], list[int]]:
        """Every request's rows in one array pair (one copy per request, none per row) and the rows of each."""
        if self.tokenizer is not None:
            texts = [text for _, mine in good for text in mine]
            ((all_ids, all_masks),) = tokenize(self.tokenizer, texts, [(0, len(texts))], (), self.pad_id)
            return all_ids, all_masks, [len(mine) for _, mine in good]
        rows = sum(ids.shape[0] for _, (ids, _) in good)
        width = max(ids.shape[1] for _, (ids, _) in good)
        all_ids = np.zeros((rows, width), dtype=np.int64)
        all_masks = np.zeros((rows, width), dtype=np.int64)
        start = 0
        for _, (ids, mask) in good:
            all_ids[start : start + ids.shape[0], : ids.shape[1]] = ids
            all_masks[start : start + ids.shape[0], : ids.shape[1]] = mask
            start += ids.shape[0]
        return all_ids, all_masks, [ids.shape[0] for _, (ids, _) in good]

    def execute(self, requests: list[Any]) -> list[Any]:
        """Every request's rows (texts: tokenized together) into one array, one engine call."""
        t0 = time.perf_counter()
        stats = self.stats
        responses: list[Any] = [None] * len(requests)
        good: list[tuple[int, Any]] = []
        for index, request in enumerate(requests):
            try:
                good.append((index, self._read_texts(request) if self.tokenizer is not None else self._read(request)))
            except (RequestError, TextError) as e:
                responses[index] = pb_utils.InferenceResponse(output_tensors=[], error=_error(str(e)))
                stats["errors"] += 1
        if good:
            all_ids, all_masks, counts = self._gather(good)
            lengths = used_lengths(all_masks)
            t1 = time.perf_counter()
            stats["t_read_s"] += t1 - t0
            try:
                out = self.engine.embed(all_ids, all_masks, lengths, stats)
            except Exception as e:  # noqa: BLE001 - every request of the batch gets the error
                for index, _ in good:
                    responses[index] = pb_utils.InferenceResponse(
                        output_tensors=[], error=_error(f"{self.name}: inference failed: {e}", "INTERNAL")
                    )
                stats["errors"] += len(good)
            else:
                t2 = time.perf_counter()
                start = 0
                for (index, _), count in zip(good, counts):
                    tensors = [pb_utils.Tensor(self.output_name, out[start : start + count])]
                    if self.counts:
                        tensors.append(pb_utils.Tensor(TOKENS_OUTPUT, token_counts(all_masks[start : start + count])))
                    responses[index] = pb_utils.InferenceResponse(output_tensors=tensors)
                    start += count
                stats["t_respond_s"] += time.perf_counter() - t2
                stats["rows"] += int(all_ids.shape[0])
        stats["executes"] += 1
        stats["requests"] += len(requests)
        stats["t_execute_s"] += time.perf_counter() - t0
        return responses

    def finalize(self) -> None:
        if self.writer is not None:
            self.writer.stop()
