"""The build stage, end to end: ``tritonbundle export | plan | repo | build``.

    manifest + traffic sample -> plan (pure) -> ONNX (export + parity) -> graph check
        -> engines/model files + config.pbtxt (staged) -> accuracy gates -> swap into the repository
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from tritonbundle import manifest as manifest_mod
from tritonbundle import traffic as traffic_mod
from tritonbundle.build import onnx_check, planner
from tritonbundle.build.repository import ModelArtifacts, write_repository
from tritonbundle.errors import ConfigError
from tritonbundle.log import LOG, step
from tritonbundle.manifest import Manifest, ModelSpec

DEFAULT_MANIFEST = Path("build/models.yaml")
DEFAULT_ARTIFACTS = Path("build/artifacts")
DEFAULT_REPOSITORY = Path("model_repository")


@dataclass
class BuildOptions:
    manifest: Path = DEFAULT_MANIFEST
    repository: Path = DEFAULT_REPOSITORY
    artifacts: Path = DEFAULT_ARTIFACTS
    traffic: Path | None = None
    models: tuple[str, ...] = ()
    overrides: dict[str, object] = field(default_factory=dict)
    force: bool = False
    export: bool = True


def load_manifest(options: BuildOptions) -> Manifest:
    m = manifest_mod.load(options.manifest)
    m = manifest_mod.override(m, **options.overrides)
    if options.models:
        unknown = sorted(set(options.models) - {s.name for s in m.models})
        if unknown:
            raise ConfigError(f"{options.manifest}: no model named {', '.join(unknown)}")
        import dataclasses

        m = dataclasses.replace(m, models=tuple(s for s in m.models if s.name in options.models))
    return m


def traffic_for(spec: ModelSpec, options: BuildOptions) -> traffic_mod.TrafficSample | None:
    path = options.traffic or spec.traffic
    if not spec.has_sequence:
        return None
    if path is None:
        raise ConfigError(
            f"model {spec.name}: no traffic sample: set 'traffic' in {options.manifest} or pass --traffic"
        )
    return traffic_mod.load(path)


def plan_all(options: BuildOptions, manifest: Manifest | None = None) -> list[tuple[ModelSpec, planner.ModelPlan]]:
    m = manifest or load_manifest(options)
    out = []
    for spec in m.models:
        plan = planner.plan_model(spec, traffic_for(spec, options))
        out.append((spec, plan))
        work = options.artifacts / spec.name
        work.mkdir(parents=True, exist_ok=True)
        (work / "plan.json").write_text(json.dumps(plan.to_json(), indent=2))
    return out


def export_all(options: BuildOptions, manifest: Manifest | None = None) -> dict[str, ModelArtifacts]:
    from tritonbundle.export.onnx_export import export

    m = manifest or load_manifest(options)
    out = {}
    for spec in m.models:
        step(f"export {spec.name}")
        # Check the user's file (so errors name it) before copying or exporting anything.
        if spec.onnx_path is not None:
            onnx_check.check_graph(spec, spec.onnx_path)
        result = export(spec, options.artifacts / spec.name, force=options.force)
        if spec.onnx_path is None:
            onnx_check.check_graph(spec, result.onnx_path)
        out[spec.name] = ModelArtifacts(result.onnx_path, result.tokenizer_path)
    return out


def existing_artifacts(spec: ModelSpec, options: BuildOptions) -> ModelArtifacts:
    work = options.artifacts / spec.name
    onnx_path = spec.onnx_path or work / "model.onnx"
    if not onnx_path.exists():
        raise ConfigError(
            f"model {spec.name}: {onnx_path} does not exist; run `tritonbundle export` first (or `tritonbundle build`)"
        )
    tokenizer = work / "tokenizer.json"
    if spec.task == "text-embedding" and not tokenizer.exists():
        if spec.tokenizer_file is not None:
            tokenizer = spec.tokenizer_file
        else:
            raise ConfigError(f"model {spec.name}: {tokenizer} does not exist; run `tritonbundle export` first")
    return ModelArtifacts(onnx_path, tokenizer if spec.task == "text-embedding" else None)


def build(options: BuildOptions) -> list[str]:
    """Export (unless told not to), plan, write and swap in the repository. Returns model names."""
    m = load_manifest(options)
    # Check everything that can be checked before any heavy work: manifest, traffic, plans.
    step(f"plan {len(m.models)} model(s) from {options.manifest}")
    plans = {spec.name: plan for spec, plan in plan_all(options, m)}
    for spec in m.models:
        p = plans[spec.name]
        if p.sequence_buckets:
            LOG.info(
                "    %s: %s policy, sequence buckets %s, %d profiles",
                spec.name, p.policy, [b.max for b in p.sequence_buckets], len(p.profiles),
            )
    if options.export:
        artifacts = export_all(options, m)
    else:
        artifacts = {}
        for spec in m.models:
            artifacts[spec.name] = existing_artifacts(spec, options)
            onnx_check.check_graph(spec, artifacts[spec.name].onnx_path or Path("-"))
    step(f"write {options.repository}")
    entries = [(spec, plans[spec.name], artifacts[spec.name]) for spec in m.models]
    return write_repository(entries, options.repository, work_root=options.artifacts, force=options.force)


def check_repository(options: BuildOptions) -> list[str]:
    """Why the repository's TensorRT plans do not fit this GPU and TensorRT (empty: they all fit).

    For init containers: ``tritonbundle build --check || tritonbundle build``. Models of other
    runtimes have nothing GPU-specific to check.
    """
    from tritonbundle.build import tensorrt_engine as te
    from tritonbundle.runtimes import tensorrt as trt_runtime
    from tritonbundle.runtimes.base import BuildContext

    m = load_manifest(options)
    specs = [s for s in m.models if s.runtime == "tensorrt"]
    if not specs:
        return []
    platform = te.current_platform()
    problems = []
    for spec in specs:
        plan = planner.plan_model(spec, traffic_for(spec, options))
        version_dir = options.repository / spec.encoder_name / "1"
        plan_path = version_dir / trt_runtime.plan_name(platform.compute_capability, multi_arch=spec.multi_arch)
        if not plan_path.exists():
            problems.append(f"{spec.name}: no plan for {platform.fingerprint} ({plan_path} is missing)")
            continue
        metadata = te.EngineMetadata.read(plan_path.with_name(plan_path.name + ".json"))
        onnx_path = spec.onnx_path or options.artifacts / spec.name / "model.onnx"
        ctx = BuildContext(spec=spec, plan=plan, onnx_path=onnx_path, work_dir=options.artifacts / spec.name)
        reasons = te.mismatches(
            metadata, platform=platform,
            onnx_sha256=te.sha256_file(onnx_path) or (metadata.onnx_sha256 if metadata else ""),
            options=trt_runtime.engine_options(ctx), calibration_sha256=te.sha256_file(spec.calibration),
        )
        problems += [f"{spec.name}: {plan_path.name}: {reason}" for reason in reasons]
    return problems
