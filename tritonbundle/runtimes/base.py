"""What every runtime shares: the protocol the build stage talks to, the build context, and the
config fields that come from the plan (tensors, dynamic batching, queue policy, warm-up)."""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tritonbundle.contract import EncoderParameters, Parameters, TokenizerParameters
from tritonbundle.errors import ConfigError
from tritonbundle.manifest import SEQUENCE, ModelSpec
from tritonbundle.modelconfig import (
    DynamicBatching,
    InstanceGroup,
    ModelConfig,
    QueuePolicy,
    TensorSpec,
    Warmup,
    WarmupInput,
)
from tritonbundle.plan import ModelPlan


@dataclass(frozen=True)
class BuildContext:
    """Everything a runtime needs to write one encoder model."""

    spec: ModelSpec
    plan: ModelPlan
    #: The exported (or given) ONNX file; None for runtimes that do not read ONNX.
    onnx_path: Path | None
    #: Folder for logs, timing caches and engine metadata of this model (build/artifacts/<model>).
    work_dir: Path
    version: int = 1
    #: Rebuild engines and weights even when their metadata still matches.
    force: bool = False
    #: The version folder of this model in the repository being replaced (files to reuse).
    previous_dir: Path | None = None
    #: The FP32 ONNX (``onnx_path`` is at the manifest's precision): accuracy gates compare with it.
    reference_onnx: Path | None = None
    #: The tokenizer of a text model (accuracy gates draw traffic-shaped texts).
    tokenizer_json: Path | None = None
    #: ``build --check``: report what would have to be rebuilt instead of building it.
    check_only: bool = False


@dataclass(frozen=True)
class Written:
    """What :meth:`Runtime.write_files` wrote that :meth:`Runtime.config` must name."""

    #: Compute capability -> plan file (one repository serving several GPU architectures).
    cc_model_filenames: Mapping[str, str] = field(default_factory=dict)
    default_model_filename: str = ""


class Runtime(Protocol):
    """A runtime plug-in: everything the build stage asks about one way of running the encoder."""

    #: The name in the manifest (``runtime: tensorrt``).
    name: str
    #: Whether it serves the ONNX export (else it never needs one).
    needs_onnx: bool

    def parameters(self, spec: ModelSpec) -> type[Parameters]:
        """The parameter record its config carries (the served model, or the clients, read it back)."""
        ...

    def check(self, spec: ModelSpec) -> None:
        """Refuse, with a :class:`ConfigError` naming the manifest key, a spec this runtime cannot serve."""
        ...

    def padding_policy(self, target: str) -> str:
        """``targets`` (requests arrive padded to the plan's edges) or ``ragged`` (the model pads)."""
        ...

    def write_files(self, ctx: BuildContext, version_dir: Path) -> Written:
        """Write the model's files into ``<model>/<version>/`` (engine builds happen here; with
        ``ctx.check_only`` an engine that would need a rebuild raises instead)."""
        ...

    def config(self, ctx: BuildContext, written: Written) -> ModelConfig:
        """The encoder model's config."""
        ...

    def text_model(
        self, ctx: BuildContext, encoder_version_dir: Path, version_dir: Path, tokenizer: TokenizerParameters,
    ) -> tuple[ModelConfig, type[Parameters]]:
        """``<name>`` as one model that tokenizes and encodes (manifest ``tokenize_in_encoder``): its files
        into ``version_dir``, its config and parameter record. A runtime that cannot refuses the knob
        in :meth:`check` (see :func:`no_text_model`)."""
        ...


def no_text_model(spec: ModelSpec, runtime: str) -> None:
    """:meth:`Runtime.check` of a runtime whose encoder cannot tokenize in its own process."""
    if spec.tokenize_in_encoder:
        raise ConfigError(f"model {spec.name}.tokenize_in_encoder: the {runtime} runtime's encoder cannot tokenize; "
                          "only the pytorch runtime's can (or leave it false: a tokenizer model and an ensemble)")


def needs_calibration(spec: ModelSpec) -> None:
    """INT8 calibrates on traffic-shaped inputs: a text model draws them from the traffic sample; any
    other model needs the manifest's ``calibration`` data."""
    if spec.precision == "int8" and spec.calibration is None and not spec.text:
        raise ConfigError(
            f"model {spec.name}.calibration: precision int8 needs calibration data for a model that is not a text "
            "model: a .npz holding one array per input (first axis: samples), shaped like real requests"
        )


