"""TensorRT: ``platform: "tensorrt_plan"``, engines built on the serving GPU from the plan's profiles.

Profile selection (Triton's tensorrt_backend, ``src/instance_state.cc``): an instance creates one
execution context per profile listed in its ``instance_group.profile``; with none listed it uses
profile 0 only ("If not specified, the server will select the first optimization profile by
default", model_config.proto). For each batch it picks the listed profile whose min/max holds the
input shapes and whose ``opt`` is nearest (Manhattan distance, ``GetMostOptimizedProfile``). So the
instance group here lists every profile, which makes all of them usable by every instance.

Engines are reused when the metadata next to the plan still matches the GPU, TensorRT version, ONNX
hash, options and calibration data; otherwise they are rebuilt. With ``multi_arch`` the plan is named
per compute capability and plans for other GPUs already in the repository are kept, written into
``cc_model_filenames`` so one repository serves several GPU architectures.
"""

from __future__ import annotations

import datetime
import time
from pathlib import Path
from typing import Any

import numpy as np

from tritonbundle import proc
from tritonbundle.contract import TensorRTParameters
from tritonbundle.errors import BuildError, ConfigError
from tritonbundle.log import LOG
from tritonbundle.manifest import ModelSpec
from tritonbundle.modelconfig import InstanceGroup, ModelConfig, numpy_dtype
from tritonbundle.runtimes.base import BuildContext, Written, encoder_config, link_or_copy, warmups
from tritonbundle.runtimes.tensorrt import engine as te
from tritonbundle.runtimes.tensorrt.check import (
    PLAN,
    engine_options,
    other_arch_plans,
    plan_name,
    plan_problems,
)

#: Max |TensorRT - ONNX Runtime| per precision for the accuracy gate (manifest ``tolerance`` overrides).
TOLERANCES = {"fp32": 1e-3, "fp16": 2e-2, "bf16": 5e-2, "int8": 1.5e-1}


