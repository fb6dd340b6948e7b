"""The build stage, end to end: ``tritonbundle export | plan | repo | build``.

    manifest + traffic sample -> plan (pure) -> ONNX (export + parity) -> graph check
        -> engines/model files + config.pbtxt (staged) -> checks -> swap into the repository

This module orchestrates; what a model becomes is the runtime plug-in's business
(:mod:`tritonbundle.runtimes`), how buckets are chosen the planner's (:mod:`tritonbundle.plan`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from tritonbundle import manifest as manifest_mod
from tritonbundle import plan as planner
from tritonbundle import recipes, runtimes, tasks
from tritonbundle import traffic as traffic_mod
from tritonbundle.build import onnx_check
from tritonbundle.build.repository import ModelArtifacts, write_repository
from tritonbundle.errors import BuildError, ConfigError
from tritonbundle.log import LOG, step
from tritonbundle.manifest import Manifest, ModelSpec

DEFAULT_MANIFEST = Path("build/models.yaml")
DEFAULT_ARTIFACTS = Path("build/artifacts")
DEFAULT_REPOSITORY = Path("model_repository")


@dataclass(frozen=True)
class BuildOptions:
    manifest: Path = DEFAULT_MANIFEST
    repository: Path = DEFAULT_REPOSITORY
    artifacts: Path = DEFAULT_ARTIFACTS
    traffic: Path | None = None
    models: tuple[str, ...] = ()
    overrides: dict[str, object] = field(default_factory=dict)
    #: Rebuild engines and weights even when their metadata still matches (never re-exports: that
    #: needs torch, which the TensorRT image does not have).
    force: bool = False
    #: Export ONNX from the recipes (else use the exports already in ``artifacts``).
    export: bool = True
    #: Export again even when the export is up to date (needs torch).
    reexport: bool = False


def manifest_source(path: Path) -> str:
    """The manifest as a config's header names it: relative to the working directory when inside it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def load_manifest(options: BuildOptions) -> Manifest:
    """The manifest with the command line's overrides, every model checked by its runtime."""
    m = manifest_mod.load(options.manifest, runtimes=runtimes.names(), recipes=tuple(recipes.RECIPES))
    m = manifest_mod.override(m, **options.overrides)
    if options.models:
        unknown = sorted(set(options.models) - {s.name for s in m.models})
        if unknown:
            raise ConfigError(f"{options.manifest}: no model named {', '.join(unknown)}")
        m = dataclasses.replace(m, models=tuple(s for s in m.models if s.name in options.models))
    for spec in m.models:
        try:
            check(spec)
        except ConfigError as e:
            raise ConfigError(f"{options.manifest}: {e}") from e
    return m


def check(spec: ModelSpec) -> None:
    """Refuse, with a :class:`ConfigError` naming the key, a model its runtime or its task cannot serve."""
    runtimes.get(spec.runtime).check(spec)
    tasks.get(spec.task).check(spec)


def traffic_for(spec: ModelSpec, options: BuildOptions) -> traffic_mod.TrafficSample | None:
    """The traffic sample a model's dynamic axes are planned from (None: it has none, or every named axis
    other than sequence has ``axes.<axis>.max`` and there is no sample)."""
    path = options.traffic or spec.traffic
    if not spec.axes:
        return None
    if path is None:
        if not spec.has_sequence and all(a.max for a in spec.axes):
            return None  # one bucket [1, max] per axis
        raise ConfigError(
            f"model {spec.name}: no traffic sample: set 'traffic' in {options.manifest} or pass --traffic"
        )
    return traffic_mod.load(path)


def plan_model(spec: ModelSpec, options: BuildOptions) -> planner.ModelPlan:
    policy = runtimes.get(spec.runtime).padding_policy(spec.target)
    return planner.plan_model(spec, traffic_for(spec, options), policy=policy)


def plan_all(options: BuildOptions, manifest: Manifest | None = None) -> list[tuple[ModelSpec, planner.ModelPlan]]:
    m = manifest or load_manifest(options)
    out = []
    for spec in m.models:
        plan = plan_model(spec, options)
        out.append((spec, plan))
        work = options.artifacts / spec.name
        work.mkdir(parents=True, exist_ok=True)
        (work / "plan.json").write_text(json.dumps(plan.to_json(), indent=2))
    return out


