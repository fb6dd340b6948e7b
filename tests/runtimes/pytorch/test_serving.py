"""The pytorch runtime served for real: `tritonbundle build --runtime pytorch --target cpu`, the CPU
tritonserver from the nvidia-pytriton wheel, answers compared with ONNX Runtime on the exported
graph; and the trimmed server that `scripts/device_pack.py` carries to the GPU machine."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import ARTIFACTS, MANIFEST

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TEXTS = [
    "hi",
    "A man is playing a guitar.",
    "The quick brown fox jumps over the lazy dog " * 6,
    "Triton serves models over HTTP and gRPC; " * 20,
    "word " * 480,  # truncated to 512 tokens by the tokenizer
]


@pytest.fixture(scope="module")
def server_env() -> Iterator[None]:
    """What the benchmark sets up for servers: this interpreter's bin/ and libpython first."""
    from tritonbundle.bench.workspace import prepare_process_env

    with pytest.MonkeyPatch.context() as mp:
        for key in ("PATH", "LD_LIBRARY_PATH", "HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM"):
            mp.setenv(key, os.environ.get(key, ""))
        prepare_process_env()
        yield


@pytest.fixture(scope="module")
def pytorch_repository(exported_minilm: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tritonbundle.cli import main

    repo = tmp_path_factory.mktemp("pytorch") / "model_repository"
    code = main(["build", "--manifest", str(MANIFEST), "--artifacts", str(ARTIFACTS), "--repository", str(repo),
                 "--runtime", "pytorch", "--target", "cpu"])
    assert code == 0
    return repo


def _serve(repo: Path, log: Path, stats: Path | None = None, installation: Any = None) -> Any:
    from tritonbundle.server import ServerOptions, TritonServer

    if stats is not None:
        os.environ["TRITONBUNDLE_STATS_DIR"] = str(stats)
    try:
        server = TritonServer(ServerOptions(repo, http_port=0, grpc_port=0, metrics_port=0, log_path=log, exit_timeout_s=5),
                              installation=installation)
        server.start(ready_timeout_s=240)
    finally:
        os.environ.pop("TRITONBUNDLE_STATS_DIR", None)
    return server


@pytest.fixture(scope="module")
def pytorch_server(pytorch_repository: Path, server_env: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    folder = tmp_path_factory.mktemp("pytorch-server")
    server = _serve(pytorch_repository, folder / "tritonserver.log", stats=folder / "stats")
    server.stats_dir = folder / "stats"
    yield server
    server.stop()


def _token_ids(texts: list[str]) -> list[list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ARTIFACTS / "minilm" / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length=512)
    return [tok.encode(text).ids for text in texts]


def _onnx_reference(texts: list[str]) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(ARTIFACTS / "minilm" / "model.onnx"), providers=["CPUExecutionProvider"])
    out = []
    for row in _token_ids(texts):
        ids = np.array([row], dtype=np.int64)
        out.append(session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0][0])
    return np.stack(out)


def test_the_config_is_the_pytorch_runtimes(pytorch_repository: Path) -> None:
    text = (pytorch_repository / "minilm_encoder" / "config.pbtxt").read_text()
    assert 'backend: "python"' in text and "KIND_CPU" in text and "allow_ragged_batch: true" in text
    assert (pytorch_repository / "minilm_encoder" / "1" / "model.safetensors").exists()
    version = pytorch_repository / "minilm_encoder" / "1"
    assert (version / "model.py").read_text().startswith('"""Triton Python-backend model: the recipe\'s encoder run by PyTorch')
    vendored = sorted(str(p.relative_to(version)) for p in version.glob("tritonbundle/**/*.py") if p.name != "__init__.py")
    assert vendored == ["tritonbundle/contract.py", "tritonbundle/errors.py", "tritonbundle/recipes.py",
                        "tritonbundle/runtimes/pytorch/engine.py", "tritonbundle/runtimes/pytorch/gpu_turn.py",
                        "tritonbundle/runtimes/pytorch/launch.py",
                        "tritonbundle/runtimes/stacks.py", "tritonbundle/runtimes/stats.py",
                        "tritonbundle/runtimes/text.py", "tritonbundle/runtimes/wordpiece.py"]


