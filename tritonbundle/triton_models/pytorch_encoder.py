"""Triton Python-backend model: a Hugging Face BERT encoder run by PyTorch (the ``pytorch`` runtime).

The network is the export recipe's module: ``BertModel`` + mean pooling over the attention mask +
L2 normalisation, loaded from ``config.json`` + ``model.safetensors`` in the version folder (written
by the build stage). On a GPU it runs in the configured precision (FP16 by default) and replays CUDA
graphs captured at ``initialize`` for every (batch bucket, padding target) of the build plan, the way
a TensorRT engine has one optimization profile per shape. On the CPU it runs eagerly in FP32 (no
graphs), so the same model is tested on the CPU server.

Shapes (the plan's ``targets`` padding policy): the tokenizer pads each request to its bucket's edge;
the inputs allow ragged batching, so requests of different targets share one ``execute``. Here every
row is put at the smallest padding target that holds its own length (the mask's last 1), rows are
grouped by target, neighbouring groups may be merged to a longer target when one launch costs less
than two (launch costs are the captured graphs' measured replay times), and each group is split into
batch buckets (rows padded with empty rows up to the bucket). Outputs are cut back per request.

Settings (config ``parameters``):
  weights_file, config_file   in the version folder (model.safetensors, config.json)
  precision                   fp32 | fp16 | bf16 (GPU only; the CPU always computes in FP32)
  cuda_graphs                 true | false
  padding_targets             comma-separated lengths (the plan's sequence bucket edges)
  batch_buckets               comma-separated batch sizes graphs are captured for
  max_sequence_length         longer requests get INVALID_ARG
Statistics (rows, useful / padded / computed tokens, time per execute phase, GPU time) are written as
JSON to ``$TRITONBUNDLE_STATS_DIR/<model>.<pid>.json`` every 0.25 s when that variable is set (the
benchmark reads them); nothing is written otherwise.

Also importable outside Triton (``Engine``): the benchmark's ceiling runs the same engine in-process.
"""

import json
import math
import os
import threading
import time
from pathlib import Path

import numpy as np

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported outside Triton: tests, the benchmark's in-process ceiling
    pb_utils = None

CLS_ID = 101
#: Host-side cost of one graph launch (input copies + replay call), added to its measured GPU time.
LAUNCH_OVERHEAD_S = 30e-6
#: Eager (no graphs) launch cost models, (seconds per forward call, seconds per computed token):
#: merging two length groups into one launch pays off when the call costs more than the padding.
EAGER_COST = {"cpu": (1e-3, 1e-5), "cuda": (2e-3, 2e-7)}


def _error(message, code_name="INVALID_ARG"):
    code = getattr(pb_utils.TritonError, code_name, None)
    return pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)


class RequestError(ValueError):
    pass


# -- shapes: pure functions (unit-tested without torch) -----------------------------------------------
def used_lengths(mask):
    """Per row, the position after the last non-zero mask entry (0 for an all-zero row)."""
    mask = np.asarray(mask)
    if mask.ndim != 2:
        raise ValueError(f"mask must be 2-D, got shape {list(mask.shape)}")
    nonzero = mask != 0
    last = mask.shape[1] - np.argmax(nonzero[:, ::-1], axis=1)
    return np.where(nonzero.any(axis=1), last, 0).astype(np.int64)


