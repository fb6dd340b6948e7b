"""The TensorRT path. TensorRT cannot be installed on these machines (its wheels come only from
NVIDIA's index, which is unreachable), so: the config, trtexec command, metadata and precision logic
are tested here as pure code; the builder code is type-checked by mypy against tensorrt-stubs
10.13.0.35.1; the engine build itself is tested only where ``tensorrt`` imports (the NGC image)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
H100 = te.Platform("NVIDIA H100 80GB HBM3", "9.0", "10.13.0.35")


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
    assert argv[:3] == ["trtexec", "--onnx=m.onnx", "--saveEngine=m.plan"]
    assert [a for a in argv if a.startswith("--profile=")] == [f"--profile={i}" for i in range(12)]
    first = ctx.plan.profiles[0].shapes["input_ids"]
    assert f"--minShapes=input_ids:{first[0][0]}x{first[0][1]},attention_mask:{first[0][0]}x{first[0][1]}" in argv
    for flag in ("--fp16", "--memPoolSize=workspace:4096M", "--builderOptimizationLevel=3", "--timingCacheFile=t.cache",
                 "--hardwareCompatibilityLevel=ampere+", "--versionCompatible", "--exportLayerInfo=layers.json"):
        assert flag in argv


def test_metadata_decides_reuse_or_rebuild(tmp_path: Path) -> None:
    options = engine_options(_ctx(tmp_path))
    meta = te.EngineMetadata(tensorrt_version="10.13.0.35", gpu_name=H100.gpu_name, compute_capability="9.0",
                             onnx_sha256="abc", options=options.to_json())
    same = dict(platform=H100, onnx_sha256="abc", options=options, calibration_sha256=None)
    assert te.mismatches(meta, **same) == []  # type: ignore[arg-type]
    a100 = te.Platform("NVIDIA A100-SXM4-80GB", "8.0", "10.13.0.35")
    assert "GPU" in te.mismatches(meta, **{**same, "platform": a100})[0]  # type: ignore[arg-type]
    newer = te.Platform(H100.gpu_name, "9.0", "10.14.1.48")
    assert "TensorRT 10.13.0.35 != 10.14.1.48" in te.mismatches(meta, **{**same, "platform": newer})  # type: ignore[arg-type]
    assert "the ONNX model changed" in te.mismatches(meta, **{**same, "onnx_sha256": "def"})  # type: ignore[arg-type]
    fp16 = engine_options(_ctx(tmp_path, precision="fp16"))
    assert "build options or profiles changed" in te.mismatches(meta, **{**same, "options": fp16})  # type: ignore[arg-type]
    assert te.mismatches(None, **same) == ["no plan metadata"]  # type: ignore[arg-type]


def test_metadata_round_trips_through_json(tmp_path: Path) -> None:
    meta = te.EngineMetadata("10.13.0.35", "GPU", "9.0", "abc", {"precision": "fp16"}, flags=("FP16",))
    path = tmp_path / "model.plan.json"
    path.write_text(meta.to_json())
    assert te.EngineMetadata.read(path) == meta
    path.write_text("{not json")
    assert te.EngineMetadata.read(path) is None


@pytest.mark.parametrize(
    ("precision", "cc", "fp16", "int8", "expected"),
    [("fp32", "7.5", True, True, ()), ("fp16", "7.5", True, True, ("FP16",)), ("bf16", "8.0", True, True, ("BF16",)),
     ("int8", "9.0", True, True, ("INT8", "FP16"))],
)
def test_precision_flags_where_the_platform_has_them(precision: str, cc: str, fp16: bool, int8: bool, expected: tuple[str, ...]) -> None:
    assert te.precision_flags(precision, compute_capability=cc, has_fast_fp16=fp16, has_fast_int8=int8) == expected


def test_precision_the_platform_lacks_is_refused_by_name() -> None:
    with pytest.raises(BuildError, match="bf16 needs compute capability >= 8.0, this GPU has 7.5"):
        te.precision_flags("bf16", compute_capability="7.5", has_fast_fp16=True, has_fast_int8=True)
    with pytest.raises(BuildError, match="no fast INT8"):
        te.precision_flags("int8", compute_capability="6.0", has_fast_fp16=False, has_fast_int8=False)


def test_fingerprint_names_gpu_capability_and_tensorrt() -> None:
    assert H100.fingerprint == "nvidia-h100-80gb-hbm3-cc90-trt10.13.0.35"


def test_engine_options_need_a_profile() -> None:
    with pytest.raises(BuildError, match="at least one optimization profile"):
        te.EngineOptions()


def _mypy(*paths: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MYPYPATH": str(ROOT / ".tools" / "stubs")}
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


def test_build_check_without_tensorrt_is_a_clear_error(tmp_path: Path) -> None:
    if sys.modules.get("tensorrt") is not None:
        pytest.skip("TensorRT is importable here")
    from tritonbundle.build.stage import BuildOptions, check_repository

    options = BuildOptions(manifest=ROOT / "build" / "models.yaml", repository=tmp_path,
                           overrides={"target": "gpu", "runtime": "tensorrt"})
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        with pytest.raises(BuildError, match="TensorRT is not importable here: build engines inside the pinned NGC TensorRT image"):
            check_repository(options)
    else:  # pragma: no cover - NGC image
        pytest.skip("TensorRT is importable here")


def _build_options(tmp_path: Path, **overrides: object) -> object:
    from tritonbundle.build.stage import BuildOptions

    return BuildOptions(manifest=ROOT / "build" / "models.yaml", repository=tmp_path / "repo", artifacts=tmp_path,
                        overrides=dict(overrides))


def test_the_build_refuses_tensorrt_on_the_cpu_target(tmp_path: Path) -> None:
    from tritonbundle.build.stage import load_manifest
    from tritonbundle.errors import ConfigError

    with pytest.raises(ConfigError, match=r"models.yaml: model minilm.runtime: tensorrt needs target gpu"):
        load_manifest(_build_options(tmp_path, runtime="tensorrt"))  # type: ignore[arg-type]


def test_the_build_refuses_int8_without_calibration_data(tmp_path: Path) -> None:
    from tritonbundle.build.stage import load_manifest
    from tritonbundle.errors import ConfigError

    with pytest.raises(ConfigError, match="calibration: precision int8 needs calibration data"):
        load_manifest(_build_options(tmp_path, runtime="tensorrt", target="gpu", precision="int8"))  # type: ignore[arg-type]
