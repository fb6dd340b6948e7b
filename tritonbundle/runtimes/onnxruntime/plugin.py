"""ONNX Runtime: ``platform: "onnxruntime_onnx"`` on GPU servers (NGC image), and on the CPU server
(which has only the Python backend) the Python-backend model ``model.py`` next to this file, which
runs ONNX Runtime itself and pads each dynamic batch to its longest request (the ``ragged`` policy)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tritonbundle import proc
from tritonbundle.contract import EncoderParameters, OnnxRuntimeParameters, Parameters
from tritonbundle.errors import ConfigError
from tritonbundle.files import onnx_weight_files
from tritonbundle.manifest import ModelSpec
from tritonbundle.modelconfig import ModelConfig
from tritonbundle.runtimes import served
from tritonbundle.runtimes.base import (
    BuildContext,
    Written,
    copy_artifact,
    encoder_config,
    needs_calibration,
    no_text_model,
    warmups,
)

MODEL_PY = Path(__file__).with_name("model.py")


class OnnxRuntime:
    name = "onnxruntime"
    needs_onnx = True

    def parameters(self, spec: ModelSpec) -> type[EncoderParameters]:
        return OnnxRuntimeParameters if spec.target == "cpu" else EncoderParameters

    def check(self, spec: ModelSpec) -> None:
        """ONNX Runtime serves any ONNX model the manifest describes (the graph check comes later), at
        fp32, or at fp16/int8 from the build's converted graph; it has no BF16 kernels on the CPU."""
        needs_calibration(spec)
        no_text_model(spec, self.name)
        if spec.precision == "bf16":
            raise ConfigError(f"model {spec.name}.precision: the onnxruntime runtime serves fp32, fp16 or int8, not bf16 "
                              "(ONNX Runtime has no BF16 kernels for these operators)")

    def padding_policy(self, target: str) -> str:
        # On the CPU there is no per-shape compilation to amortise: pad each batch to its longest.
        return "ragged" if target == "cpu" else "targets"

    def config(self, ctx: BuildContext, written: Written) -> ModelConfig:
        spec, plan = ctx.spec, ctx.plan
        if spec.target == "cpu":
            threads = max(1, (len(proc.usable_cpus()) // spec.instances)) if spec.instances > 1 else 0
            params = OnnxRuntimeParameters(
                padding_policy=plan.policy, padding_targets=plan.padding_targets,
                max_sequence_length=spec.max_sequence_length, onnx_file="model.onnx", intra_op_threads=threads,
                pad_values={},
            )
            return encoder_config(ctx, params, ragged=plan.policy == "ragged", kind="KIND_CPU", backend="python",
                                  warmups=warmups(ctx, every_bucket=False))
        params_gpu = EncoderParameters(
            padding_policy=plan.policy, padding_targets=plan.padding_targets, max_sequence_length=spec.max_sequence_length,
        )
        return encoder_config(ctx, params_gpu, ragged=False, kind="KIND_GPU", platform="onnxruntime_onnx",
                              warmups=warmups(ctx, every_bucket=True))

    def text_model(self, ctx: BuildContext, *args: Any) -> tuple[ModelConfig, type[Parameters]]:
        no_text_model(ctx.spec, self.name)  # check() refuses the knob before this is reached
        raise AssertionError("unreachable")

    def write_files(self, ctx: BuildContext, version_dir: Path) -> Written:
        assert ctx.onnx_path is not None, "the onnxruntime runtime needs an ONNX file"
        copy_artifact(ctx.onnx_path, version_dir / "model.onnx")
        for location in onnx_weight_files(ctx.onnx_path):  # external weights, under the names the graph gives
            copy_artifact(ctx.onnx_path.parent / location, version_dir / location)
        if ctx.spec.target == "cpu":
            served.install(MODEL_PY, version_dir)
        return Written()