def export_all(options: BuildOptions, manifest: Manifest | None = None) -> dict[str, ModelArtifacts]:
    """Export (or copy) what each model's runtime serves: the ONNX file when it needs one, the tokenizer."""
    from tritonbundle.build.export import copy_tokenizer, export

    m = manifest or load_manifest(options)
    out = {}
    for spec in m.models:
        work = options.artifacts / spec.name
        work.mkdir(parents=True, exist_ok=True)
        tokenizer = copy_tokenizer(spec, work)
        if not runtimes.get(spec.runtime).needs_onnx:
            out[spec.name] = ModelArtifacts(None, tokenizer)
            continue
        step(f"export {spec.name}")
        # Check the user's file (so errors name it) before copying or exporting anything.
        if spec.onnx_path is not None:
            onnx_check.check_graph(spec, spec.onnx_path)
        result = export(spec, work, force=options.reexport)
        if spec.onnx_path is None:
            onnx_check.check_graph(spec, result.onnx_path)
        out[spec.name] = ModelArtifacts(result.onnx_path, tokenizer)
    return out


def existing_artifacts(spec: ModelSpec, options: BuildOptions) -> ModelArtifacts:
    work = options.artifacts / spec.name
    onnx_path: Path | None = None
    if runtimes.get(spec.runtime).needs_onnx:
        onnx_path = spec.onnx_path or work / "model.onnx"
        if not onnx_path.exists():
            raise ConfigError(
                f"model {spec.name}: {onnx_path} does not exist; run `tritonbundle export` first (or `tritonbundle build`)"
            )
        onnx_check.check_graph(spec, onnx_path)
    tokenizer = work / "tokenizer.json"
    if spec.text and not tokenizer.exists():
        if spec.tokenizer_file is not None:
            tokenizer = spec.tokenizer_file
        else:
            raise ConfigError(f"model {spec.name}: {tokenizer} does not exist; run `tritonbundle export` first")
    return ModelArtifacts(onnx_path, tokenizer if spec.text else None)


def at_precision(spec: ModelSpec, plan: planner.ModelPlan, artifacts: ModelArtifacts, options: BuildOptions) -> ModelArtifacts:
    """The ONNX at the manifest's precision (:mod:`tritonbundle.build.precision`), accuracy-checked on
    the CPU before any engine is built; the FP32 export stays the reference."""
    if artifacts.onnx_path is None or spec.precision == "fp32":
        return artifacts
    from tritonbundle.build.precision import lower

    step(f"{spec.name}: {spec.precision} ONNX")
    lowered = lower(spec, plan, artifacts.onnx_path, artifacts.tokenizer_path, options.artifacts / spec.name / "precision")
    return dataclasses.replace(artifacts, onnx_path=lowered.onnx_path, reference_onnx=lowered.reference)


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
        artifacts = {spec.name: existing_artifacts(spec, options) for spec in m.models}
    artifacts = {spec.name: at_precision(spec, plans[spec.name], artifacts[spec.name], options) for spec in m.models}
    step(f"write {options.repository}")
    entries = [(spec, plans[spec.name], artifacts[spec.name]) for spec in m.models]
    return write_repository(entries, options.repository, work_root=options.artifacts, force=options.force,
                            source=manifest_source(options.manifest))


def check_repository(options: BuildOptions) -> list[str]:
    """Why the installed repository is not what this build would write (empty: it is): every config
    and file compared with a fresh staging of the whole repository, and each engine checked by its
    runtime (TensorRT: the plan's metadata against this GPU, TensorRT, ONNX and options). Nothing is
    exported or built. For init containers: ``tritonbundle build --check || tritonbundle build``."""
    from tritonbundle.build.repository import differences

    m = load_manifest(options)
    plans = {spec.name: plan_model(spec, options) for spec in m.models}
    try:
        entries = [(spec, plans[spec.name], at_precision(spec, plans[spec.name], existing_artifacts(spec, options), options))
                   for spec in m.models]
        return differences(entries, options.repository, work_root=options.artifacts,
                           source=manifest_source(options.manifest))
    except BuildError as e:  # an engine that needs a rebuild, an export that is missing
        return [str(e)]
    except ConfigError as e:
        return [str(e)]
