"""TensorRT: ``platform: "tensorrt_plan"``, engines built on the serving GPU from the plan's profiles.

Profile selection (Triton's tensorrt_backend, ``src/instance_state.cc``): an instance creates one
execution context per profile listed in its ``instance_group.profile``; with none listed it uses
profile 0 only ("If not specified, the server will select the first optimization profile by
default", model_config.proto). For each batch it picks the listed profile whose min/max holds the
input shapes and whose ``opt`` is nearest (Manhattan distance, ``GetMostOptimizedProfile``). So the
instance group here lists every profile, which makes all of them usable by every instance.

The engine is built from the ONNX at the manifest's precision (``tritonbundle.build.precision``:
FP16/BF16 rewritten, INT8 as Q/DQ), strongly typed, and checked against the FP32 ONNX before it is
installed. Engines are reused when the metadata next to the plan still matches the GPU, TensorRT
version, ONNX hash (which covers the precision and the INT8 scales) and options; otherwise they are
rebuilt. With ``multi_arch`` the plan is named
per compute capability and plans for other GPUs already in the repository are kept, written into
``cc_model_filenames`` so one repository serves several GPU architectures.
"""

from __future__ import annotations

import datetime
import time
from pathlib import Path
from typing import Any

from tritonbundle import proc
from tritonbundle.contract import Parameters, TensorRTParameters
from tritonbundle.errors import BuildError, ConfigError
from tritonbundle.log import LOG
from tritonbundle.manifest import ModelSpec
from tritonbundle.modelconfig import InstanceGroup, ModelConfig
from tritonbundle.runtimes import accuracy
from tritonbundle.runtimes.base import (
    BuildContext,
    Written,
    encoder_config,
    link_or_copy,
    needs_calibration,
    no_text_model,
    warmups,
)
from tritonbundle.runtimes.tensorrt import engine as te
from tritonbundle.runtimes.tensorrt.check import (
    PLAN,
    engine_options,
    other_arch_plans,
    plan_name,
)
from tritonbundle.runtimes.tensorrt.clamp import clamp_indices


class TensorRTRuntime:
    name = "tensorrt"
    needs_onnx = True

    def parameters(self, spec: ModelSpec) -> type[TensorRTParameters]:
        return TensorRTParameters

    def check(self, spec: ModelSpec) -> None:
        where = f"model {spec.name}"
        if spec.target != "gpu":
            raise ConfigError(f"{where}.runtime: tensorrt needs target gpu (the CPU server has no TensorRT backend)")
        no_text_model(spec, self.name)
        needs_calibration(spec)

    def padding_policy(self, target: str) -> str:
        return "targets"

    def config(self, ctx: BuildContext, written: Written) -> ModelConfig:
        spec, plan = ctx.spec, ctx.plan
        params = TensorRTParameters(
            padding_policy=plan.policy, padding_targets=plan.padding_targets, max_sequence_length=spec.max_sequence_length,
            # One execution context per listed profile; STATIC would size each for the largest profile
            # (tensorrt_backend src/model_state.cc, r25.05+: STATIC | ON_PROFILE_CHANGE).
            execution_context_allocation_strategy="ON_PROFILE_CHANGE",
        )
        return encoder_config(
            ctx, params, ragged=False, kind="KIND_GPU", platform="tensorrt_plan",
            instance_groups=(
                InstanceGroup(
                    count=spec.instances, kind="KIND_GPU", profiles=tuple(str(p.index) for p in plan.profiles)
                ),
            ),
            warmups=warmups(ctx, every_bucket=True),
            cc_model_filenames=written.cc_model_filenames,
            default_model_filename=written.default_model_filename,
        )

    def text_model(self, ctx: BuildContext, *args: Any) -> tuple[ModelConfig, type[Parameters]]:
        no_text_model(ctx.spec, self.name)  # check() refuses the knob before this is reached
        raise AssertionError("unreachable")

    def write_files(self, ctx: BuildContext, version_dir: Path) -> Written:
        if ctx.onnx_path is None:
            raise BuildError(f"model {ctx.spec.name}: the tensorrt runtime needs an ONNX file")
        platform = te.current_platform()
        multi_arch = ctx.spec.multi_arch
        name = plan_name(platform.compute_capability, multi_arch=multi_arch)
        version_dir.mkdir(parents=True, exist_ok=True)
        written = Written(default_model_filename=PLAN)
        # Once per model: the options read the graph's token tables, the hash reads every weight.
        options, onnx_sha = engine_options(ctx), te.sha256_file(ctx.onnx_path) or ""
        if multi_arch:
            others = other_arch_plans(ctx.previous_dir, platform, onnx_sha256=onnx_sha, options=options)
            for filename in others.values():
                assert ctx.previous_dir is not None
                link_or_copy(ctx.previous_dir / filename, version_dir / filename)
                link_or_copy(ctx.previous_dir / f"{filename}.json", version_dir / f"{filename}.json")
            written = Written(cc_model_filenames={**others, platform.compute_capability: name})
        build_engine(ctx, platform, version_dir / name, options=options, onnx_sha=onnx_sha)
        return written


