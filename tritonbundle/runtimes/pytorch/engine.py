"""The pytorch runtime's engine: the recipe's encoder plus its launch plan.

On a GPU it runs in the configured precision and replays CUDA graphs captured at :meth:`Engine.prepare`
for every (batch bucket, padding target) of the build plan, the way a TensorRT engine has one
optimization profile per shape; the launch planner's costs are the graphs' measured replay times.
On the CPU it runs eagerly in FP32 (no graphs), so the same engine is tested on the CPU server.
Also used outside Triton: the benchmark's ceiling runs it in-process.

With ``packing`` every launch runs the encoder's packed forward (several texts per row, each attending
only to itself: :meth:`MeanPooledEncoder.packed`), and the planner packs short texts into shared rows
when that costs less (:meth:`LaunchPlanner.plan_packed`); a launch's inputs are the token ids, each
token's text number within its row and its position within its text.

Waiting for the GPU: the results are copied into pinned host memory and the thread waits on an event
created with ``cudaEventBlockingSync`` (``torch.cuda.Event(blocking=True)``), so it sleeps until the
GPU is done. A plain ``.to("cpu")`` waits the CUDA default way (``cudaDeviceScheduleAuto``: with fewer
contexts than cores, spin), and four encoder instances on the H200 burnt 4.5 cores spinning at
bert-base's knee, cores the tokenizer stubs and tritonserver share. ``gpu_wait="spin"`` (environment
``TRITONBUNDLE_GPU_WAIT=spin`` for the served model) keeps the old wait, for A/B measurements.

Launch costs: each captured shape's replay time is the fastest of a few replays, timed while this
process holds its GPU's turn (:mod:`~tritonbundle.runtimes.pytorch.gpu_turn`): other processes' kernels
only ever lengthen a replay, and the encoder instances of one server, each a process, start together.
``shape_timing="concurrent"`` (environment ``TRITONBUNDLE_SHAPE_TIMING=concurrent`` for the served
model) keeps the old way, the mean of the replays timed whenever the instance is ready, for A/B runs.
Timed alone, a table is left for the other instances of the same server, weights and shapes, which use it
instead of timing again (``gpu_turn``, "Shared costs"; ``describe()["timings_shared"]``).

Lanes (``lanes``, the manifest's ``batches_in_flight``): with more than one, each lane has its own CUDA
stream and its own captured graphs (their static inputs and outputs, in a memory pool of its own), so
several threads may call :meth:`Engine.embed` at once, each with its own ``lane``: one thread's host work
(planning, filling, reading results back) overlaps another's kernels in one process and one CUDA context.
Each lane's graphs are captured on the lane's own stream. PyTorch gives cuBLAS one workspace per (handle,
stream) (``aten/src/ATen/cuda/CublasHandlePool.cpp``, ``cublas_handle_stream_to_workspace``) and a
captured GEMM keeps the workspace of its capture stream; ``torch.cuda.graph`` captures on one stream
shared by every capture unless given one (``torch/cuda/graphs.py``, ``default_capture_stream``). Captured
there, both lanes' GEMMs shared one workspace, and on the H200 two lanes replaying at once left a kernel
running forever (GPU 100 % busy, both lanes waiting on their results: the stacks the served model logs).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tritonbundle import recipes
from tritonbundle.contract import target_index
from tritonbundle.runtimes.pytorch.gpu_turn import Turn, gpu_turn, share_costs, shared_costs
from tritonbundle.runtimes.pytorch.launch import (
    EAGER_COST,
    LaunchPlanner,
    launch_tokens,
    max_slots,
    pack_inputs,
)

#: Host-side cost of one graph launch (input copies + replay call), added to its measured GPU time.
LAUNCH_OVERHEAD_S = 30e-6
PRECISIONS = ("fp32", "fp16", "bf16")
#: How the host waits for a launch's results (module docstring).
GPU_WAITS = ("block", "spin")
#: The served model's way to choose it (A/B measurements; the default is "block").
GPU_WAIT_ENV = "TRITONBUNDLE_GPU_WAIT"
#: How the served model times its launch costs (module docstring; the default is "alone").
SHAPE_TIMINGS = ("alone", "concurrent")
#: The served model's way to choose it (A/B measurements).
SHAPE_TIMING_ENV = "TRITONBUNDLE_SHAPE_TIMING"
#: Replays timed per captured shape for the launch planner's costs.
TIMING_REPS = 3
Shape = tuple[int, int]


class _Graph:
    """A captured graph and the static tensors it reads and writes (``inputs``: the forward's inputs in
    order, each [batch, target])."""

    __slots__ = ("graph", "inputs", "out")

    def __init__(self, graph: Any, inputs: Sequence[Any], out: Any) -> None:
        self.graph, self.inputs, self.out = graph, tuple(inputs), out

    def replay(self) -> None:
        self.graph.replay()


class Engine:
    """The encoder plus its launch plan: eager, or CUDA graphs per (batch bucket, padding target)."""

    def __init__(
        self, weights_dir: Path | str, *, device: str = "cpu", precision: str = "fp16", targets: Sequence[int] = (512,),
        batch_buckets: Sequence[int] = (), cuda_graphs: bool = True, max_sequence_length: int = 512,
        packing: bool = False, gpu_wait: str = "block", lanes: int = 1, shape_timing: str = "alone",
    ) -> None:
        import torch

        if gpu_wait not in GPU_WAITS:
            raise ValueError(f"gpu_wait must be one of {GPU_WAITS}, not {gpu_wait!r}")
        if shape_timing not in SHAPE_TIMINGS:
            raise ValueError(f"shape_timing must be one of {SHAPE_TIMINGS}, not {shape_timing!r}")
        self.gpu_wait = gpu_wait
        self.shape_timing = shape_timing
        if lanes < 1:
            raise ValueError(f"lanes must be >= 1, not {lanes}")
        self.lanes = int(lanes)

        self.torch: Any = torch
        self.device = torch.device(device)
        on_gpu = self.device.type == "cuda"
        if on_gpu and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if precision not in PRECISIONS:
            raise ValueError(f"precision {precision!r} is not supported by the pytorch runtime ({', '.join(PRECISIONS)})")
        self.precision = precision if on_gpu else "fp32"
        self.dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[self.precision]
        if on_gpu:
            torch.cuda.set_device(self.device)
        self.weights_dir = Path(weights_dir)
        config, state = recipes.load_folder(self.weights_dir)
        self.module: Any = recipes.encoder(config, state, dtype=self.dtype, device=self.device)
        self.hidden = int(config["hidden_size"])
        #: Rows of the embedding table: token ids outside [0, vocab_size) are refused before they reach it.
        self.vocab_size = int(config["vocab_size"])
        self.max_sequence_length = int(max_sequence_length)
        self.targets = tuple(sorted(int(t) for t in targets)) or (self.max_sequence_length,)
        self.packing = bool(packing)
        self.use_graphs = bool(cuda_graphs and on_gpu and batch_buckets)
        self.buckets = tuple(sorted(int(b) for b in batch_buckets)) if self.use_graphs else ()
        #: Per lane: its graphs (lane 0's are also ``graphs``) and its stream (None: the default stream).
        self.lane_graphs: list[dict[Shape, _Graph]] = [{} for _ in range(self.lanes)]
        self.graphs = self.lane_graphs[0]
        self.streams: list[Any] = [None] * self.lanes
        if on_gpu and self.lanes > 1:
            self.streams = [self.torch.cuda.Stream(device=self.device) for _ in range(self.lanes)]
        self.timings: dict[Shape, float] = {}
        #: How the launch costs were timed: the GPU turn's wait, and whether it was held.
        self.timing_turn = Turn()
        #: The launch costs came from another instance's turn; ``costs_error``: why none could be shared.
        self.timings_shared = False
        self.costs_error = ""
        self.capture_s = 0.0
        self.graph_error = ""
        self.eager_cost = EAGER_COST["cuda" if on_gpu else "cpu"]
        self.planner = LaunchPlanner(self.targets, eager_cost=self.eager_cost)

    # -- preparation ---------------------------------------------------------------------------------
    def prepare(self) -> Engine:
        """Warm up; capture a graph per (bucket, target) and time each (the launch planner's costs)."""
        torch = self.torch
        start = time.monotonic()
        with torch.no_grad():
            self._forward(*self._dummy(1, self.targets[0]))
        if self.use_graphs:
            try:
                self._capture()
                self._time_launch_costs()
                cost = {shape: t + LAUNCH_OVERHEAD_S for shape, t in self.timings.items()}
                self.planner = LaunchPlanner(self.targets, self.buckets, cost)
            except Exception as e:  # noqa: BLE001 - fall back to eager, and say so
                self.graph_error = f"{type(e).__name__}: {e}"
                for graphs in self.lane_graphs:
                    graphs.clear()
                self.use_graphs = False
                self.buckets = ()
                self.planner = LaunchPlanner(self.targets, eager_cost=self.eager_cost)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.capture_s = time.monotonic() - start
        return self

    def _dummy(self, batch: int, target: int) -> tuple[Any, ...]:
        """Inputs of one launch of this shape: ids and mask, or (packing) ids, text numbers, positions."""
        torch = self.torch
        ids = torch.zeros((batch, target), dtype=torch.long, device=self.device)
        ids[:, 0] = recipes.CLS_ID
        mask = torch.ones((batch, target), dtype=torch.long, device=self.device)
        if not self.packing:
            return ids, mask
        positions = torch.arange(target, device=self.device).expand(batch, target).contiguous()
        return ids, mask, positions

    def _forward(self, *inputs: Any) -> Any:
        if not self.packing:
            return self.module(*inputs)
        return self.module.packed(*inputs, max_slots(int(inputs[0].shape[1])))

    def shapes(self) -> list[Shape]:
        return sorted(((b, s) for b in self.buckets for s in self.targets), key=lambda bs: -bs[0] * bs[1])

    def _capture(self) -> None:
        torch = self.torch
        shapes = self.shapes()
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side), torch.no_grad():
            for shape in shapes:
                inputs = self._dummy(*shape)
                for _ in range(2):
                    self._forward(*inputs)
        torch.cuda.current_stream(self.device).wait_stream(side)
        torch.cuda.synchronize(self.device)
        for graphs, stream in zip(self.lane_graphs, self.streams):
            pool = torch.cuda.graph_pool_handle()  # one per lane: lanes run at the same time
            for shape in shapes:  # largest first, so smaller graphs reuse the shared pool's memory
                statics = self._dummy(*shape)
                graph = torch.cuda.CUDAGraph()
                # Captured on the lane's own stream (module docstring, "Lanes"): a graph keeps the cuBLAS
                # workspace of the stream it was captured on.
                with torch.no_grad(), torch.cuda.graph(graph, pool=pool, stream=stream):
                    out = self._forward(*statics)
                graphs[shape] = _Graph(graph, statics, out)
        torch.cuda.synchronize(self.device)

    def time_shapes(self, reps: int = TIMING_REPS, shapes: Iterable[Shape] | None = None, fastest: bool = True,
                    ) -> dict[Shape, float]:
        """Seconds per launch of each captured shape, from CUDA events around each of ``reps`` replays (after
        one to warm up): the fastest (module docstring, "Launch costs"), or with ``fastest=False`` the mean."""
        torch = self.torch
        out = {}
        for shape in shapes or self.shapes():
            g = self.graphs[shape]
            g.replay()
            events = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
            events[0].record()
            for k in range(reps):
                g.replay()
                events[k + 1].record()
            events[-1].synchronize()
            times = [events[k].elapsed_time(events[k + 1]) / 1000.0 for k in range(reps)]
            out[shape] = min(times) if fastest else sum(times) / reps
        return out

    def _time_launch_costs(self) -> None:
        """``timings``: every captured shape timed, alone on the GPU unless ``shape_timing`` is "concurrent"
        (module docstring, "Launch costs")."""
        alone = self.shape_timing == "alone"
        gpu = self._gpu_name()
        with gpu_turn(gpu) if alone else contextlib.nullcontext(Turn()) as turn:
            self.timing_turn = turn
            shapes = self.shapes()
            key = self._costs_key(shapes) if turn.held and os.getppid() != 1 else ""  # 1: orphaned, no server
            shared = shared_costs(gpu, key) if key else None
            if shared is not None and all(shape_name(shape) in shared for shape in shapes):
                self.timings = {shape: shared[shape_name(shape)] for shape in shapes}
                self.timings_shared = True
                return
            self.timings = self.time_shapes(reps=TIMING_REPS, fastest=alone)
            if key:
                self.costs_error = share_costs(gpu, key, {shape_name(shape): t for shape, t in self.timings.items()})

    def _costs_key(self, shapes: Sequence[Shape]) -> str:
        """What makes two instances' launch costs the same: one server process (tritonserver forks each
        Python-backend stub and runs it with ``bash -c "exec <stub> ..."``, so the stub's parent is the
        server: python_backend ``src/stub_launcher.cc``, ``StubLauncher::Launch``), the same weights (the
        files' real paths, sizes and times), precision, packing, shapes. "" (nothing shared) if the weights
        cannot be read: sharing saves time, and its failure must not cost the graphs."""
        try:
            files = [(str(path.resolve()), path.stat().st_size, path.stat().st_mtime_ns)
                     for path in (self.weights_dir / recipes.CONFIG_FILE, self.weights_dir / recipes.WEIGHTS_FILE)]
        except OSError:
            return ""
        return json.dumps({"server": os.getppid(), "torch": str(getattr(self.torch, "__version__", "")),
                           "weights": files, "precision": self.precision,
                           "packing": self.packing, "shapes": sorted(shape_name(shape) for shape in shapes)})

    def _gpu_name(self) -> str:
        """This GPU's UUID (the same in every process, whatever CUDA_VISIBLE_DEVICES makes its index)."""
        props = self.torch.cuda.get_device_properties(self.device)
        return str(getattr(props, "uuid", "") or f"cuda{self.device.index}")

    # -- running -------------------------------------------------------------------------------------
    def embed(
        self, ids: npt.NDArray[np.int64], masks: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64],
        stats: dict[str, float] | None = None, lane: int = 0,
    ) -> npt.NDArray[np.float32]:
        """Embeddings [n, hidden] (float32) for ``n`` rows of token ids and masks (2-D, padded to a common
        width) whose used lengths are ``lengths``. Rows go to launches by the planner; each launch's
        input is gathered with one fancy-indexing copy, never a loop over rows. Threads calling at the
        same time must each use their own ``lane`` (module docstring)."""
        stream = self.streams[lane]
        if stream is None:
            return self._embed(ids, masks, lengths, stats, self.lane_graphs[lane])
        with self.torch.cuda.stream(stream):
            return self._embed(ids, masks, lengths, stats, self.lane_graphs[lane])

    def _embed(
        self, ids: npt.NDArray[np.int64], masks: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64],
        stats: dict[str, float] | None, graphs: dict[Shape, _Graph],
    ) -> npt.NDArray[np.float32]:
        torch = self.torch
        n = int(ids.shape[0])
        out = np.empty((n, self.hidden), dtype=np.float32)
        if n == 0:
            return out
        width = int(ids.shape[1])
        t0 = time.perf_counter()
        units = None
        if self.packing:
            units, launches = self.planner.plan_packed(lengths)
        else:
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
                if units is None:
                    host = np.zeros((2, batch, target), dtype=np.int64)  # token ids, attention mask
                    w = min(target, width)
                    host[0, : len(members), :w] = ids[members, :w]
                    host[1, : len(members), :w] = masks[members, :w]
                    texts = members
                else:
                    host, rows, slots, texts = pack_inputs(ids, masks, lengths, [units[u] for u in members], batch, target)
                f1 = time.perf_counter()
                staged = torch.from_numpy(host)
                if gpu:
                    # Pinned (from PyTorch's caching host allocator, which keeps a block until its copy is
                    # done), so the copies are asynchronous: the host prepares the next launch while the
                    # GPU runs this one. A copy from pageable memory would wait for the stream each time.
                    staged = staged.pin_memory()
                if self.use_graphs:
                    g = graphs[(batch, target)]
                    for static, value in zip(g.inputs, staged):
                        static.copy_(value, non_blocking=True)
                    g.replay()
                    result = g.out
                else:
                    staged = staged.to(self.device, non_blocking=True)
                    result = self._forward(*staged)
                if units is None:
                    parts.append(result[: len(members)].clone() if self.use_graphs else result[: len(members)])
                else:
                    pick = torch.from_numpy(np.stack([rows, slots]))
                    pick = (pick.pin_memory() if gpu else pick).to(self.device, non_blocking=True)
                    parts.append(result[pick[0], pick[1]])  # advanced indexing: a copy, never the graph's output
                order.append(texts)
                t_fill += f1 - f0
                t_launch += time.perf_counter() - f1
            if events:
                events[1].record()
            w0 = time.perf_counter()
            values = self._fetch(torch.cat(parts) if len(parts) > 1 else parts[0])
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
            # What these launches take on the GPU alone: each shape's replay time, timed at prepare()
            # ("Launch costs"). Against the GPU's busy time it tells the launches' own cost apart from
            # the instances sharing the GPU. Nothing where no table was timed alone (:attr:`timed_alone`).
            if self.timed_alone:
                stats["gpu_alone_s"] += sum(self.timings.get((b, t), 0.0) for b, t, _ in launches)
        return out

    @property
    def timed_alone(self) -> bool:
        """Whether the launches run captured graphs whose replay times were timed alone: in this process's
        turn on the GPU, or read from the instance that timed them in its turn (not on the CPU, not after
        falling back to eager launches, not timed concurrently or when the turn timed out)."""
        return self.use_graphs and self.shape_timing == "alone" and (self.timing_turn.held or self.timings_shared)

    def _fetch(self, result: Any) -> npt.NDArray[Any]:
        """The launches' results on the host, once the GPU is done (module docstring: how it waits)."""
        torch = self.torch
        if self.device.type != "cuda" or self.gpu_wait == "spin":
            return np.asarray(result.to("cpu").numpy())
        host = torch.empty(result.shape, dtype=result.dtype, pin_memory=True)
        host.copy_(result, non_blocking=True)
        done = torch.cuda.Event(blocking=True)
        done.record()
        done.synchronize()  # sleeps (cudaEventBlockingSync), without the GIL
        return np.asarray(host.numpy())

    def describe(self) -> dict[str, Any]:
        return {
            "device": str(self.device), "precision": self.precision, "cuda_graphs": self.use_graphs,
            "graphs": len(self.graphs), "batch_buckets": list(self.buckets), "padding_targets": list(self.targets),
            "packing": self.packing, "gpu_wait": self.gpu_wait, "lanes": self.lanes,
            "prepare_s": round(self.capture_s, 3), "graph_error": self.graph_error,
            "shape_timing": self.shape_timing, "timing_wait_s": round(self.timing_turn.waited_s, 3),
            "timing_turn_held": self.timing_turn.held, "timing_turn_error": self.timing_turn.error,
            "timings_shared": self.timings_shared, "costs_error": self.costs_error,
            # Each captured graph's time per launch: the tuner sizes its batch buckets from them.
            "timings_ms": {shape_name(shape): round(t * 1000, 4) for shape, t in sorted(self.timings.items())},
        }


def shape_name(shape: Shape) -> str:
    """A shape as the reports and the shared tables name it: "<batch>x<length>"."""
    return f"{shape[0]}x{shape[1]}"


def stack_rows(rows: Sequence[npt.NDArray[np.int64]], masks: Sequence[npt.NDArray[np.int64]] | None = None,
               ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """1-D token rows (and masks; default: all ones) as two 2-D arrays padded to the longest row."""
    width = max((len(r) for r in rows), default=0)
    ids = np.zeros((len(rows), width), dtype=np.int64)
    out_masks = np.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        out_masks[i, : len(row)] = 1 if masks is None else masks[i]
    return ids, out_masks
