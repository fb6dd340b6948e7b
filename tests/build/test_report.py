from __future__ import annotations

import json
from pathlib import Path

from tritonbundle.cli import main
from tritonbundle.modelconfig import parse_pbtxt

ROOT = Path(__file__).resolve().parents[2]


def test_plan_command_writes_table_json_and_histogram(tmp_path: Path, capsys: object) -> None:
    code = main(["plan", "--manifest", str(ROOT / "build" / "models.yaml"), "--artifacts", str(tmp_path / "a"),
                 "--out", str(tmp_path / "report"), "--target", "gpu", "--runtime", "tensorrt"])
    assert code == 0
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert "padding policy 'targets'" in out
    assert "bucketed (this plan)" in out and "pad every request to 512" in out
    report = tmp_path / "report" / "minilm"
    plan = json.loads((report / "plan.json").read_text())
    assert plan["padding_targets"][-1] == 512
    assert len(plan["profiles"]) == 12
    png = (report / "histogram.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_onnxruntime_gpu_target_uses_the_onnxruntime_backend(tmp_path: Path) -> None:
    from tritonbundle import manifest, traffic
    from tritonbundle import plan as planner
    from tritonbundle.runtimes.base import BuildContext, Written
    from tritonbundle.runtimes.onnxruntime.plugin import OnnxRuntime

    spec = manifest.override(manifest.load(ROOT / "build" / "models.yaml"), target="gpu").model("minilm")
    plan = planner.plan_model(spec, traffic.load(spec.traffic), policy=OnnxRuntime().padding_policy("gpu"))  # type: ignore[arg-type]
    cfg = parse_pbtxt(OnnxRuntime().config(BuildContext(spec, plan, None, tmp_path), Written()).to_pbtxt())
    assert cfg.platform == "onnxruntime_onnx" and not cfg.backend
    assert cfg.instance_group[0].kind == cfg.instance_group[0].KIND_GPU
    assert plan.policy == "targets"
    assert len(cfg.model_warmup) == 12
