"""ONNX Runtime: ``platform: "onnxruntime_onnx"`` on GPU servers (NGC image), and on the CPU server
(which has only the Python backend) a Python-backend model that runs ONNX Runtime itself."""

from __future__ import annotations

import json
from pathlib import Path

from tritonbundle.modelconfig import InstanceGroup, ModelConfig
from tritonbundle.runtimes.base import (
    BuildContext,
    base_config,
    dynamic_batching,
    link_or_copy,
    python_model,
    tensor_specs,
    warmups,
)


class OnnxRuntime:
    name = "onnxruntime"

    def config(self, ctx: BuildContext) -> ModelConfig:
        spec = ctx.spec
        if spec.target == "cpu":
            inputs, outputs = tensor_specs(ctx, ragged=ctx.plan.policy == "ragged")
            threads = max(1, (len(_cpus()) // spec.instances)) if spec.instances > 1 else 0
            return base_config(
                ctx,
                backend="python",
                inputs=inputs,
                outputs=outputs,
                dynamic_batching=dynamic_batching(ctx),
                instance_groups=(InstanceGroup(count=spec.instances, kind="KIND_CPU"),),
                parameters={
                    "onnx_file": "model.onnx",
                    "intra_op_threads": str(threads),
                    "max_sequence_length": str(spec.max_sequence_length),
                    "pad_values": json.dumps({}),
                    "padding_policy": ctx.plan.policy,
                    "padding_targets": ",".join(map(str, ctx.plan.padding_targets)),
                },
                warmups=warmups(ctx, every_bucket=False),
            )
        inputs, outputs = tensor_specs(ctx, ragged=False)
        return base_config(
            ctx,
            platform="onnxruntime_onnx",
            inputs=inputs,
            outputs=outputs,
            dynamic_batching=dynamic_batching(ctx),
            instance_groups=(InstanceGroup(count=spec.instances, kind="KIND_GPU"),),
            parameters={"padding_policy": ctx.plan.policy, "padding_targets": ",".join(map(str, ctx.plan.padding_targets))},
            warmups=warmups(ctx, every_bucket=True),
        )

    def write_files(self, ctx: BuildContext, version_dir: Path) -> None:
        assert ctx.onnx_path is not None, "the onnxruntime runtime needs an ONNX file"
        link_or_copy(ctx.onnx_path, version_dir / "model.onnx")
        if ctx.spec.target == "cpu":
            python_model("onnxruntime_encoder", version_dir)


def _cpus() -> set[int]:
    import os

    try:
        return os.sched_getaffinity(0)
    except AttributeError:  # pragma: no cover - not Linux
        return set(range(os.cpu_count() or 1))
