"""What every runtime shares: the build context, dynamic batching and warm-up from the plan."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tritonbundle.build.planner import ModelPlan
from tritonbundle.manifest import ModelSpec
from tritonbundle.modelconfig import (
    DynamicBatching,
    ModelConfig,
    QueuePolicy,
    TensorSpec,
    Warmup,
    WarmupInput,
)


@dataclass(frozen=True)
class BuildContext:
    spec: ModelSpec
    plan: ModelPlan
    onnx_path: Path | None
    #: Folder for logs, timing caches and engine metadata of this model (build/artifacts/<model>).
    work_dir: Path
    version: int = 1
    #: Skip engine work whose metadata still matches (TensorRT); force rebuilds everything.
    force: bool = False
    #: The version folder of this model in the repository being replaced (engines to reuse).
    previous_dir: Path | None = None
    extra: dict[str, str] = field(default_factory=dict)


class Runtime(Protocol):
    name: str

    def config(self, ctx: BuildContext) -> ModelConfig:
        """The encoder model's config."""
        ...

    def write_files(self, ctx: BuildContext, version_dir: Path) -> None:
        """Write the model's files into ``<model>/<version>/`` (engine builds happen here)."""
        ...


def link_or_copy(src: Path, dst: Path) -> None:
    """Hard-link ``src`` to ``dst`` (same file system), else copy it."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists():
        dst.unlink()
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def tensor_specs(ctx: BuildContext, *, ragged: bool) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    spec = ctx.spec
    inputs = tuple(
        TensorSpec(t.name, t.dtype, t.dims, allow_ragged_batch=ragged and bool(t.sequence_axes)) for t in spec.inputs
    )
    outputs = tuple(TensorSpec(t.name, t.dtype, t.dims) for t in spec.outputs)
    return inputs, outputs


def queue_policy(spec: ModelSpec) -> QueuePolicy:
    """The bounded queue every batched model gets (overload is refused, not piled up).

    Per-request timeouts are always allowed, so a client's deadline bounds its time in the queue
    too. Triton applies a request's timeout only when it is shorter than the default (core
    PolicyQueue::Enqueue), so the default must be set: a request older than it is rejected.
    """
    return QueuePolicy(
        max_queue_size=spec.max_queue_size, default_timeout_us=spec.queue_timeout_us, allow_timeout_override=True
    )


def dynamic_batching(ctx: BuildContext) -> DynamicBatching | None:
    spec, plan = ctx.spec, ctx.plan
    if not spec.batched:
        return None
    return DynamicBatching(
        preferred_batch_sizes=plan.preferred_batch_sizes,
        max_queue_delay_us=plan.max_queue_delay_us,
        queue_policy=queue_policy(spec),
    )


def warmups(ctx: BuildContext, *, every_bucket: bool) -> tuple[Warmup, ...]:
    """Warm-up samples: one per (batch bucket, sequence bucket) at the bucket's max shape.

    Warming every profile before READY keeps the first requests of each shape from paying for
    kernel selection or CUDA graph capture. On the CPU server one small sample is enough.
    """
    spec, plan = ctx.spec, ctx.plan
    if every_bucket:
        shapes = [(p.batch.max, p.sequence.max if p.sequence else 1) for p in plan.profiles]
    else:
        shapes = [(1, min(8, spec.max_sequence_length or 8))]
    out = []
    for batch, seq in shapes:
        inputs = {}
        for t in spec.inputs:
            rest = t.shape[1:] if t.batched else t.shape
            dims = tuple(seq if d == "sequence" else int(d) for d in rest)
            # Token ids and masks must stay valid indices: zeros are the padding token.
            data = "zero" if t.dtype.startswith(("INT", "UINT", "BOOL")) else "random"
            inputs[t.name] = WarmupInput(t.dtype, dims, data)
        out.append(Warmup(name=f"warmup_b{batch}_s{seq}", batch_size=batch if spec.batched else 0, inputs=inputs))
    return tuple(out)


def python_model(name: str, version_dir: Path) -> None:
    """Copy the Python-backend model ``name`` (from tritonbundle.triton_models) to ``model.py``."""
    from tritonbundle.triton_models import source

    version_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source(name), version_dir / "model.py")


def base_config(ctx: BuildContext, **fields: object) -> ModelConfig:
    return ModelConfig(name=ctx.spec.encoder_name, max_batch_size=ctx.spec.max_batch_size, **fields)  # type: ignore[arg-type]