class TensorRTRuntime:
    name = "tensorrt"
    needs_onnx = True

    def parameters(self, spec: ModelSpec) -> type[TensorRTParameters]:
        return TensorRTParameters

    def check(self, spec: ModelSpec) -> None:
        where = f"model {spec.name}"
        if spec.target != "gpu":
            raise ConfigError(f"{where}.runtime: tensorrt needs target gpu (the CPU server has no TensorRT backend)")
        if spec.precision == "int8" and spec.calibration is None:
            raise ConfigError(
                f"{where}.calibration: precision int8 needs calibration data (a .npz holding one array per input), "
                "or an ONNX with explicit Q/DQ and runtime onnxruntime"
            )

    def padding_policy(self, target: str) -> str:
        return "targets"

    def problems(self, ctx: BuildContext, repository: Path) -> list[str]:
        return plan_problems(ctx, repository, te.current_platform())

    def config(self, ctx: BuildContext, written: Written) -> ModelConfig:
        spec, plan = ctx.spec, ctx.plan
        params = TensorRTParameters(
            padding_policy=plan.policy, padding_targets=plan.padding_targets, max_sequence_length=spec.max_sequence_length,
            execution_context_allocation_strategy="STATIC",
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

    def write_files(self, ctx: BuildContext, version_dir: Path) -> Written:
        if ctx.onnx_path is None:
            raise BuildError(f"model {ctx.spec.name}: the tensorrt runtime needs an ONNX file")
        platform = te.current_platform()
        multi_arch = ctx.spec.multi_arch
        name = plan_name(platform.compute_capability, multi_arch=multi_arch)
        version_dir.mkdir(parents=True, exist_ok=True)
        written = Written(default_model_filename=PLAN)
        if multi_arch:
            others = other_arch_plans(ctx.previous_dir, platform.compute_capability)
            for filename in others.values():
                assert ctx.previous_dir is not None
                link_or_copy(ctx.previous_dir / filename, version_dir / filename)
                link_or_copy(ctx.previous_dir / f"{filename}.json", version_dir / f"{filename}.json")
            written = Written(cc_model_filenames={**others, platform.compute_capability: name})
        build_engine(ctx, platform, version_dir / name)
        return written


def build_engine(ctx: BuildContext, platform: te.Platform, plan_path: Path) -> None:
    """Build (or reuse) one plan, with metadata, reproduce.sh, layer info and the accuracy gate."""
    assert ctx.onnx_path is not None
    options = engine_options(ctx)
    onnx_sha = te.sha256_file(ctx.onnx_path) or ""
    calibration_sha = te.sha256_file(ctx.spec.calibration)
    meta_path = plan_path.with_name(plan_path.name + ".json")
    work = ctx.work_dir / "tensorrt" / platform.fingerprint
    work.mkdir(parents=True, exist_ok=True)
    timing_cache = ctx.work_dir / "tensorrt" / f"timing-{platform.fingerprint}.cache"

    if ctx.previous_dir is not None and not ctx.force:
        previous_plan = ctx.previous_dir / plan_path.name
        previous_meta = te.EngineMetadata.read(ctx.previous_dir / meta_path.name)
        reasons = te.mismatches(
            previous_meta, platform=platform, onnx_sha256=onnx_sha, options=options, calibration_sha256=calibration_sha
        )
        if previous_plan.exists() and not reasons:
            LOG.info("    %s: plan for %s is up to date; skipped the build", ctx.spec.name, platform.fingerprint)
            link_or_copy(previous_plan, plan_path)
            link_or_copy(ctx.previous_dir / meta_path.name, meta_path)
            return
        LOG.info("    %s: rebuilding the plan (%s)", ctx.spec.name, "; ".join(reasons))

    proc.write_reproduce_script(
        work / "reproduce.sh",
        te.trtexec_command(ctx.onnx_path, work / plan_path.name, options, timing_cache=timing_cache,
                           calibration_cache=work / "calibration.cache" if ctx.spec.calibration else None,
                           layer_info=work / "layers.json"),
    )
    start = time.monotonic()
    net = te.NetworkFromOnnxPath(ctx.onnx_path)()
    calibrator = None
    if options.precision == "int8" and ctx.spec.calibration is not None:
        batches = te.calibration_batches(ctx.spec.calibration, [t.name for t in ctx.spec.inputs], 8)
        calibrator = te.entropy_calibrator(batches, work / "calibration.cache")
    create_config = te.CreateConfig(options, platform=platform, calibrator=calibrator)
    config = create_config(net)
    plan = te.EngineFromNetwork(net, config, timing_cache=te.TimingCache(timing_cache))()
    te.SaveEngine(plan, plan_path)()
    elapsed = time.monotonic() - start
    (work / "layers.json").write_text(te.layer_information(plan))
    accuracy_gate(ctx, plan, options.precision)
    meta = te.EngineMetadata(
        tensorrt_version=platform.tensorrt_version, gpu_name=platform.gpu_name,
        compute_capability=platform.compute_capability, onnx_sha256=onnx_sha, options=options.to_json(),
        calibration_sha256=calibration_sha, timing_cache_sha256=te.sha256_file(timing_cache),
        flags=create_config.flags,
        built_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        extra={"build_seconds": f"{elapsed:.1f}"},
    )
    meta_path.write_text(meta.to_json())
    (work / "build.log").write_text(
        f"built {plan_path.name} for {platform.fingerprint} in {elapsed:.1f} s\n"
        f"profiles: {len(options.profiles)}; precision {options.precision}; layers: layers.json\n"
    )
    LOG.info("    %s: built %s in %.0f s (%d profiles)", ctx.spec.name, plan_path.name, elapsed, len(options.profiles))


def gate_inputs(ctx: BuildContext, profile_index: int, seed: int) -> dict[str, np.ndarray[Any, Any]]:
    """Sample inputs at a profile's opt shape: realistic token ids for text models, random tensors else."""
    profile = ctx.plan.profiles[profile_index]
    rng = np.random.default_rng(seed)
    feed: dict[str, np.ndarray[Any, Any]] = {}
    for t in ctx.spec.inputs:
        shape = profile.shapes[t.name][1]
        if ctx.spec.task == "text-embedding":
            batch, length = shape
            if "mask" in t.name:
                feed[t.name] = np.ones(shape, dtype=np.int64)
            else:
                ids = rng.integers(1000, 30000, size=shape, dtype=np.int64)
                ids[:, 0] = 101
                feed[t.name] = ids
        elif t.dtype.startswith(("INT", "UINT", "BOOL")):
            feed[t.name] = np.zeros(shape, dtype=numpy_dtype(t.dtype))
        else:
            feed[t.name] = rng.standard_normal(shape).astype(numpy_dtype(t.dtype))
    return feed


def accuracy_gate(ctx: BuildContext, plan: bytes, precision: str) -> None:
    """TensorRT vs ONNX Runtime at every profile's opt shape; fail the build naming the worst element."""
    import onnxruntime as ort
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner

    assert ctx.onnx_path is not None
    tolerance = ctx.spec.tolerance or TOLERANCES[precision]
    session = ort.InferenceSession(str(ctx.onnx_path), providers=["CPUExecutionProvider"])
    outputs = [t.name for t in ctx.spec.outputs]
    worst: tuple[float, Any, str, int] = (0.0, None, "", -1)
    for index in range(len(ctx.plan.profiles)):
        feed = gate_inputs(ctx, index, seed=index)
        expected = dict(zip(outputs, session.run(outputs, feed)))
        with TrtRunner(EngineFromBytes(plan), optimization_profile=index) as runner:
            got = runner.infer(feed)
        for name in outputs:
            diff = np.abs(np.asarray(got[name], dtype=np.float32) - expected[name].astype(np.float32))
            where = np.unravel_index(int(diff.argmax()), diff.shape)
            if float(diff.max()) > worst[0]:
                worst = (float(diff.max()), where, name, index)
    if worst[0] > tolerance:
        value, where, name, index = worst
        raise BuildError(
            f"model {ctx.spec.name}: accuracy gate failed: {name}{list(map(int, where))} differs from ONNX Runtime "
            f"by {value:.3g} in profile {index} ({precision}, tolerance {tolerance:g}); the plan was not installed"
        )
    LOG.info("    %s: accuracy gate passed (max |TensorRT - ONNX Runtime| = %.2e, tolerance %g)", ctx.spec.name,
             worst[0], tolerance)