def build_engine(ctx: BuildContext, platform: te.Platform, plan_path: Path, *, options: te.EngineOptions,
                 onnx_sha: str) -> None:
    """Build (or reuse) one plan, with metadata, reproduce.sh, layer info and the accuracy gate;
    ``options`` and ``onnx_sha`` are :func:`engine_options` and the ONNX file's hash."""
    assert ctx.onnx_path is not None
    meta_path = plan_path.with_name(plan_path.name + ".json")
    work = ctx.work_dir / "tensorrt" / platform.fingerprint
    # One timing cache per GPU model and TensorRT version: a new GPU starts its own (timings of
    # another GPU or TensorRT do not carry over).
    timing_cache = ctx.work_dir / "tensorrt" / f"timing-{platform.fingerprint}.cache"

    reasons = ["--force"] if ctx.force else ["no previous repository"]
    if ctx.previous_dir is not None and not ctx.force:
        previous_plan = ctx.previous_dir / plan_path.name
        previous_meta = te.EngineMetadata.read(ctx.previous_dir / meta_path.name)
        reasons = te.mismatches(previous_meta, platform=platform, onnx_sha256=onnx_sha, options=options)
        if previous_plan.exists() and not reasons:
            LOG.info("    %s: plan for %s is up to date; skipped the build", ctx.spec.name, platform.fingerprint)
            link_or_copy(previous_plan, plan_path)
            link_or_copy(ctx.previous_dir / meta_path.name, meta_path)
            return
        reasons = reasons or [f"{previous_plan.name} is missing"]
    if ctx.check_only:
        raise StalePlan(f"{ctx.spec.name}: {plan_path.name} needs a rebuild: {'; '.join(reasons)}")
    LOG.info("    %s: building the plan (%s)", ctx.spec.name, "; ".join(reasons))
    work.mkdir(parents=True, exist_ok=True)
    source = ctx.onnx_path
    if options.index_clamps:  # ids past the vocabulary must not read past the table on the GPU
        source = clamp_indices(ctx.onnx_path, work / "clamped" / "model.onnx", dict(options.index_clamps))
    proc.write_reproduce_script(
        work / "reproduce.sh",
        te.trtexec_command(source, work / plan_path.name, options, timing_cache=timing_cache,
                           layer_info=work / "layers.json"),
    )
    start = time.monotonic()
    net = te.NetworkFromOnnxPath(source)()
    create_config = te.CreateConfig(options, platform=platform)
    config = create_config(net)
    plan = te.EngineFromNetwork(net, config, timing_cache=te.TimingCache(timing_cache))()
    elapsed = time.monotonic() - start
    (work / "layers.json").write_text(te.layer_information(plan, version_compatible=options.version_compatible))
    accuracy_gate(ctx, plan, options)
    te.SaveEngine(plan, plan_path)()
    meta = te.EngineMetadata(
        tensorrt_version=platform.tensorrt_version, gpu_name=platform.gpu_name,
        compute_capability=platform.compute_capability, onnx_sha256=onnx_sha, options=options.to_json(),
        timing_cache_sha256=te.sha256_file(timing_cache), flags=create_config.flags,
        built_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        extra={"build_seconds": f"{elapsed:.1f}"},
    )
    meta_path.write_text(meta.to_json())
    (work / "build.log").write_text(
        f"built {plan_path.name} for {platform.fingerprint} in {elapsed:.1f} s\n"
        f"profiles: {len(options.profiles)}; precision {options.precision} (in the ONNX, strongly typed); "
        f"flags {', '.join(create_config.flags) or '-'}; layers: layers.json\n"
    )
    LOG.info("    %s: built %s in %.0f s (%d profiles)", ctx.spec.name, plan_path.name, elapsed, len(options.profiles))