def target_index(lengths, targets):
    """Index of the smallest target >= each length (lengths above the last target are an error)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    index = np.searchsorted(np.asarray(targets, dtype=np.int64), lengths, side="left")
    if index.size and int(index.max()) >= len(targets):
        raise ValueError(f"a row of {int(lengths.max())} tokens is longer than the longest padding target {targets[-1]}")
    return index


class LaunchPlanner:
    """Turns row lengths into launches ``(batch, target, row indices)`` of least total cost.

    ``cost`` maps (batch bucket, target) to seconds when ``buckets`` are given (CUDA graphs: every
    launch has a bucket's shape, rows padded up to it); without buckets every launch has exactly its
    rows, costed by ``eager_cost = (fixed, per_token)``.
    """

    def __init__(self, targets, buckets=(), cost=None, eager_cost=EAGER_COST["cpu"]):
        self.targets = tuple(sorted(int(t) for t in targets))
        if not self.targets:
            raise ValueError("at least one padding target is needed")
        self.buckets = tuple(sorted(int(b) for b in buckets))
        self.eager_cost = eager_cost
        self._best = {}
        self._choice = {}
        if self.buckets:
            if cost is None:
                cost = {(b, s): eager_cost[0] + eager_cost[1] * b * s for b in self.buckets for s in self.targets}
            missing = [(b, s) for b in self.buckets for s in self.targets if (b, s) not in cost]
            if missing:
                raise ValueError(f"no launch cost for shapes {missing[:4]}")
            top = self.buckets[-1]
            for s in self.targets:
                best = [0.0] + [math.inf] * top
                choice = [0] * (top + 1)
                for k in range(1, top + 1):
                    for b in self.buckets:
                        c = cost[(b, s)] + best[max(0, k - b)]
                        if c < best[k]:
                            best[k], choice[k] = c, b
                self._best[s], self._choice[s] = best, choice
            self._top_cost = {s: cost[(top, s)] for s in self.targets}

    def batches(self, n, target):
        """Batch buckets that cover ``n`` rows at ``target`` at least cost (exact ``[n]`` without buckets)."""
        if n <= 0:
            return []
        if not self.buckets:
            return [n]
        top = self.buckets[-1]
        out = [top] * (n // top) if n > top else []
        rest = n - top * len(out)
        choice = self._choice[target]
        while rest > 0:
            b = choice[rest]
            out.append(b)
            rest -= b
        return out

    def cost(self, n, target):
        if n <= 0:
            return 0.0
        if not self.buckets:
            return self.eager_cost[0] + self.eager_cost[1] * n * target
        top = self.buckets[-1]
        full = n // top if n > top else 0
        return full * self._top_cost[target] + self._best[target][n - full * top]

    def plan(self, lengths):
        """Launches for rows of these lengths: a list of ``(batch, target, row_indices)``."""
        lengths = np.asarray(lengths, dtype=np.int64)
        if lengths.size == 0:
            return []
        index = target_index(lengths, self.targets)
        groups = sorted(set(index.tolist()))
        rows = {k: np.flatnonzero(index == k) for k in groups}
        counts = [len(rows[k]) for k in groups]
        # f[i]: least cost of groups[:i]; a segment groups[j:i] runs at the target of groups[i - 1].
        f = [0.0] + [math.inf] * len(groups)
        back = [0] * (len(groups) + 1)
        for i in range(1, len(groups) + 1):
            n = 0
            for j in range(i, 0, -1):
                n += counts[j - 1]
                c = f[j - 1] + self.cost(n, self.targets[groups[i - 1]])
                if c < f[i]:
                    f[i], back[i] = c, j - 1
        segments = []
        i = len(groups)
        while i > 0:
            segments.append((back[i], i))
            i = back[i]
        launches = []
        for j, i in reversed(segments):
            target = self.targets[groups[i - 1]]
            members = np.concatenate([rows[k] for k in groups[j:i]])
            start = 0
            for batch in self.batches(len(members), target):
                take = members[start : start + batch]
                launches.append((int(batch), int(target), take))
                start += len(take)
        return launches


def launch_tokens(launches):
    """Tokens the launches compute (padding rows and padding positions included)."""
    return int(sum(batch * target for batch, target, _ in launches))


# -- the network -----------------------------------------------------------------------------------------
def build_encoder(weights_dir, dtype, device, attn_implementation="sdpa"):
    """BERT from ``config.json`` + ``model.safetensors`` with mean pooling and L2 normalisation."""
    from safetensors.torch import load_file

    # Import from the module itself: transformers' lazy top-level import hides the real cause of a
    # failure ("Could not import module 'BertModel'") behind a generic message.
    from transformers.models.bert.configuration_bert import BertConfig
    from transformers.models.bert.modeling_bert import BertModel

    weights_dir = Path(weights_dir)
    config = BertConfig.from_dict(json.loads((weights_dir / "config.json").read_text()))
    config._attn_implementation = attn_implementation
    bert = BertModel(config, add_pooling_layer=False)
    state = load_file(str(weights_dir / "model.safetensors"))
    state = {k.removeprefix("bert."): v for k, v in state.items() if not k.startswith(("pooler.", "bert.pooler."))}
    missing, _unexpected = bert.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith(("position_ids", "token_type_ids"))]
    if missing:
        raise RuntimeError(f"{weights_dir / 'model.safetensors'} has no weights for {missing[:5]}")
    module = MeanPooledEncoder(bert).to(device=device, dtype=dtype).eval()
    for p in module.parameters():
        p.requires_grad_(False)
    return module


_CLASS: list = []


def _module_class():
    if _CLASS:
        return _CLASS[0]
    import torch

    class _MeanPooledEncoder(torch.nn.Module):
        """BERT + mean pooling over the attention mask + L2 normalisation (the export recipe's module).

        The attention mask goes to BERT as a ready 4-D boolean mask (True: attend), so no step of the
        forward pass reads values back to the host and the pass can be captured in a CUDA graph; SDPA
        takes it as is (on the CPU a boolean mask is several times faster than an additive one).
        Every row attends at least to its first token, so rows with an all-zero mask (batch padding,
        warm-up samples) give zero vectors instead of NaN; pooling uses the mask as given.
        """

        def __init__(self, bert):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask):
            keep = attention_mask != 0
            keep[:, 0] = True
            hidden = self.bert(
                input_ids=input_ids, attention_mask=keep[:, None, None, :], token_type_ids=torch.zeros_like(input_ids)
            ).last_hidden_state.float()
            mask = attention_mask.unsqueeze(-1).float()
            summed = (hidden * mask).sum(dim=1)
            counts = mask.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(summed / counts, p=2.0, dim=1)

    _CLASS.append(_MeanPooledEncoder)
    return _MeanPooledEncoder


def MeanPooledEncoder(bert):  # noqa: N802 - a class factory (torch is imported lazily)
    return _module_class()(bert)


class _Graph:
    __slots__ = ("graph", "ids", "mask", "out")

    def __init__(self, graph, ids, mask, out):
        self.graph, self.ids, self.mask, self.out = graph, ids, mask, out

    def replay(self):
        self.graph.replay()


class Engine:
    """The encoder plus its launch plan: eager, or CUDA graphs per (batch bucket, padding target)."""

    def __init__(self, weights_dir, *, device="cpu", precision="fp16", targets=(512,), batch_buckets=(),
                 cuda_graphs=True, max_sequence_length=512):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        on_gpu = self.device.type == "cuda"
        if on_gpu and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
        if precision not in dtypes:
            raise ValueError(f"precision {precision!r} is not supported by the pytorch runtime ({', '.join(dtypes)})")
        self.precision = precision if on_gpu else "fp32"
        self.dtype = dtypes[self.precision]
        if on_gpu:
            torch.cuda.set_device(self.device)
        self.module = build_encoder(weights_dir, self.dtype, self.device)
        self.hidden = int(self.module.bert.config.hidden_size)
        self.max_sequence_length = int(max_sequence_length)
        self.targets = tuple(sorted(int(t) for t in targets)) or (self.max_sequence_length,)
        self.use_graphs = bool(cuda_graphs and on_gpu and batch_buckets)
        self.buckets = tuple(sorted(int(b) for b in batch_buckets)) if self.use_graphs else ()
        self.graphs = {}
        self.timings = {}
        self.capture_s = 0.0
        self.graph_error = ""
        self.eager_cost = EAGER_COST["cuda" if on_gpu else "cpu"]
        self.planner = LaunchPlanner(self.targets, eager_cost=self.eager_cost)

    # -- preparation -------------------------------------------------------------------------------------
    def prepare(self):
        """Warm up; capture a graph per (bucket, target) and time each (the launch planner's costs)."""
        torch = self.torch
        start = time.monotonic()
        with torch.no_grad():
            ids, mask = self._dummy(1, self.targets[0])
            self.module(ids, mask)
        if self.use_graphs:
            try:
                self._capture()
                self.timings = self.time_shapes(reps=3)
                cost = {shape: t + LAUNCH_OVERHEAD_S for shape, t in self.timings.items()}
                self.planner = LaunchPlanner(self.targets, self.buckets, cost)
            except Exception as e:  # noqa: BLE001 - fall back to eager, and say so
                self.graph_error = f"{type(e).__name__}: {e}"
                self.graphs.clear()
                self.use_graphs = False
                self.buckets = ()
                self.planner = LaunchPlanner(self.targets, eager_cost=self.eager_cost)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.capture_s = time.monotonic() - start
        return self

    def _dummy(self, batch, target):
        torch = self.torch
        ids = torch.zeros((batch, target), dtype=torch.long, device=self.device)
        ids[:, 0] = CLS_ID
        mask = torch.ones((batch, target), dtype=torch.long, device=self.device)
        return ids, mask

    def shapes(self):
        return sorted(((b, s) for b in self.buckets for s in self.targets), key=lambda bs: -bs[0] * bs[1])

    def _capture(self):
        torch = self.torch
        shapes = self.shapes()
        statics = {}
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side), torch.no_grad():
            for shape in shapes:
                ids, mask = self._dummy(*shape)
                for _ in range(2):
                    self.module(ids, mask)
                statics[shape] = (ids, mask)
        torch.cuda.current_stream(self.device).wait_stream(side)
        torch.cuda.synchronize(self.device)
        pool = torch.cuda.graph_pool_handle()
        for shape in shapes:  # largest first, so smaller graphs reuse the shared pool's memory
            ids, mask = statics[shape]
            graph = torch.cuda.CUDAGraph()
            with torch.no_grad(), torch.cuda.graph(graph, pool=pool):
                out = self.module(ids, mask)
            self.graphs[shape] = _Graph(graph, ids, mask, out)
        torch.cuda.synchronize(self.device)

    def time_shapes(self, reps=3, shapes=None):
        """Seconds per launch of each captured shape (mean of ``reps`` replays, timed with CUDA events)."""
        torch = self.torch
        out = {}
        for shape in shapes or self.shapes():
            g = self.graphs[shape]
            g.replay()
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(reps):
                g.replay()
            end.record()
            end.synchronize()
            out[shape] = begin.elapsed_time(end) / 1000.0 / reps
        return out

    # -- running -----------------------------------------------------------------------------------------
    def embed(self, rows, masks, lengths, stats=None):
        """Embeddings [n, hidden] (float32) for ``n`` token rows (1-D arrays) with their masks and lengths."""
        torch = self.torch
        n = len(rows)
        out = np.empty((n, self.hidden), dtype=np.float32)
        if n == 0:
            return out
        t0 = time.perf_counter()
        launches = self.planner.plan(lengths)
        t_plan = time.perf_counter() - t0
        gpu = self.device.type == "cuda"
        events = None
        if gpu and stats is not None:
            events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        parts, order = [], []
        t_fill = t_launch = 0.0
        with torch.no_grad():
            if events:
                events[0].record()
            for batch, target, members in launches:
                f0 = time.perf_counter()
                host = np.zeros((2, batch, target), dtype=np.int64)  # token ids, attention mask
                for j, r in enumerate(members):
                    length = min(rows[r].shape[0], target)
                    host[0, j, :length] = rows[r][:length]
                    host[1, j, :length] = masks[r][:length]
                f1 = time.perf_counter()
                staged = torch.from_numpy(host)
                if gpu:
                    # Pinned (from PyTorch's caching host allocator, which keeps a block until its copy is
                    # done), so the copies are asynchronous: the host prepares the next launch while the
                    # GPU runs this one. A copy from pageable memory would wait for the stream each time.
                    staged = staged.pin_memory()
                if self.use_graphs:
                    g = self.graphs[(batch, target)]
                    g.ids.copy_(staged[0], non_blocking=True)
                    g.mask.copy_(staged[1], non_blocking=True)
                    g.replay()
                    parts.append(g.out[: len(members)].clone())
                else:
                    staged = staged.to(self.device, non_blocking=True)
                    result = self.module(staged[0], staged[1])
                    parts.append(result[: len(members)])
                order.append(members)
                t_fill += f1 - f0
                t_launch += time.perf_counter() - f1
            if events:
                events[1].record()
            w0 = time.perf_counter()
            values = torch.cat(parts).to("cpu").numpy() if len(parts) > 1 else parts[0].to("cpu").numpy()
            t_wait = time.perf_counter() - w0
        out[np.concatenate(order)] = values
        if stats is not None:
            index = target_index(lengths, self.targets)
            stats["launches"] += len(launches)
            stats["useful_tokens"] += int(np.sum(lengths))
            stats["seq_tokens"] += int(np.sum(np.asarray(self.targets)[index]))
            stats["computed_tokens"] += launch_tokens(launches)
            stats["t_plan_s"] += t_plan
            stats["t_fill_s"] += t_fill
            stats["t_launch_s"] += t_launch
            stats["t_wait_s"] += t_wait
            if events:
                stats["gpu_s"] += events[0].elapsed_time(events[1]) / 1000.0
        return out

    def describe(self):
        return {
            "device": str(self.device), "precision": self.precision, "cuda_graphs": self.use_graphs,
            "graphs": len(self.graphs), "batch_buckets": list(self.buckets), "padding_targets": list(self.targets),
            "prepare_s": round(self.capture_s, 3), "graph_error": self.graph_error,
        }


# -- statistics --------------------------------------------------------------------------------------------
STAT_KEYS = (
    "executes", "requests", "errors", "rows", "launches", "useful_tokens", "seq_tokens", "computed_tokens",
    "t_execute_s", "t_read_s", "t_plan_s", "t_fill_s", "t_launch_s", "t_wait_s", "t_respond_s", "gpu_s",
)


class StatsWriter:
    """Writes the model's cumulative statistics to a JSON file from a background thread."""

    def __init__(self, path, stats, info, interval_s=0.25):
        self.path, self.stats, self.info, self.interval_s = Path(path), stats, info, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="stats-writer", daemon=True)

    def start(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.write()
        self._thread.start()
        return self

    def write(self):
        data = {"info": self.info, "stats": dict(self.stats), "time": time.time()}
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.path)

    def _loop(self):
        while not self._stop.wait(self.interval_s):
            try:
                self.write()
            except OSError:
                pass

    def stop(self):
        self._stop.set()
        try:
            self.write()
        except OSError:
            pass


# -- the Triton model --------------------------------------------------------------------------------------
class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        version_dir = Path(args["model_repository"]) / args["model_version"]
        gpu = args.get("model_instance_kind", "CPU") == "GPU"
        device = f"cuda:{args.get('model_instance_device_id', '0')}" if gpu else "cpu"
        targets = [int(t) for t in params.get("padding_targets", "").split(",") if t.strip()]
        buckets = [int(b) for b in params.get("batch_buckets", "").split(",") if b.strip()]
        self.max_seq = int(params.get("max_sequence_length", "512"))
        self.name = args.get("model_name", config.get("name", "encoder"))
        self.batched = int(config.get("max_batch_size", 0)) > 0
        self.input_names = [i["name"] for i in config["input"]]
        self.output_name = config["output"][0]["name"]
        if len(self.input_names) != 2:
            raise pb_utils.TritonModelException(f"{self.name}: expects two inputs (token ids, attention mask)")
        self.engine = Engine(
            version_dir, device=device, precision=params.get("precision", "fp16"),
            targets=targets or [self.max_seq], batch_buckets=buckets,
            cuda_graphs=params.get("cuda_graphs", "true").lower() == "true", max_sequence_length=self.max_seq,
        ).prepare()
        self.stats = dict.fromkeys(STAT_KEYS, 0)
        for key in STAT_KEYS:
            if key.endswith("_s"):
                self.stats[key] = 0.0
        info = {"model": self.name, "instance": args.get("model_instance_name", ""), **self.engine.describe()}
        self._log(f"{self.name}: {json.dumps(info)}")
        self.writer = None
        stats_dir = os.environ.get("TRITONBUNDLE_STATS_DIR")
        if stats_dir:
            tag = f"{self.name}.{os.getpid()}.json"
            self.writer = StatsWriter(Path(stats_dir) / tag, self.stats, info).start()

    def _log(self, message):
        logger = getattr(pb_utils, "Logger", None)
        if logger is not None:
            logger.log_info(message)
        else:
            print(message, flush=True)

    def _read(self, request):
        arrays = []
        for name in self.input_names:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is None:
                raise RequestError(f"input {name} is missing")
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
        return ids, mask

    def execute(self, requests):
        t0 = time.perf_counter()
        stats = self.stats
        responses = [None] * len(requests)
        good, rows, masks, lengths = [], [], [], []
        for index, request in enumerate(requests):
            try:
                ids, mask = self._read(request)
            except RequestError as e:
                responses[index] = pb_utils.InferenceResponse(output_tensors=[], error=_error(str(e)))
                stats["errors"] += 1
                continue
            used = used_lengths(mask)
            good.append((index, len(rows), ids.shape[0]))
            rows.extend(ids)
            masks.extend(mask)
            lengths.append(used)
        t1 = time.perf_counter()
        stats["t_read_s"] += t1 - t0
        if good:
            try:
                out = self.engine.embed(rows, masks, np.concatenate(lengths), stats)
            except Exception as e:  # noqa: BLE001 - every request of the batch gets the error
                for index, _, _ in good:
                    responses[index] = pb_utils.InferenceResponse(
                        output_tensors=[], error=_error(f"{self.name}: inference failed: {e}", "INTERNAL")
                    )
                stats["errors"] += len(good)
            else:
                t2 = time.perf_counter()
                for index, start, count in good:
                    tensor = pb_utils.Tensor(self.output_name, out[start : start + count])
                    responses[index] = pb_utils.InferenceResponse(output_tensors=[tensor])
                stats["t_respond_s"] += time.perf_counter() - t2
                stats["rows"] += len(rows)
        stats["executes"] += 1
        stats["requests"] += len(requests)
        stats["t_execute_s"] += time.perf_counter() - t0
        return responses

    def finalize(self):
        if self.writer is not None:
            self.writer.stop()