def test_embeddings_match_onnx_runtime_in_one_batch_and_one_by_one(pytorch_server: Any) -> None:
    from tritonbundle.clients import AsyncGrpcClient, HttpClient

    expected = _onnx_reference(TEXTS)
    with HttpClient(pytorch_server.http_url) as client:
        batch = client.embed(TEXTS)

    async def concurrently() -> np.ndarray:
        async with AsyncGrpcClient(pytorch_server.grpc_url) as client:
            parts = await asyncio.gather(*(client.embed([t]) for t in TEXTS * 3))
        return np.concatenate(parts)

    singles = asyncio.run(concurrently())
    assert batch.shape == (len(TEXTS), 384)
    for got in (batch, singles[: len(TEXTS)], singles[len(TEXTS) : 2 * len(TEXTS)]):
        cosine = (got * expected).sum(axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)
        assert cosine.min() >= 0.999, cosine


def test_token_input_longer_than_the_limit_is_refused_by_name(pytorch_server: Any) -> None:
    from tritonbundle.clients import GrpcClient, InvalidInputError

    ids = np.full((1, 600), 1000, dtype=np.int64)
    with GrpcClient(pytorch_server.grpc_url) as client, pytest.raises(InvalidInputError, match="512"):
        client.infer({"input_ids": ids, "attention_mask": np.ones_like(ids)}, model="minilm_encoder")


@pytest.mark.parametrize(("ids", "mask", "message"), [
    ([[101, 30522, 102]], [[1, 1, 1]], r"holds 30522 at \[0, 1\]: token ids must lie in \[0, 30522\)"),
    ([[101, -1, 102]], [[1, 1, 1]], "holds -1"),
    ([[]], [[]], r"shape \[1, 0\]: the sequence is empty"),
])
def test_token_input_the_embedding_table_cannot_take_is_refused_by_name(
    pytorch_server: Any, ids: list[list[int]], mask: list[list[int]], message: str
) -> None:
    """On a GPU an id outside the table is a device-side assert that leaves the model's CUDA context dead."""
    from tritonbundle.clients import GrpcClient, HttpClient, InvalidInputError

    feed = {"input_ids": np.array(ids, np.int64), "attention_mask": np.array(mask, np.int64)}
    with GrpcClient(pytorch_server.grpc_url) as client, pytest.raises(InvalidInputError, match=message):
        client.infer(feed, model="minilm_encoder")
    with HttpClient(pytorch_server.http_url) as http, pytest.raises(InvalidInputError, match=message):
        http.infer(feed, model="minilm_encoder")
    with HttpClient(pytorch_server.http_url) as http:
        assert http.embed(["still serving"]).shape == (1, 384)


def test_the_encoder_writes_its_statistics_for_the_benchmark(pytorch_server: Any) -> None:
    from tritonbundle.clients import GrpcClient
    from tritonbundle.runtimes.stats import quantile_ms, read_stats, read_stats_info

    with GrpcClient(pytorch_server.grpc_url) as client:
        client.embed(["one two three", "four five six seven"])
    time.sleep(0.6)
    stats = read_stats(pytorch_server.stats_dir)
    assert stats["rows"] >= 2 and stats["useful_tokens"] > 0
    # Packed launches may compute fewer tokens than padding each text to its target would.
    assert stats["computed_tokens"] >= stats["useful_tokens"] and stats["seq_tokens"] >= stats["useful_tokens"]
    assert stats["t_execute_s"] > 0
    # Every call in the execute-time histogram; no GPU time on the CPU.
    assert sum(v for k, v in stats.items() if k.startswith("h_execute_ms_")) == stats["executes"]
    assert quantile_ms(stats, "execute_ms", 0.99) is not None and quantile_ms(stats, "gpu_ms", 0.5) is None
    # Each phase a call ran, in its own histogram (which phase a slow call spent its time in); token
    # rows in: nothing tokenized here, so that histogram counts nothing.
    for phase in ("read", "plan", "fill", "launch", "respond"):
        counted = sum(v for k, v in stats.items() if k.startswith(f"h_{phase}_ms_"))
        assert 1 <= counted <= stats["executes"], (phase, counted)
        # the slowest call's bucket edge holds at least the phase's mean over the calls counted
        assert quantile_ms(stats, f"{phase}_ms", 1.0) >= 1000.0 * stats[f"t_{phase}_s"] / counted, phase
    assert quantile_ms(stats, "tokenize_ms", 0.5) is None
    info = read_stats_info(pytorch_server.stats_dir)
    assert info and info[0]["device"] == "cpu" and info[0]["cuda_graphs"] is False