class StalePlan(BuildError):
    """``build --check``: a plan would have to be rebuilt."""


def profile_for(ctx: BuildContext, feed: accuracy.Feed) -> int:
    """The profile Triton runs ``feed`` with: among the profiles whose min/max hold every input's shape,
    the one whose ``opt`` is nearest (Manhattan distance; the first on a tie), as tensorrt_backend's
    ``GetMostOptimizedProfile`` (``src/instance_state.cc``) picks."""
    fitting = [p for p in ctx.plan.profiles if accuracy.fits(p, feed)]
    if not fitting:
        raise BuildError(f"model {ctx.spec.name}: no profile holds the gate input shapes {[a.shape for a in feed.values()]}")

    def distance(p: Any) -> int:
        return sum(abs(o - d) for n, a in feed.items() for o, d in zip(p.shapes[n][1], a.shape))

    return int(min(fitting, key=lambda p: (distance(p), p.index)).index)


def accuracy_gate(ctx: BuildContext, plan: bytes, options: te.EngineOptions) -> None:
    """TensorRT vs the FP32 ONNX (ONNX Runtime) on traffic-shaped inputs, one batch per profile, with the
    precision's tolerance (:mod:`tritonbundle.runtimes.accuracy`); fail the build naming the figures.

    Feeds run profile by profile with one Polygraphy ``TrtRunner`` alive at a time, its context's device
    memory sized for that profile only (``allocation_strategy="profile"``: a USER_MANAGED context that
    Polygraphy sizes from the profile's max shapes, ``polygraphy/backend/trt/runner.py`` activate_impl and
    _infer_impl) and freed before the next profile's. Its outputs are views of buffers it reuses;
    :func:`accuracy.gate` copies them."""
    from polygraphy.backend.trt import TrtRunner

    reference = ctx.reference_onnx or ctx.onnx_path
    assert reference is not None
    engine = te.deserialize(plan, version_compatible=options.version_compatible)
    inputs = sorted(accuracy.feeds(ctx.spec, ctx.plan, tokenizer_json=ctx.tokenizer_json, purpose="gate"),
                    key=lambda feed: profile_for(ctx, feed))
    active: list[tuple[int, Any]] = []  # (profile, runner): at most one

    def release() -> None:
        while active:
            active.pop()[1].deactivate()

    def run(feed: accuracy.Feed) -> accuracy.Outputs:
        index = profile_for(ctx, feed)
        if not active or active[0][0] != index:
            release()
            runner = TrtRunner(engine, optimization_profile=index, allocation_strategy="profile")
            runner.activate()
            active.append((index, runner))
        out: accuracy.Outputs = active[0][1].infer(feed)
        return out

    try:
        result = accuracy.gate("TensorRT engine", ctx.spec, options.precision, accuracy.onnx_runner(reference), run,
                               inputs)
    finally:
        release()
    LOG.info("    %s: %s", ctx.spec.name, result.describe())
    if not result.passed:
        raise BuildError(f"model {ctx.spec.name}: accuracy gate failed: {result.describe()}; worst at {result.worst}. "
                         "The plan was not installed")
