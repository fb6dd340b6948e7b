"""Which plan a model needs and with which options: what the build compares a plan's metadata with
before reusing it (and ``build --check`` before reporting it fit)."""

from __future__ import annotations

from pathlib import Path

from tritonbundle.runtimes.base import BuildContext, model_tables
from tritonbundle.runtimes.tensorrt import engine as te

PLAN = "model.plan"


def plan_name(cc: str, *, multi_arch: bool) -> str:
    return f"model_cc{cc.replace('.', '')}.plan" if multi_arch else PLAN


def engine_options(ctx: BuildContext) -> te.EngineOptions:
    """Everything that changes the engine, from the manifest and the plan (recorded in its metadata)."""
    spec = ctx.spec
    return te.EngineOptions(
        precision=spec.precision,
        workspace_mib=spec.workspace_mib,
        builder_optimization_level=spec.builder_optimization_level,
        hardware_compatibility=spec.hardware_compatibility,
        version_compatible=spec.version_compatible,
        profiles=tuple(p.shapes for p in ctx.plan.profiles),
        index_clamps=tuple(sorted(model_tables(ctx).items())),
    )


def other_arch_plans(previous: Path | None, platform: te.Platform, *, onnx_sha256: str,
                     options: te.EngineOptions) -> dict[str, str]:
    """cc -> plan file of the plans for other GPUs in the repository being replaced that are still
    right: same TensorRT version as this one (the serving image's), same ONNX, same options. A plan
    of another TensorRT version would not load; one of another ONNX would serve an old model."""
    found: dict[str, str] = {}
    if previous is None:
        return found
    for meta_path in previous.glob("model_cc*.plan.json"):
        meta = te.EngineMetadata.read(meta_path)
        plan = meta_path.with_suffix("")
        if meta is None or not plan.exists() or meta.compute_capability == platform.compute_capability:
            continue
        other = te.Platform(meta.gpu_name, meta.compute_capability, platform.tensorrt_version)
        if not te.mismatches(meta, platform=other, onnx_sha256=onnx_sha256, options=options):
            found[meta.compute_capability] = plan.name
    return found