@pytest.fixture(scope="module")
def text_server(exported_minilm: Path, server_env: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """``tokenize_in_encoder``: <name> is one Python model that tokenizes and encodes; with two batches
    in flight (each model's ``execute()`` returns and a lane's thread answers through the response senders)."""
    import yaml

    from tritonbundle.cli import main

    folder = tmp_path_factory.mktemp("text-model")
    manifest = yaml.safe_load(MANIFEST.read_text())
    manifest["defaults"]["tokenize_in_encoder"] = True
    manifest["defaults"]["batches_in_flight"] = 2
    manifest["traffic"] = str((MANIFEST.parent / manifest["traffic"]).resolve())
    (folder / "models.yaml").write_text(yaml.safe_dump(manifest))
    repo = folder / "model_repository"
    assert main(["build", "--manifest", str(folder / "models.yaml"), "--artifacts", str(ARTIFACTS),
                 "--repository", str(repo), "--runtime", "pytorch", "--target", "cpu"]) == 0
    server = _serve(repo, folder / "tritonserver.log", stats=folder / "stats")
    server.repository, server.stats_dir = repo, folder / "stats"
    yield server
    server.stop()


def test_a_model_that_tokenizes_itself_answers_like_the_ensemble(text_server: Any) -> None:
    from tritonbundle.clients import GrpcClient, HttpClient, InvalidInputError

    repo = text_server.repository
    assert sorted(p.name for p in repo.iterdir() if p.is_dir()) == ["minilm", "minilm_encoder"]
    config = (repo / "minilm" / "config.pbtxt").read_text()
    assert 'backend: "python"' in config and "ensemble" not in config and "tokenizer_file" in config
    with GrpcClient(text_server.grpc_url) as client:
        got = client.embed(TEXTS)
        counts = client.infer({"TEXT": np.array([[t.encode()] for t in TEXTS], dtype=object)})["tokens"]
    expected = _onnx_reference(TEXTS)
    assert counts[:, 0].tolist() == [len(ids) for ids in _token_ids(TEXTS)], "tokens: each text's count, as the ensemble says"
    assert ((got * expected).sum(axis=1)).min() >= 0.999
    with HttpClient(text_server.http_url) as http:  # the token-input model is still served
        ids = np.array([[101, 7632, 102]], dtype=np.int64)
        assert http.infer({"input_ids": ids, "attention_mask": np.ones_like(ids)}, model="minilm_encoder")["embedding"].shape == (1, 384)
        with pytest.raises(InvalidInputError, match=r"TEXT\[1\] is empty"):
            http.embed(["fine", "\x00 \t"])
        assert http.embed(["still serving"]).shape == (1, 384)
    from tritonbundle.runtimes.stats import read_stats, read_stats_info

    time.sleep(0.6)  # the statistics are written every 0.25 s
    stats = read_stats(text_server.stats_dir)
    assert stats["t_tokenize_s"] > 0 and stats["t_read_s"] > 0, "reading and tokenizing, each timed"
    assert [i.get("tokenizer") for i in read_stats_info(text_server.stats_dir) if i.get("tokenizer")] == [
        "PlainTextTokenizer+CachedWordPiece"], "the start-up line names the text paths that serve"


def test_batches_in_flight_answer_every_caller_with_its_own_rows_over_both_protocols(text_server: Any) -> None:
    """Many callers at once, so batches overlap in the two lanes: each answer is its own text's."""
    from concurrent.futures import ThreadPoolExecutor

    from tritonbundle.clients import GrpcClient, HttpClient

    config = (text_server.repository / "minilm" / "config.pbtxt").read_text()
    assert 'key: "batches_in_flight"' in config and 'string_value: "2"' in config.split('key: "batches_in_flight"')[1][:80]
    texts = [f"caller {i} asks about {word}" for i, word in enumerate(["guitars", "foxes", "servers", "rivers"] * 12)]
    with GrpcClient(text_server.grpc_url) as client:
        alone = client.embed(texts)  # one request: the reference
    with HttpClient(text_server.http_url) as http, GrpcClient(text_server.grpc_url) as grpc_client:
        callers = [http, grpc_client]
        with ThreadPoolExecutor(16) as pool:
            got = list(pool.map(lambda i: callers[i % 2].embed([texts[i]])[0], range(len(texts))))
    assert ((np.stack(got) * alone).sum(axis=1)).min() >= 0.9999


def test_the_trimmed_server_that_is_carried_to_the_gpu_machine_serves_the_repository(
    pytorch_repository: Path, server_env: None, tmp_path: Path
) -> None:
    """`scripts/device_pack.py` keeps tritonserver, the Python backend, one stub and the libraries they load,
    strips them and stubs out ICU's data; here with this interpreter's stub instead of 3.12's."""
    import sys

    from tests.scripts.test_device_pack import load_device_pack

    stage_server = load_device_pack().stage_server

    from tritonbundle.installation import Installation

    stage = tmp_path / "server"
    info = stage_server(stage, python_version=f"{sys.version_info.major}.{sys.version_info.minor}")
    assert any(name.startswith("libicudata") for name in info["libraries"])
    assert (stage / "lib" / next(n for n in info["libraries"] if n.startswith("libicudata"))).stat().st_size < 100_000
    installation = Installation(
        binary=stage / "tritonserver" / "bin" / "tritonserver", backend_dir=stage / "tritonserver" / "backends",
        env={"LD_LIBRARY_PATH": os.pathsep.join(p for p in (str(stage / "lib"), os.environ.get("LD_LIBRARY_PATH", "")) if p)},
        description="trimmed",
    )
    server = _serve(pytorch_repository, tmp_path / "tritonserver.log", installation=installation)
    try:
        from tritonbundle.clients import GrpcClient

        with GrpcClient(server.grpc_url) as client:
            got = client.embed(TEXTS[:2])
        expected = _onnx_reference(TEXTS[:2])
        assert ((got * expected).sum(axis=1)).min() >= 0.999
    finally:
        server.stop()
    assert json.loads(json.dumps(info))["stripped"] is True


def test_batches_in_flight_survive_callers_that_give_up(text_server: Any) -> None:
    """Callers whose deadlines pass while their batch is in a lane (Triton drops their answers): the lanes
    keep serving, and every later caller is answered."""
    from concurrent.futures import ThreadPoolExecutor

    from tritonbundle.clients import ClientError, GrpcClient

    long_text = "Triton serves models over HTTP and gRPC; " * 40
    # Connecting (model metadata) keeps the default deadline: only the calls are hasty, or a busy machine
    # fails the connect itself (a clean-clone CI run did, at 20 ms).
    with GrpcClient(text_server.grpc_url) as hasty:
        def give_up(i: int) -> bool:
            try:
                hasty.embed([f"{i} {long_text}"] * 8, timeout_s=0.02)
                return True
            except ClientError:
                return False

        with ThreadPoolExecutor(32) as pool:
            answered = list(pool.map(give_up, range(160)))
    assert answered.count(False) > 0, "no caller gave up: the test did not overload the lanes"
    with GrpcClient(text_server.grpc_url, timeout_s=30) as client, ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda i: client.embed([f"after the storm {i}"]), range(40)))
    assert all(g.shape == (1, 384) for g in got)
