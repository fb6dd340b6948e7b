"""Triton Python-backend model: the recipe's encoder run by PyTorch (the ``pytorch`` runtime).

Loads ``config.json`` + ``model.safetensors`` from the version folder (written by the build stage)
into :class:`~tritonbundle.runtimes.pytorch.engine.Engine`: on a GPU in the configured precision
with CUDA graphs per (batch bucket, padding target), on the CPU eagerly in FP32.

Shapes (the plan's ``targets`` padding policy): the tokenizer pads each request to its bucket's edge;
the inputs allow ragged batching, so requests of different targets share one ``execute``, and the
engine's launch planner groups rows by target. Outputs are cut back per request. Settings come from
the config's parameters as :class:`tritonbundle.contract.PyTorchParameters`. Statistics for the
benchmark: :mod:`tritonbundle.runtimes.stats`.

Batches in flight (``batches_in_flight`` > 1): ``execute()`` reads its requests (copying their data:
Triton frees the request tensors when ``execute()`` returns), hands the batch to a free lane's worker
thread and returns ``None`` once a lane is free again; the worker runs the engine in its lane and sends
each request's one response with the FINAL flag through the request's response sender. That is the
Python backend's documented way for a non-decoupled model to answer after ``execute()`` returns (r24.06
and later: python_backend README, "Request Cancellation Handling"/response sender; Triton's QA model
``qa/python_models/response_sender``), so the KServe HTTP endpoint, which refuses decoupled models,
still serves it. Triton gives the instance its next batch as soon as ``execute()`` returns
(core ``backend_model_instance.cc``), so at most ``batches_in_flight`` batches are in flight and the
dynamic batcher gathers the next one while they run.

Only the outputs a request asked for go into its response. The Python backend of tritonserver 2.51
(python_backend r24.10) drops the others from a response sent through a response sender while it does
not hold the GIL, freeing their numpy arrays unlocked (``src/response_sender.cc`` releases the GIL, then
``PruneOutputTensors``; fixed upstream in python_backend #390, r24.12, "Hold GIL when deleting numpy
array"): on the H200 a lane's first ``send`` of a response with the unrequested ``tokens`` output never
returned, and the same model without that output answered (docs/benchmarks.md, "lanes").

Served as ``<name>`` with a ``TEXT`` input (manifest ``tokenize_in_encoder``), the same model also
tokenizes: every text of the dynamic batch in one call of the fast tokenizer, read and refused exactly
as the tokenizer model does (:mod:`tritonbundle.runtimes.text`), with no ensemble and no second
Python process between the text and the engine. Settings: :class:`~tritonbundle.contract.TextPyTorchParameters`.
"""

from __future__ import annotations

import gc
import json
import os
import queue
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
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
from tritonbundle.runtimes.pytorch.engine import GPU_WAIT_ENV, SHAPE_TIMING_ENV, Engine  # noqa: E402
from tritonbundle.runtimes.pytorch.launch import used_lengths  # noqa: E402
from tritonbundle.runtimes.stacks import dump_stacks_on_signal  # noqa: E402
from tritonbundle.runtimes.stats import PHASES, new_stats, observe, writer_for  # noqa: E402
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


