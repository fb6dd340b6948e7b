"""Which plan a model needs, built with which options, and whether the installed one fits this GPU
and TensorRT (``tritonbundle build --check``).

For init containers: ``tritonbundle build --check || tritonbundle build``. Models of other runtimes
have nothing GPU-specific to check.
"""

from __future__ import annotations

from pathlib import Path

from tritonbundle.runtimes.base import BuildContext
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
        calibration_data=str(spec.calibration) if spec.calibration else None,
    )


def other_arch_plans(previous: Path | None, current: str) -> dict[str, str]:
    """cc -> plan file of plans for other GPUs in the repository being replaced."""
    found: dict[str, str] = {}
    if previous is None:
        return found
    for meta_path in previous.glob("model_cc*.plan.json"):
        meta = te.EngineMetadata.read(meta_path)
        plan = meta_path.with_suffix("")
        if meta is not None and plan.exists() and meta.compute_capability != current:
            found[meta.compute_capability] = plan.name
    return found


def plan_problems(ctx: BuildContext, repository: Path, platform: te.Platform) -> list[str]:
    """Why the repository's plan for ``ctx.spec`` cannot serve on ``platform`` (empty: it can)."""
    spec = ctx.spec
    version_dir = repository / spec.encoder_name / str(ctx.version)
    plan_path = version_dir / plan_name(platform.compute_capability, multi_arch=spec.multi_arch)
    if not plan_path.exists():
        return [f"{spec.name}: no plan for {platform.fingerprint} ({plan_path} is missing)"]
    metadata = te.EngineMetadata.read(plan_path.with_name(plan_path.name + ".json"))
    onnx_sha = te.sha256_file(ctx.onnx_path) or (metadata.onnx_sha256 if metadata else "")
    reasons = te.mismatches(
        metadata, platform=platform, onnx_sha256=onnx_sha, options=engine_options(ctx),
        calibration_sha256=te.sha256_file(spec.calibration),
    )
    return [f"{spec.name}: {plan_path.name}: {reason}" for reason in reasons]
