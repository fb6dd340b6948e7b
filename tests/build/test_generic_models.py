"""The build stage is generic: models other than MiniLM (an image classifier with a dynamic batch
only, a three-input token model with two outputs) build, load READY in the real CPU server and
answer requests of every bucket. Bad models and manifests stop the build before any engine work."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tests.build import onnx_models
from tritonbundle.build.stage import BuildOptions, build, plan_all
from tritonbundle.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def _manifest(tmp: Path, models: list[dict[str, Any]], traffic: str | None = "traffic.jsonl") -> Path:
    (tmp / "traffic.jsonl").write_text("".join(f'{{"tokens": {n}}}\n' for n in [3, 5, 9, 17, 30, 31, 60, 64] * 10))
    data: dict[str, Any] = {"version": 1, "models": models, "defaults": {"batch_buckets": [1, 4, 8], "sequence_buckets": 3}}
    if traffic:
        data["traffic"] = traffic
    path = tmp / "models.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


IMAGE = {
    "name": "image", "source": {"onnx": "image.onnx"},
    "inputs": [{"name": "pixels", "dtype": "FP32", "shape": ["batch", 3, 8, 8]}],
    "outputs": [{"name": "logits", "dtype": "FP32", "shape": ["batch", 10]}],
}
TOKENS = {
    "name": "tokens", "source": {"onnx": "tokens.onnx"}, "max_sequence_length": 64,
    "inputs": [{"name": n, "dtype": "INT64", "shape": ["batch", "sequence"]} for n in ("input_ids", "attention_mask", "token_type_ids")],
    "outputs": [{"name": "logits", "dtype": "FP32", "shape": ["batch", 2]},
                {"name": "token_scores", "dtype": "FP32", "shape": ["batch", "sequence"]}],
}


@pytest.fixture(scope="module")
def generic_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("generic")
    onnx_models.image_classifier(tmp / "image.onnx")
    onnx_models.token_classifier(tmp / "tokens.onnx")
    manifest = _manifest(tmp, [IMAGE, TOKENS])
    repo = tmp / "model_repository"
    build(BuildOptions(manifest=manifest, repository=repo, artifacts=tmp / "artifacts"))
    return repo


def test_plans_profiles_for_each_model(tmp_path: Path) -> None:
    onnx_models.image_classifier(tmp_path / "image.onnx")
    onnx_models.token_classifier(tmp_path / "tokens.onnx")
    plans = dict((s.name, p) for s, p in plan_all(BuildOptions(manifest=_manifest(tmp_path, [IMAGE, TOKENS]), artifacts=tmp_path / "a")))
    assert len(plans["image"].profiles) == 3  # batch buckets only
    assert len(plans["tokens"].profiles) == 9  # 3 batch x 3 sequence buckets
    assert plans["tokens"].sequence_buckets[-1].max == 64
    assert set(plans["tokens"].profiles[0].shapes) == {"input_ids", "attention_mask", "token_type_ids"}


@pytest.fixture(scope="module")
def generic_server(generic_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tritonbundle.server import ServerOptions, TritonServer

    log = tmp_path_factory.mktemp("generic-log") / "tritonserver.log"
    server = TritonServer(ServerOptions(generic_repo, http_port=0, grpc_port=0, metrics_port=0, log_path=log))
    server.start(ready_timeout_s=120)
    yield server
    server.stop()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_image_model_answers_every_batch_bucket(generic_server: Any, batch: int) -> None:
    from tritonbundle.clients import HttpClient

    pixels = np.random.default_rng(batch).standard_normal((batch, 3, 8, 8)).astype(np.float32)
    with HttpClient(generic_server.http_url, model="image", check_model=False) as client:
        out = client.infer({"pixels": pixels}, outputs=["logits"])["logits"]
    expected = pixels.mean(axis=(2, 3)) @ (np.arange(30, dtype=np.float32).reshape(3, 10) / 30.0)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("batch", "length"), [(1, 2), (2, 9), (4, 31), (8, 64)])
def test_token_model_answers_every_bucket_with_ragged_outputs_cut_back(generic_server: Any, batch: int, length: int) -> None:
    from tritonbundle.clients import GrpcClient

    rng = np.random.default_rng(length)
    ids = rng.integers(1, 50, size=(batch, length), dtype=np.int64)
    mask = np.ones_like(ids)
    types = np.zeros_like(ids)
    with GrpcClient(generic_server.grpc_url, model="tokens", check_model=False) as client:
        out = client.infer({"input_ids": ids, "attention_mask": mask, "token_type_ids": types},
                           outputs=["logits", "token_scores"])
    assert out["token_scores"].shape == (batch, length)
    np.testing.assert_allclose(out["logits"][:, 0], ids.sum(axis=1))
    np.testing.assert_allclose(out["logits"][:, 1], length)


def test_onnx_without_the_named_input_stops_the_build(tmp_path: Path) -> None:
    onnx_models.image_classifier(tmp_path / "image.onnx")
    model = {**IMAGE, "inputs": [{"name": "images", "dtype": "FP32", "shape": ["batch", 3, 8, 8]}]}
    repo = tmp_path / "repo"
    with pytest.raises(ConfigError, match="model image: the ONNX graph .*image.onnx has no input named 'images'; its inputs are: pixels"):
        build(BuildOptions(manifest=_manifest(tmp_path, [model]), repository=repo, artifacts=tmp_path / "a"))
    assert not repo.exists() or not any(repo.iterdir())


def test_static_dim_where_dynamic_is_declared_stops_the_build(tmp_path: Path) -> None:
    onnx_models.image_classifier(tmp_path / "image.onnx", static_batch=True)
    with pytest.raises(ConfigError, match=r"input 'pixels': dimension 0 is declared dynamic \('batch'\) but the graph fixes it to 4"):
        build(BuildOptions(manifest=_manifest(tmp_path, [IMAGE]), repository=tmp_path / "repo", artifacts=tmp_path / "a"))


def test_wrong_dtype_in_manifest_stops_the_build(tmp_path: Path) -> None:
    onnx_models.image_classifier(tmp_path / "image.onnx")
    model = {**IMAGE, "inputs": [{"name": "pixels", "dtype": "FP16", "shape": ["batch", 3, 8, 8]}]}
    with pytest.raises(ConfigError, match="the manifest says FP16, the ONNX graph .*image.onnx has FP32"):
        build(BuildOptions(manifest=_manifest(tmp_path, [model]), repository=tmp_path / "repo", artifacts=tmp_path / "a"))


def test_profile_range_the_graph_cannot_take_stops_the_build(tmp_path: Path) -> None:
    onnx_models.short_position_table(tmp_path / "short.onnx", positions=16)
    model = {
        "name": "short", "source": {"onnx": "short.onnx"}, "max_sequence_length": 64,
        "inputs": [{"name": "input_ids", "dtype": "INT64", "shape": ["batch", "sequence"]}],
        "outputs": [{"name": "out", "dtype": "FP32", "shape": ["batch", "sequence", 4]}],
    }
    with pytest.raises(ConfigError, match="model short: the graph cannot take sequence length 64"):
        build(BuildOptions(manifest=_manifest(tmp_path, [model]), repository=tmp_path / "repo", artifacts=tmp_path / "a"))


def test_empty_traffic_sample_stops_the_build(tmp_path: Path) -> None:
    onnx_models.token_classifier(tmp_path / "tokens.onnx")
    manifest = _manifest(tmp_path, [TOKENS])
    (tmp_path / "traffic.jsonl").write_text("")
    with pytest.raises(ConfigError, match="the traffic sample is empty"):
        build(BuildOptions(manifest=manifest, repository=tmp_path / "repo", artifacts=tmp_path / "a"))


def test_missing_traffic_sample_names_the_fix(tmp_path: Path) -> None:
    onnx_models.token_classifier(tmp_path / "tokens.onnx")
    manifest = _manifest(tmp_path, [TOKENS], traffic=None)
    with pytest.raises(ConfigError, match="no traffic sample: set 'traffic'"):
        build(BuildOptions(manifest=manifest, repository=tmp_path / "repo", artifacts=tmp_path / "a"))


MLP = {"name": "mlp", "inputs": [{"name": "features", "dtype": "FP32", "shape": ["batch", 16]}],
       "outputs": [{"name": "logits", "dtype": "FP32", "shape": ["batch", 4]}]}


def _mlp_with_external_weights(tmp: Path, name: str, location: str) -> dict[str, Any]:
    """The MLP saved as ``tmp/user/<name>`` with its weights in ``location`` beside it (``tmp/plain.onnx``
    keeps them inside); its manifest entry."""
    import onnx

    onnx_models.mlp(tmp / "plain.onnx")
    (tmp / "user").mkdir()
    onnx.save_model(onnx.load(str(tmp / "plain.onnx")), str(tmp / "user" / name), save_as_external_data=True,
                    location=location, size_threshold=0)
    return {**MLP, "source": {"onnx": f"user/{name}"}}


def test_an_onnx_with_external_weights_reaches_the_repository_whole(tmp_path: Path) -> None:
    """Exporters write the weights of large models beside the graph; the build used to copy the graph
    only, and ONNX Runtime then refused the served model ("External data path does not exist")."""
    import onnxruntime as ort

    mlp = _mlp_with_external_weights(tmp_path, "mlp.onnx", "weights.bin")
    repo = tmp_path / "repo"
    build(BuildOptions(manifest=_manifest(tmp_path, [mlp]), repository=repo, artifacts=tmp_path / "artifacts"))
    served = repo / "mlp" / "1" / "model.onnx"
    assert (repo / "mlp" / "1" / "model.onnx.data").exists(), "the weights travel in one file beside the graph"
    features = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)
    want = ort.InferenceSession(str(tmp_path / "plain.onnx")).run(None, {"features": features})[0]
    got = ort.InferenceSession(str(served)).run(None, {"features": features})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_repo_serves_a_users_external_weights_under_the_name_the_graph_gives(tmp_path: Path) -> None:
    """`tritonbundle repo` (no export) serves the user's own file: only ``<file>.data`` was copied, so
    Optimum's ``model.onnx_data`` never reached the version folder."""
    import onnxruntime as ort

    mlp = _mlp_with_external_weights(tmp_path, "model.onnx", "model.onnx_data")
    repo = tmp_path / "repo"
    build(BuildOptions(manifest=_manifest(tmp_path, [mlp]), repository=repo, artifacts=tmp_path / "artifacts",
                       export=False))
    features = np.ones((1, 16), np.float32)
    want = ort.InferenceSession(str(tmp_path / "plain.onnx")).run(None, {"features": features})[0]
    got = ort.InferenceSession(str(repo / "mlp" / "1" / "model.onnx")).run(None, {"features": features})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_the_cpu_model_reads_every_unsigned_input_type() -> None:
    """A UINT32 input passed the build, then the CPU model's initialize() failed (KeyError 'TYPE_UINT32')
    and with it the whole server's start."""
    from tritonbundle.build.onnx_check import ONNX_DTYPES
    from tritonbundle.runtimes.onnxruntime.model import _NP

    numeric = {f"TYPE_{t}" for t in ONNX_DTYPES.values()} - {"TYPE_STRING", "TYPE_BF16"}
    assert numeric <= set(_NP), sorted(numeric - set(_NP))


def test_a_repository_reached_through_a_symlink_to_another_file_system_builds(tmp_path: Path) -> None:
    """The build staged beside the link and renamed across file systems: OSError EXDEV, a traceback."""
    import os
    import shutil
    import tempfile

    if os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("/dev/shm is on the tests' file system here")
    onnx_models.mlp(tmp_path / "mlp.onnx")
    mlp = {**MLP, "source": {"onnx": "mlp.onnx"}}
    target = Path(tempfile.mkdtemp(dir="/dev/shm")) / "repo"
    try:
        (tmp_path / "repo").symlink_to(target, target_is_directory=True)
        build(BuildOptions(manifest=_manifest(tmp_path, [mlp]), repository=tmp_path / "repo", artifacts=tmp_path / "a"))
        assert (target / "mlp" / "config.pbtxt").is_file()
        # A repository that is itself a mount point cannot take the renames: refused, naming the fix.
        from tritonbundle.errors import BuildError

        with pytest.raises(BuildError, match="is a mount point: .* mount its parent folder instead"):
            build(BuildOptions(manifest=_manifest(tmp_path, [mlp]), repository=Path("/dev/shm"), artifacts=tmp_path / "a"))
    finally:
        shutil.rmtree(target.parent, ignore_errors=True)