def copy_artifact(src: Path, dst: Path) -> None:
    """Copy a build artifact into a version folder. Never a hard link: the artifacts folder is
    rewritten by later exports and conversions, and a link would change the served file with it."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.unlink(missing_ok=True)
    shutil.copy2(src, dst)


def link_or_copy(src: Path, dst: Path) -> None:
    """Hard-link ``src`` to ``dst`` (same file system), else copy it. Only for files of a previous
    repository version, which nothing writes again (the swap moves them away whole)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists():
        dst.unlink()
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def tensor_specs(spec: ModelSpec, *, ragged: bool) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    inputs = tuple(
        TensorSpec(t.name, t.dtype, t.dims, allow_ragged_batch=ragged and bool(t.axis_names)) for t in spec.inputs
    )
    outputs = tuple(TensorSpec(t.name, t.dtype, t.dims) for t in spec.outputs)
    return inputs, outputs


#: Full batches per instance an ``auto`` queue holds: the one each instance takes next, and as many
#: again arriving meanwhile.
QUEUE_BATCHES_PER_INSTANCE = 2


def queue_size(spec: ModelSpec, instances: int) -> int:
    """How many requests may wait for a model served by ``instances`` instances.

    Triton counts the requests the dynamic batcher is gathering into its next batch as queued (core
    ``RequestQueue::Enqueue`` rejects once ``queue_.size() >= max_queue_size``; the batch is taken off
    the queue only when an instance is free), so a bound below ``max_batch_size`` caps every batch
    under load and turns a burst into rejections while the GPU has room: at 64 the H200 bench's
    BERT-base encoder (128-row batches, 4 instances) averaged 42 rows a call and refused 0.8 % of the
    requests at 7,600 req/s (docs/benchmarks.md). ``auto`` holds two full batches per instance; the
    queue timeout still bounds how long any of them waits.
    """
    if spec.max_queue_size != "auto":
        return int(spec.max_queue_size)
    return QUEUE_BATCHES_PER_INSTANCE * max(1, spec.max_batch_size) * instances


def queue_policy(spec: ModelSpec, instances: int) -> QueuePolicy:
    """The bounded queue every batched model gets (overload is refused, not piled up).

    Per-request timeouts are always allowed, so a client's deadline bounds its time in the queue
    too. Triton applies a request's timeout only when it is shorter than the default (core
    PolicyQueue::Enqueue), so the default must be set: a request older than it is rejected.
    """
    return QueuePolicy(
        max_queue_size=queue_size(spec, instances), default_timeout_us=spec.queue_timeout_us,
        allow_timeout_override=True,
    )


def dynamic_batching(ctx: BuildContext, instances: int | None = None) -> DynamicBatching | None:
    """The plan's batching, the queue sized for ``instances`` (the manifest's ``instances`` unless given)."""
    spec, plan = ctx.spec, ctx.plan
    if not spec.batched:
        return None
    return DynamicBatching(
        preferred_batch_sizes=plan.preferred_batch_sizes,
        max_queue_delay_us=plan.max_queue_delay_us,
        queue_policy=queue_policy(spec, spec.instances if instances is None else instances),
    )


def warmups(ctx: BuildContext, *, every_bucket: bool) -> tuple[Warmup, ...]:
    """Warm-up samples: one per profile (batch bucket x the buckets of every dynamic axis), at its max shape.

    Warming every profile before READY keeps the first requests of each shape from paying for
    kernel selection or CUDA graph capture. On the CPU server one small sample is enough: batch 1,
    8 tokens, the first bucket's ``opt`` on any other axis.
    """
    spec, plan = ctx.spec, ctx.plan
    if every_bucket:
        samples = [(p.batch.max, {n: b.max for n, b in p.axes.items()}) for p in plan.profiles]
    else:
        first = plan.profiles[0].axes if plan.profiles else {}
        samples = [(1, {n: min(8, spec.max_sequence_length or 8) if n == SEQUENCE else b.opt for n, b in first.items()})]
    out = []
    for batch, sizes in samples:
        inputs = {}
        for t in spec.inputs:
            rest = t.shape[1:] if t.batched else t.shape
            dims = tuple(sizes[d] if isinstance(d, str) else int(d) for d in rest)
            # Token ids and masks must stay valid indices: zeros are the padding token.
            data = "zero" if t.dtype.startswith(("INT", "UINT", "BOOL")) else "random"
            inputs[t.name] = WarmupInput(t.dtype, dims, data)
        name = f"warmup_b{batch}" + "".join(f"_s{n}" if axis == SEQUENCE else f"_{axis}{n}" for axis, n in sizes.items())
        # Triton skips a warm-up sample of batch_size 0 (core src/backend_model_instance.cc); a model
        # without a batch dimension takes batch_size 1 and the full shape in dims (model_config.proto).
        out.append(Warmup(name=name, batch_size=batch if spec.batched else 1, inputs=inputs))
    return tuple(out)