#: A lane that has not come back in this long is reported in the log, with every thread's stack.
LANE_REPORT_S = 30.0


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        dump_stacks_on_signal()  # a stalled model can be read: runtimes/stacks.py
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
            gpu_wait=os.environ.get(GPU_WAIT_ENV, "block"), lanes=params.batches_in_flight,
            shape_timing=os.environ.get(SHAPE_TIMING_ENV, "alone"),
        ).prepare()
        self.stats = new_stats()
        self._stats_lock = threading.Lock()
        #: Lanes free to take a batch (batches_in_flight > 1), and the threads that run them.
        self._free: queue.Queue[int] | None = None
        self._workers: ThreadPoolExecutor | None = None
        if params.batches_in_flight > 1:
            self._free = queue.Queue()
            for lane in range(params.batches_in_flight):
                self._free.put(lane)
            self._workers = ThreadPoolExecutor(params.batches_in_flight, thread_name_prefix="lane",
                                               initializer=self._enter_worker)
        info = {"model": self.name, "instance": args.get("model_instance_name", ""), **self.engine.describe()}
        if self.tokenizer is not None:  # which text path served (PlainTextTokenizer or the whole Tokenizer)
            info["tokenizer"] = getattr(self.tokenizer, "kind", type(self.tokenizer).__name__)
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

    def _gather(self, good: list[tuple[int, Any]], stats: dict[str, float],
                ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], list[int]]:
        """Every request's rows in one array pair (one copy per request, none per row) and the rows of each;
        texts are tokenized together (timed apart from reading: ``t_tokenize_s``)."""
        if self.tokenizer is not None:
            texts = [text for _, mine in good for text in mine]
            t0 = time.perf_counter()
            ((all_ids, all_masks),) = tokenize(self.tokenizer, texts, [(0, len(texts))], (), self.pad_id)
            stats["t_tokenize_s"] += time.perf_counter() - t0
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

    def _enter_worker(self) -> None:
        if self.engine.device.type == "cuda":
            self.engine.torch.cuda.set_device(self.engine.device)  # the current device is per thread

    def execute(self, requests: list[Any]) -> list[Any] | None:
        """Every request's rows (texts: tokenized together) into one array, one engine call: here, or in
        a lane's thread when batches are in flight (module docstring)."""
        t0 = time.perf_counter()
        stats = new_stats()
        responses: list[Any] = [None] * len(requests)
        good: list[tuple[int, Any]] = []
        for index, request in enumerate(requests):
            try:
                good.append((index, self._read_texts(request) if self.tokenizer is not None else self._read(request)))
            except (RequestError, TextError) as e:
                responses[index] = pb_utils.InferenceResponse(output_tensors=[], error=_error(str(e)))
                stats["errors"] += 1
        batch = self._gather(good, stats) if good else None
        indices = [index for index, _ in good]
        counted = {index for index in indices if self._wants_counts(requests[index])}
        # the request tensors are not touched past this point
        stats["executes"] += 1
        stats["requests"] += len(requests)
        stats["t_read_s"] += time.perf_counter() - t0 - stats["t_tokenize_s"]
        if self._free is None or self._workers is None:
            if batch is not None:
                self._run(indices, counted, batch, responses, stats, 0)
            stats["t_execute_s"] += time.perf_counter() - t0
            self._count(stats, t0)
            return responses
        senders = [request.get_response_sender() for request in requests]
        for index, response in enumerate(responses):
            if response is not None:
                self._send(senders[index], response, stats)
        stats["t_execute_s"] += time.perf_counter() - t0
        if batch is None:
            self._count(stats, t0)
            return None
        lane = self._take_lane()
        self._workers.submit(self._run_in_lane, lane, indices, counted, batch, senders, stats, t0)
        self._free.put(self._take_lane())  # return once a lane is free: the batcher gathers meanwhile
        return None

    def _take_lane(self) -> int:
        """A free lane, waiting for one; a wait past LANE_REPORT_S is logged with every thread's stack."""
        assert self._free is not None
        while True:
            try:
                return self._free.get(timeout=LANE_REPORT_S)
            except queue.Empty:
                stacks = "".join(f"\n-- thread {tid}:\n" + "".join(traceback.format_stack(frame))
                                 for tid, frame in sys._current_frames().items())
                self._log(f"{self.name}: no lane has come back in {LANE_REPORT_S:.0f} s; threads:{stacks}")

    def _send(self, sender: Any, response: Any, stats: dict[str, float]) -> None:
        """One request's only response, with the FINAL flag. A failed send (Triton has let the request go,
        its caller gone) is logged and counted; it never stops the lane from answering the others."""
        try:
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as e:  # noqa: BLE001
            stats["errors"] += 1
            self._log(f"{self.name}: a response could not be sent: {type(e).__name__}: {e}")

    def _run_in_lane(self, lane: int, indices: list[int], counted: set[int], batch: Any, senders: list[Any],
                     stats: dict[str, float], called: float) -> None:
        t0 = time.perf_counter()
        responses: list[Any] = [None] * len(senders)
        try:
            self._run(indices, counted, batch, responses, stats, lane)
        except Exception as e:  # noqa: BLE001 - logged; the requests get an error below
            self._log(f"{self.name}: lane {lane} failed: {''.join(traceback.format_exception(e))}")
        finally:
            assert self._free is not None
            self._free.put(lane)
            for index in indices:
                response = responses[index] or pb_utils.InferenceResponse(
                    output_tensors=[], error=_error(f"{self.name}: inference failed", "INTERNAL"))
                self._send(senders[index], response, stats)
            stats["t_execute_s"] += time.perf_counter() - t0
            self._count(stats, called)

    def _wants_counts(self, request: Any) -> bool:
        """Whether ``request``'s response carries the token counts: only when it asked for them (module
        docstring: what the Python backend does with outputs nobody asked for)."""
        return self.counts and TOKENS_OUTPUT in request.requested_output_names()

    def _run(self, indices: list[int], counted: set[int], batch: Any, responses: list[Any],
             stats: dict[str, float], lane: int) -> None:
        """The engine on the gathered rows; each good request's response (or the batch's error) in
        ``responses``, with the token counts for the requests in ``counted``."""
        all_ids, all_masks, counts = batch
        lengths = used_lengths(all_masks)
        try:
            out = self.engine.embed(all_ids, all_masks, lengths, stats, lane=lane)
        except Exception as e:  # noqa: BLE001 - every request of the batch gets the error
            for index in indices:
                responses[index] = pb_utils.InferenceResponse(
                    output_tensors=[], error=_error(f"{self.name}: inference failed: {e}", "INTERNAL")
                )
            stats["errors"] += len(indices)
            return
        t2 = time.perf_counter()
        start = 0
        for index, count in zip(indices, counts):
            tensors = [pb_utils.Tensor(self.output_name, out[start : start + count])]
            if index in counted:
                tensors.append(pb_utils.Tensor(TOKENS_OUTPUT, token_counts(all_masks[start : start + count])))
            responses[index] = pb_utils.InferenceResponse(output_tensors=tensors)
            start += count
        stats["t_respond_s"] += time.perf_counter() - t2
        stats["rows"] += int(all_ids.shape[0])

    def _count(self, stats: dict[str, float], called: float) -> None:
        """Add one call's statistics, and its time since ``called`` (perf_counter) and GPU time to the
        histograms, to the instance's (lanes add theirs from their own threads)."""
        observe(stats, "execute_ms", 1000.0 * (time.perf_counter() - called))
        for name, seconds in (("gpu", stats["gpu_s"]), *((phase, stats[f"t_{phase}_s"]) for phase in PHASES)):
            if seconds > 0:
                observe(stats, f"{name}_ms", 1000.0 * seconds)
        with self._stats_lock:
            for key, value in stats.items():
                self.stats[key] += value

    def finalize(self) -> None:
        if self._workers is not None:
            self._workers.shutdown(wait=True)
        if self.writer is not None:
            self.writer.stop()
