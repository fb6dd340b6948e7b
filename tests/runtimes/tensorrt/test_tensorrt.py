"""The TensorRT path. TensorRT cannot be installed on these machines (its wheels come only from
NVIDIA's index, which is unreachable), so: the config, trtexec command, metadata and plan reuse are
tested here as pure code; the calls the builder makes are checked with a recording double of the
TensorRT module (it checks calls, it never stands in for an engine); the builder code is type-checked
by mypy against TensorRT 10.13 (tensorrt-stubs) and 11 (typings/tensorrt11); the engine build itself
runs only where ``tensorrt`` imports (the NGC image)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tritonbundle import manifest, traffic
from tritonbundle import plan as planner
from tritonbundle.errors import BuildError
from tritonbundle.modelconfig import parse_pbtxt
from tritonbundle.runtimes.base import BuildContext, Written
from tritonbundle.runtimes.tensorrt import engine as te
from tritonbundle.runtimes.tensorrt.check import engine_options
from tritonbundle.runtimes.tensorrt.plugin import TensorRTRuntime

ROOT = Path(__file__).resolve().parents[3]
H100 = te.Platform("NVIDIA H100 80GB HBM3", "9.0", "10.13.2.6")


def _ctx(tmp_path: Path, **overrides: object) -> BuildContext:
    m = manifest.override(manifest.load(ROOT / "build" / "models.yaml"), target="gpu", runtime="tensorrt", **overrides)
    spec = m.model("minilm")
    plan = planner.plan_model(spec, traffic.load(spec.traffic))  # type: ignore[arg-type]
    return BuildContext(spec=spec, plan=plan, onnx_path=tmp_path / "model.onnx", work_dir=tmp_path)


def test_config_is_a_tensorrt_plan_with_every_profile_usable(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    cfg = parse_pbtxt(TensorRTRuntime().config(ctx, Written(default_model_filename="model.plan")).to_pbtxt())
    assert cfg.platform == "tensorrt_plan"
    assert cfg.max_batch_size == 32
    assert [list(i.dims) for i in cfg.input] == [[-1], [-1]]
    assert not any(i.allow_ragged_batch for i in cfg.input)
    (group,) = cfg.instance_group
    assert group.kind == group.KIND_GPU
    assert list(group.profile) == [str(i) for i in range(len(ctx.plan.profiles))] == [str(i) for i in range(12)]
    assert list(cfg.dynamic_batching.preferred_batch_size) == [8, 32]
    assert cfg.default_model_filename == "model.plan"
    assert cfg.parameters["padding_targets"].string_value == ",".join(map(str, ctx.plan.padding_targets))


def test_warmup_covers_every_bucket(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    cfg = parse_pbtxt(TensorRTRuntime().config(ctx, Written()).to_pbtxt())
    shapes = {(w.batch_size, w.inputs["input_ids"].dims[0]) for w in cfg.model_warmup}
    expected = {(b, s) for b in (1, 8, 32) for s in ctx.plan.padding_targets}
    assert shapes == expected
    assert all(w.inputs["input_ids"].zero_data for w in cfg.model_warmup), "token ids must stay valid indices"


def test_multi_arch_config_lists_a_plan_per_compute_capability(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, multi_arch=True)
    written = Written(cc_model_filenames={"8.0": "model_cc80.plan", "9.0": "model_cc90.plan"})
    cfg = parse_pbtxt(TensorRTRuntime().config(ctx, written).to_pbtxt())
    assert dict(cfg.cc_model_filenames) == {"8.0": "model_cc80.plan", "9.0": "model_cc90.plan"}
    assert cfg.default_model_filename == ""


def test_trtexec_command_reproduces_every_profile_and_option(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, precision="fp16", hardware_compatibility="ampere+", version_compatible=True)
    argv = te.trtexec_command(Path("m.onnx"), Path("m.plan"), engine_options(ctx), timing_cache=Path("t.cache"),
                              layer_info=Path("layers.json"))
    assert argv[:4] == ["/usr/src/tensorrt/bin/trtexec", "--onnx=m.onnx", "--saveEngine=m.plan", "--stronglyTyped"]
    assert [a for a in argv if a.startswith("--profile=")] == [f"--profile={i}" for i in range(12)]
    first = ctx.plan.profiles[0].shapes["input_ids"]
    assert f"--minShapes=input_ids:{first[0][0]}x{first[0][1]},attention_mask:{first[0][0]}x{first[0][1]}" in argv
    for flag in ("--memPoolSize=workspace:4096M", "--builderOptimizationLevel=3", "--timingCacheFile=t.cache",
                 "--hardwareCompatibilityLevel=ampere+", "--versionCompatible", "--exportLayerInfo=layers.json"):
        assert flag in argv
    assert "--fp16" not in argv and "--noTF32" not in argv  # the precision is in the ONNX


#: Options both trtexec 10.13.3 and 11.1 parse (samples/common/sampleOptions.cpp: getAndDelOption /
#: getAndDelNegOption calls; in 11.1 --fp16/--bf16/--int8/--best/--calib are gone and fail with
#: "Unknown option"). Values of --hardwareCompatibilityLevel: "none", "ampere+", "sameComputeCapability"
#: (10.13.3 lines 1525-1542, 11.1 lines 1388-1405); --profilingVerbosity: layer_names_only|none|detailed.
TRTEXEC_OPTIONS = {
    "--onnx", "--saveEngine", "--stronglyTyped", "--profile", "--minShapes", "--optShapes", "--maxShapes",
    "--memPoolSize", "--builderOptimizationLevel", "--noTF32", "--hardwareCompatibilityLevel", "--versionCompatible",
    "--timingCacheFile", "--profilingVerbosity", "--dumpLayerInfo", "--exportLayerInfo", "--skipInference",
}
TRTEXEC_VALUES = {"--hardwareCompatibilityLevel": {"none", "ampere+", "sameComputeCapability"},
                  "--profilingVerbosity": {"layer_names_only", "none", "detailed"}}


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16", "int8"])
@pytest.mark.parametrize("hardware", ["none", "ampere+", "same-compute-capability"])
def test_reproduce_sh_uses_only_options_trtexec_10_and_11_both_accept(tmp_path: Path, precision: str, hardware: str) -> None:
    ctx = _ctx(tmp_path, precision=precision, hardware_compatibility=hardware, version_compatible=True)
    argv = te.trtexec_command(Path("m.onnx"), Path("m.plan"), engine_options(ctx), timing_cache=Path("t.cache"),
                              layer_info=Path("layers.json"))
    for arg in argv[1:]:
        name, _, value = arg.partition("=")
        assert name in TRTEXEC_OPTIONS, arg
        if name in TRTEXEC_VALUES:
            assert value in TRTEXEC_VALUES[name], arg
    assert ("--noTF32" in argv) == (precision == "fp32")


def test_metadata_decides_reuse_or_rebuild(tmp_path: Path) -> None:
    options = engine_options(_ctx(tmp_path))
    meta = te.EngineMetadata(tensorrt_version="10.13.2.6", gpu_name=H100.gpu_name, compute_capability="9.0",
                             onnx_sha256="abc", options=options.to_json())
    same = dict(platform=H100, onnx_sha256="abc", options=options)
    assert te.mismatches(meta, **same) == []  # type: ignore[arg-type]
    a100 = te.Platform("NVIDIA A100-SXM4-80GB", "8.0", "10.13.2.6")
    assert "GPU" in te.mismatches(meta, **{**same, "platform": a100})[0]  # type: ignore[arg-type]
    newer = te.Platform(H100.gpu_name, "9.0", "11.1.0.106")
    assert "TensorRT 10.13.2.6 != 11.1.0.106" in te.mismatches(meta, **{**same, "platform": newer})  # type: ignore[arg-type]
    assert "the ONNX model changed" in te.mismatches(meta, **{**same, "onnx_sha256": "def"})  # type: ignore[arg-type]
    fp16 = engine_options(_ctx(tmp_path, precision="fp16"))
    assert "build options or profiles changed" in te.mismatches(meta, **{**same, "options": fp16})  # type: ignore[arg-type]
    assert te.mismatches(None, **same) == ["no plan metadata"]  # type: ignore[arg-type]


def test_metadata_round_trips_through_json(tmp_path: Path) -> None:
    meta = te.EngineMetadata("10.13.2.6", "GPU", "9.0", "abc", {"precision": "fp32"}, flags=("-TF32",))
    path = tmp_path / "model.plan.json"
    path.write_text(meta.to_json())
    assert te.EngineMetadata.read(path) == meta
    path.write_text("{not json")
    assert te.EngineMetadata.read(path) is None


def test_bf16_needs_ampere_and_says_so() -> None:
    te.check_precision("bf16", "8.0")
    te.check_precision("fp16", "7.5")
    with pytest.raises(BuildError, match="precision bf16 needs compute capability >= 8.0, this GPU has 7.5"):
        te.check_precision("bf16", "7.5")


def test_fingerprint_names_gpu_capability_and_tensorrt() -> None:
    assert H100.fingerprint == "nvidia-h100-80gb-hbm3-cc90-trt10.13.2.6"


def test_engine_options_need_a_profile() -> None:
    with pytest.raises(BuildError, match="at least one optimization profile"):
        te.EngineOptions()


def _mypy(*paths: str, mypypath: Path = ROOT / ".tools" / "stubs") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MYPYPATH": str(mypypath)}
    return subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", *paths], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_tensorrt_code_type_checks_against_tensorrt_10_stubs() -> None:
    if not (ROOT / ".tools" / "stubs" / "tensorrt").exists():
        pytest.fail("tensorrt-stubs are missing from .tools/stubs: run `make install`")
    result = _mypy("tritonbundle/runtimes/tensorrt")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_tensorrt_code_type_checks_against_tensorrt_11() -> None:
    result = _mypy("tritonbundle/runtimes/tensorrt", mypypath=ROOT / "typings" / "tensorrt11")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_tensorrt_11_check_flags_what_tensorrt_11_removed(tmp_path: Path) -> None:
    """Proves the TensorRT 11 stubs are not vacuous: the calls the old code made fail them."""
    old = tmp_path / "weak_typing.py"
    old.write_text(
        "import tensorrt as trt\n"
        "def build(builder: trt.Builder, config: trt.IBuilderConfig) -> None:\n"
        "    config.set_flag(trt.BuilderFlag.FP16)\n"
        "    if builder.platform_has_fast_int8:\n"
        "        config.int8_calibrator = None\n"
        "class C(trt.IInt8EntropyCalibrator2):\n"
        "    pass\n"
    )
    result = _mypy(str(old), mypypath=ROOT / "typings" / "tensorrt11")
    assert result.returncode != 0
    for removed in ("FP16", "platform_has_fast_int8", "int8_calibrator", "IInt8EntropyCalibrator2"):
        assert removed in result.stdout, result.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_type_check_flags_calls_tensorrt_10_removed(tmp_path: Path) -> None:
    """Proves the check above is not vacuous: TensorRT 8-era calls fail it."""
    old = tmp_path / "old_api.py"
    old.write_text(
        "import tensorrt as trt\n"
        "def build(builder: trt.Builder, network: trt.INetworkDefinition, config: trt.IBuilderConfig,\n"
        "          context: trt.IExecutionContext) -> None:\n"
        "    config.max_workspace_size = 1 << 30\n"
        "    builder.build_engine(network, config)\n"
        "    context.set_binding_shape(0, (1, 8))\n"
    )
    result = _mypy(str(old))
    assert result.returncode != 0
    for removed in ("max_workspace_size", "build_engine", "set_binding_shape"):
        assert removed in result.stdout, result.stdout


def _tensorrt_or_skip() -> object:
    return pytest.importorskip(
        "tensorrt",
        reason="TensorRT is not installable on these machines (NVIDIA's package index is unreachable); "
        "this test runs inside the pinned NGC TensorRT image on a GPU host",
    )


@pytest.mark.tensorrt
@pytest.mark.gpu
def test_builds_a_plan_that_passes_the_accuracy_gate_and_is_reused(tmp_path: Path, exported_minilm: Path) -> None:
    _tensorrt_or_skip()
    from tritonbundle.build.stage import BuildOptions, build

    repo = tmp_path / "repo"
    options = BuildOptions(manifest=ROOT / "build" / "models.yaml", repository=repo, artifacts=ROOT / "build" / "artifacts",
                           overrides={"target": "gpu", "runtime": "tensorrt", "precision": "fp16"}, export=False)
    build(options)
    plan = repo / "minilm_encoder" / "1" / "model.plan"
    assert plan.exists() and (plan.parent / "model.plan.json").exists()
    before = plan.stat().st_mtime_ns
    build(options)
    assert plan.stat().st_mtime_ns == before, "an up-to-date plan must be reused, not rebuilt"


def test_build_check_without_tensorrt_names_the_cause(tmp_path: Path) -> None:
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        pass
    else:  # pragma: no cover - NGC image
        pytest.skip("TensorRT is importable here")
    from tritonbundle.build.stage import BuildOptions, check_repository

    options = BuildOptions(manifest=ROOT / "build" / "models.yaml", repository=tmp_path, artifacts=ROOT / "build" / "artifacts",
                           overrides={"target": "gpu", "runtime": "tensorrt"})
    problems = check_repository(options)
    assert any("TensorRT is not importable here: build engines inside the pinned NGC TensorRT image" in p for p in problems), problems


def _build_options(tmp_path: Path, **overrides: object) -> object:
    from tritonbundle.build.stage import BuildOptions

    return BuildOptions(manifest=ROOT / "build" / "models.yaml", repository=tmp_path / "repo", artifacts=tmp_path,
                        overrides=dict(overrides))


def test_the_build_refuses_tensorrt_on_the_cpu_target(tmp_path: Path) -> None:
    from tritonbundle.build.stage import load_manifest
    from tritonbundle.errors import ConfigError

    with pytest.raises(ConfigError, match=r"models.yaml: model minilm.runtime: tensorrt needs target gpu"):
        load_manifest(_build_options(tmp_path, runtime="tensorrt"))  # type: ignore[arg-type]


def test_int8_from_the_command_line_meets_the_calibration_check(tmp_path: Path) -> None:
    """--precision int8 (CLI or Helm) on a model that is not a text model and has no calibration data is
    refused before anything is built; a text model calibrates on its traffic sample."""
    import yaml

    from tests.build.onnx_models import image_classifier
    from tritonbundle.build.stage import BuildOptions, load_manifest
    from tritonbundle.errors import ConfigError

    image_classifier(tmp_path / "img.onnx")
    manifest = tmp_path / "models.yaml"
    manifest.write_text(yaml.safe_dump({"version": 1, "models": [{
        "name": "img", "source": {"onnx": "img.onnx"}, "target": "gpu", "runtime": "tensorrt",
        "inputs": [{"name": "pixels", "dtype": "FP32", "shape": ["batch", 3, 8, 8]}],
        "outputs": [{"name": "logits", "dtype": "FP32", "shape": ["batch", 10]}]}]}))
    with pytest.raises(ConfigError, match=r"model img.calibration: precision int8 needs calibration data"):
        load_manifest(BuildOptions(manifest=manifest, overrides={"precision": "int8"}))
    assert load_manifest(_build_options(tmp_path, runtime="tensorrt", target="gpu", precision="int8")).models  # type: ignore[arg-type]


def test_profile_opt_is_the_edge_the_server_pads_to(tmp_path: Path) -> None:
    """Under the targets policy the engine only ever sees bucket edges: opt must be the served shape."""
    ctx = _ctx(tmp_path)
    for profile in ctx.plan.profiles:
        assert profile.sequence is not None
        lo, opt, hi = profile.shapes["input_ids"]
        assert opt == hi == (profile.batch.max, profile.sequence.max)
    assert ctx.plan.policy == "targets"


def test_execution_contexts_allocate_per_profile(tmp_path: Path) -> None:
    cfg = parse_pbtxt(TensorRTRuntime().config(_ctx(tmp_path), Written()).to_pbtxt())
    assert cfg.parameters["execution_context_allocation_strategy"].string_value == "ON_PROFILE_CHANGE"


def test_warm_up_of_a_model_without_a_batch_dimension_uses_batch_size_1(tmp_path: Path) -> None:
    """Triton skips warm-up samples of batch_size 0 (core src/backend_model_instance.cc)."""
    import yaml

    from tritonbundle.runtimes.base import warmups

    manifest_path = tmp_path / "m.yaml"
    manifest_path.write_text(yaml.safe_dump({"version": 1, "models": [{
        "name": "fixed", "source": {"onnx": "x.onnx"}, "target": "gpu", "runtime": "tensorrt",
        "inputs": [{"name": "x", "dtype": "FP32", "shape": [3, 8]}],
        "outputs": [{"name": "y", "dtype": "FP32", "shape": [3, 2]}]}]}))
    spec = manifest.load(manifest_path).models[0]
    ctx = BuildContext(spec=spec, plan=planner.plan_model(spec, None), onnx_path=None, work_dir=tmp_path)
    (sample,) = warmups(ctx, every_bucket=True)
    assert spec.max_batch_size == 0 and sample.batch_size == 1
    assert sample.inputs["x"].dims == (3, 8)


def _meta(path: Path, cc: str, version: str, onnx: str, options: te.EngineOptions) -> None:
    meta = te.EngineMetadata(version, f"GPU {cc}", cc, onnx, options.to_json())
    path.with_name(path.name + ".json").write_text(meta.to_json())
    path.write_bytes(b"plan")


def test_multi_arch_keeps_only_other_gpus_plans_of_this_tensorrt_and_onnx(tmp_path: Path) -> None:
    from tritonbundle.runtimes.tensorrt.check import other_arch_plans

    options = engine_options(_ctx(tmp_path, multi_arch=True))
    previous = tmp_path / "previous"
    previous.mkdir()
    _meta(previous / "model_cc80.plan", "8.0", "11.1.0.106", "abc", options)   # kept
    _meta(previous / "model_cc89.plan", "8.9", "10.13.2.6", "abc", options)    # another TensorRT: dropped
    _meta(previous / "model_cc86.plan", "8.6", "11.1.0.106", "old", options)   # another ONNX: dropped
    _meta(previous / "model_cc90.plan", "9.0", "11.1.0.106", "abc", options)   # this GPU: rebuilt, not kept
    here = te.Platform("NVIDIA H200", "9.0", "11.1.0.106")
    assert other_arch_plans(previous, here, onnx_sha256="abc", options=options) == {"8.0": "model_cc80.plan"}


def test_the_config_says_the_vocabulary_the_plan_gathers_from(tmp_path: Path) -> None:
    """A TensorRT plan indexes its embedding table with whatever ids it is sent: the config carries the
    table's rows (from the FP32 graph when there is one), which the clients and the gateway check against."""
    import json

    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def graph_file(name: str, rows: int) -> Path:
        table = numpy_helper.from_array(np.zeros((rows, 4), np.float32), "word_embeddings")
        node = helper.make_node("Gather", ["word_embeddings", "input_ids"], ["embedded"])
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, 3])],
                                  [helper.make_tensor_value_info("embedded", TensorProto.FLOAT, [1, 3, 4])], [table])
        path = tmp_path / name
        onnx.save(helper.make_model(graph), str(path))
        return path

    ctx = dataclasses.replace(_ctx(tmp_path), onnx_path=graph_file("served.onnx", 50))
    cfg = parse_pbtxt(TensorRTRuntime().config(ctx, Written()).to_pbtxt())
    assert json.loads(cfg.parameters["vocab_sizes"].string_value) == {"input_ids": 50}
    ctx = dataclasses.replace(ctx, reference_onnx=graph_file("fp32.onnx", 70))
    cfg = parse_pbtxt(TensorRTRuntime().config(ctx, Written()).to_pbtxt())
    assert json.loads(cfg.parameters["vocab_sizes"].string_value) == {"input_ids": 70}
