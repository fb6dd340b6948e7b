"""The exported ONNX graph is checked and matches PyTorch within 1e-4 at every shape, 1x1 to 8x512."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow


def test_export_is_valid_onnx_with_dynamic_batch_and_sequence(exported_minilm: Path) -> None:
    import onnx

    model = onnx.load(str(exported_minilm / "model.onnx"))
    onnx.checker.check_model(model, full_check=True)
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 17
    inputs = {i.name: i for i in model.graph.input}
    assert set(inputs) == {"input_ids", "attention_mask"}
    for value in inputs.values():
        assert value.type.tensor_type.elem_type == onnx.TensorProto.INT64
        dims = value.type.tensor_type.shape.dim
        assert [d.dim_param for d in dims] == ["batch", "sequence"]
    (out,) = model.graph.output
    assert out.name == "embedding"
    assert out.type.tensor_type.shape.dim[0].dim_param == "batch"
    assert out.type.tensor_type.shape.dim[1].dim_value == 384


def test_onnxruntime_matches_pytorch_at_every_shape(exported_minilm: Path) -> None:
    from tritonbundle.build.export import PARITY_SHAPES, check_parity
    from tritonbundle.recipes import recipe_encoder

    module, vocab = recipe_encoder("minilm")
    results = check_parity(module, exported_minilm / "model.onnx", ["input_ids", "attention_mask"], vocab)
    shapes = {(r.batch, r.length) for r in results}
    assert {(1, 1), (8, 512)} <= shapes == set(PARITY_SHAPES)
    assert max(r.max_abs_diff for r in results) <= 1e-4


def test_parity_check_fails_when_the_graph_differs(exported_minilm: Path) -> None:
    import torch

    from tritonbundle.build.export import check_parity
    from tritonbundle.errors import ExportError
    from tritonbundle.recipes import recipe_encoder

    module, vocab = recipe_encoder("minilm")

    class Shifted(torch.nn.Module):
        def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return module(ids, mask) + 1e-3

    with pytest.raises(ExportError, match=r"differs from PyTorch by .* at shape 1x1 \(tolerance 0.0001\)"):
        check_parity(Shifted(), exported_minilm / "model.onnx", ["input_ids", "attention_mask"], vocab)


def test_sample_inputs_have_ragged_masks() -> None:
    from tritonbundle.build.export import sample_inputs

    feed = sample_inputs(8, 64, 30522, seed=3)
    assert feed["input_ids"].shape == (8, 64)
    assert feed["attention_mask"][0].all()
    assert not feed["attention_mask"].all()
    assert np.all(feed["input_ids"][feed["attention_mask"] == 0] == 0)


def test_padding_does_not_change_a_rows_embedding(exported_minilm: Path) -> None:
    from tritonbundle.build.export import check_padding

    assert check_padding(exported_minilm / "model.onnx", ["input_ids", "attention_mask"], 30522) <= 1e-5


def test_the_padding_check_catches_a_mask_that_is_ignored(tmp_path: Path) -> None:
    """An encoder whose attention ignores the mask passes parity with PyTorch (both ignore it) but not this."""
    import onnx
    from onnx import TensorProto, helper

    from tritonbundle.build.export import check_padding
    from tritonbundle.errors import ExportError

    # embedding = mean over every position of a per-token value: padding changes it.
    graph = helper.make_graph(
        [helper.make_node("Cast", ["input_ids"], ["f"], to=TensorProto.FLOAT),
         helper.make_node("ReduceMean", ["f"], ["m"], keepdims=1, axes=[1]),
         helper.make_node("Identity", ["attention_mask"], ["unused"])],
        "ignores_mask",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("m", TensorProto.FLOAT, ["batch", 1])],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    with pytest.raises(ExportError, match="the attention mask is not applied"):
        check_padding(path, ["input_ids", "attention_mask"], 30522)


@pytest.mark.slow
def test_force_rebuilds_without_re_exporting_so_it_needs_no_torch(
    exported_minilm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The build image has no torch: `build --force` (Helm engineBuild.force, `compose run build --force`)
    must use the existing export. Re-exporting is `--reexport`."""
    import sys

    from tests.conftest import ARTIFACTS, MANIFEST
    from tritonbundle.build.stage import BuildOptions, build

    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now fails, as in the TensorRT image
    repo = tmp_path / "model_repository"
    build(BuildOptions(manifest=MANIFEST, artifacts=ARTIFACTS, repository=repo, force=True))
    assert (repo / "minilm_encoder" / "1" / "model.onnx").exists()
    from tritonbundle.errors import ExportError

    with pytest.raises(ExportError, match="needs torch, which is not installed here"):
        build(BuildOptions(manifest=MANIFEST, artifacts=ARTIFACTS, repository=repo, reexport=True))