def axis_sizes(plan: ModelPlan) -> dict[str, str]:
    """Named axis -> "least,typical,largest" of the plan (see ``EncoderParameters.axis_sizes``)."""
    buckets = dict(plan.axis_buckets)
    if plan.sequence_buckets:
        buckets[SEQUENCE] = plan.sequence_buckets
    return {name: f"{b[0].min},{max(b, key=lambda x: x.share).opt},{b[-1].max}" for name, b in buckets.items() if b}


#: Ops that pass a tensor's values on unchanged: ids that reach a Gather through them still index its
#: table (exporters reshape ids; tf2onnx casts int32 ids to int64). A Cast only to a 32- or 64-bit
#: integer type, which keeps every id under 2**31; one to bool or a narrower type changes the ids.
PASS_THROUGH = frozenset({"Cast", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})
ID_TYPES = frozenset({6, 7, 12, 13})  # onnx.TensorProto INT32, INT64, UINT32, UINT64


def index_tables(onnx_path: Path, input_names: list[str]) -> dict[str, int]:
    """Graph input -> rows of the initializer it indexes with ``Gather`` (token ids -> vocabulary size),
    directly or through :data:`PASS_THROUGH` ops; the fewest rows where it indexes several. Each
    Gather's indices are followed back to their producer, so the nodes' order does not matter."""
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    dims = {t.name: list(t.dims) for t in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}

    def source(tensor: str) -> str | None:
        """The graph input whose values ``tensor`` holds, if it is one or passes one on."""
        for _ in range(len(graph.node) + 1):
            if tensor in input_names:
                return tensor
            node = producer.get(tensor)
            if node is None or node.op_type not in PASS_THROUGH or not node.input:
                return None
            to = next((int(a.i) for a in node.attribute if a.name == "to"), None)
            if node.op_type == "Cast" and to not in ID_TYPES:
                return None
            tensor = node.input[0]
        return None

    tables: dict[str, int] = {}
    for node in graph.node:
        if node.op_type != "Gather" or len(node.input) != 2:
            continue
        table, indices = node.input
        axis = next((int(a.i) for a in node.attribute if a.name == "axis"), 0)
        name = source(indices)
        if name is not None and len(dims.get(table, ())) > axis:
            rows = int(dims[table][axis])
            tables[name] = min(rows, tables.get(name, rows))
    return tables


def model_tables(ctx: BuildContext) -> dict[str, int]:
    """:func:`index_tables` of the model's inputs, read from the FP32 graph where there is one (a
    quantized graph may index its tables through DequantizeLinear); empty without a graph."""
    graph = next((p for p in (ctx.reference_onnx, ctx.onnx_path) if p is not None and p.is_file()), None)
    return index_tables(graph, [t.name for t in ctx.spec.inputs]) if graph is not None else {}


def encoder_config(
    ctx: BuildContext, parameters: Parameters, *, ragged: bool, kind: str, instances: int | None = None,
    **fields: Any,
) -> ModelConfig:
    """The encoder's config: the manifest's tensors, the plan's batching, ``instances`` of ``kind`` (the
    manifest's ``instances`` unless given)."""
    spec = ctx.spec
    count = spec.instances if instances is None else instances
    inputs, outputs = tensor_specs(spec, ragged=ragged)
    fields.setdefault("instance_groups", (InstanceGroup(count=count, kind=kind),))
    if isinstance(parameters, EncoderParameters):  # what the build knows and the runtime need not
        parameters = dataclasses.replace(
            parameters, task=spec.task, axes={t.name: ",".join(map(str, t.shape)) for t in spec.inputs},
            axis_sizes=axis_sizes(ctx.plan), vocab_sizes=parameters.vocab_sizes or model_tables(ctx))
    return ModelConfig(
        name=spec.encoder_name, max_batch_size=spec.max_batch_size, inputs=inputs, outputs=outputs,
        dynamic_batching=dynamic_batching(ctx, count), parameters=parameters.to_parameters(), **fields,
    )
