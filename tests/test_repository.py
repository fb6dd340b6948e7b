"""The committed model repository is what the build stage writes, and it loads in a real server."""

from __future__ import annotations

from pathlib import Path

import pytest

from tritonbundle.modelconfig import read_config

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "model_repository"


@pytest.mark.slow
def test_committed_configs_match_what_the_build_stage_writes(default_repository: Path) -> None:
    repository = default_repository
    committed = sorted(p.relative_to(COMMITTED) for p in COMMITTED.glob("*/config.pbtxt"))
    generated = sorted(p.relative_to(repository) for p in repository.glob("*/config.pbtxt"))
    assert committed == generated
    for rel in generated:
        assert (COMMITTED / rel).read_text() == (repository / rel).read_text(), (
            f"{rel} differs from the build stage's output: run `tritonbundle repo` and commit"
        )
    python = sorted(p.relative_to(repository) for p in repository.glob("*/1/**/*.py"))
    assert python == sorted(p.relative_to(COMMITTED) for p in COMMITTED.glob("*/1/**/*.py"))
    for rel in python:  # model.py and the package modules vendored next to it
        assert (COMMITTED / rel).read_text() == (repository / rel).read_text(), f"{rel} is stale: run `tritonbundle repo`"


def test_every_committed_config_parses_into_modelconfig() -> None:
    configs = list(COMMITTED.glob("*/config.pbtxt"))
    assert {c.parent.name for c in configs} >= {"minilm", "minilm_encoder", "minilm_tokenizer"}
    for path in configs:
        config = read_config(path)
        assert config.name == path.parent.name


def test_encoder_config_batches_dynamically_with_ragged_inputs() -> None:
    config = read_config(COMMITTED / "minilm_encoder" / "config.pbtxt")
    assert config.max_batch_size > 0
    assert config.backend == "python"
    assert all(list(i.dims) == [-1] and i.allow_ragged_batch for i in config.input)
    assert config.HasField("dynamic_batching")


@pytest.mark.slow
def test_every_model_is_ready_in_the_real_server(server: object) -> None:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.http_url)  # type: ignore[attr-defined]
    for name in ("minilm", "minilm_encoder", "minilm_tokenizer"):
        assert client.is_model_ready(name), name
    client.close()


@pytest.mark.slow
def test_failed_build_leaves_the_previous_repository_in_place(repository: Path, tmp_path: Path) -> None:
    import shutil

    from tritonbundle.build.stage import BuildOptions, build
    from tritonbundle.errors import ConfigError

    repo = tmp_path / "model_repository"
    shutil.copytree(repository, repo)
    before = {p: p.read_bytes() for p in repo.rglob("*") if p.is_file()}
    bad = tmp_path / "models.yaml"
    text = (ROOT / "build" / "models.yaml").read_text().replace("traffic: traffic/chat.jsonl", "traffic: empty.jsonl")
    bad.write_text(text)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ConfigError, match="empty"):
        build(BuildOptions(manifest=bad, repository=repo, artifacts=ROOT / "build" / "artifacts", export=False))
    after = {p: p.read_bytes() for p in repo.rglob("*") if p.is_file()}
    assert before == after
    assert not list(tmp_path.glob(".model_repository.*")), "staging folders must be cleaned up"


@pytest.mark.slow
def test_failure_after_staging_swaps_nothing_in(repository: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from tritonbundle.build import repository as repository_mod
    from tritonbundle.build.repository import write_repository
    from tritonbundle.build.stage import BuildOptions, existing_artifacts, plan_all

    repo = tmp_path / "model_repository"
    shutil.copytree(repository, repo)
    (repo / "minilm_encoder" / "config.pbtxt").write_text((repo / "minilm_encoder" / "config.pbtxt").read_text() + "# marker\n")
    before = {p: p.read_bytes() for p in repo.rglob("*") if p.is_file()}
    options = BuildOptions(manifest=ROOT / "build" / "models.yaml", artifacts=ROOT / "build" / "artifacts", repository=repo)
    entries = [(spec, plan, existing_artifacts(spec, options)) for spec, plan in plan_all(options)]

    def failing_check(staging: Path, names: object, source: str) -> None:
        # Every model is staged by now; the check that runs before the swap fails.
        assert (staging / "minilm_encoder" / "config.pbtxt").exists()
        raise RuntimeError("staged repository check failed")

    monkeypatch.setattr(repository_mod, "_check_staged", failing_check)
    with pytest.raises(RuntimeError, match="staged repository check"):
        write_repository(entries, repo, work_root=tmp_path / "work")
    assert {p: p.read_bytes() for p in repo.rglob("*") if p.is_file()} == before
    assert not list(tmp_path.glob(".model_repository.*"))


def test_served_files_are_copies_not_links_of_the_artifacts(default_repository: Path) -> None:
    """A later export rewrites build/artifacts: a hard link would change the served model with it."""
    artifacts = ROOT / "build" / "artifacts" / "minilm"
    for served, artifact in ((default_repository / "minilm_encoder" / "1" / "model.onnx", artifacts / "model.onnx"),
                             (default_repository / "minilm_tokenizer" / "1" / "tokenizer.json", artifacts / "tokenizer.json")):
        assert served.read_bytes() == artifact.read_bytes()
        assert served.stat().st_ino != artifact.stat().st_ino, f"{served} is a hard link of {artifact}"
