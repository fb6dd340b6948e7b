"""`tritonbundle build --check` compares the whole repository with what the build would write: a
changed config (queue policy, instances, warm-up, parameters), a changed served model.py or
tokenizer.json is reported, so the Helm init container rewrites the volume after an upgrade."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import ARTIFACTS, MANIFEST

pytestmark = pytest.mark.slow


def _options(repo: Path, **overrides: object) -> object:
    from tritonbundle.build.stage import BuildOptions

    return BuildOptions(manifest=MANIFEST, artifacts=ARTIFACTS, repository=repo, export=False, overrides=dict(overrides))


def test_a_fresh_repository_passes_and_every_kind_of_change_is_named(exported_minilm: Path, default_repository: Path,
                                                                    tmp_path: Path) -> None:
    from tritonbundle.build.stage import check_repository

    repo = tmp_path / "model_repository"
    shutil.copytree(default_repository, repo)
    assert check_repository(_options(repo)) == []  # type: ignore[arg-type]

    # An upgrade that changes a config (here: the queue policy), with the same plans.
    assert check_repository(_options(repo, max_queue_size=7)) == [  # type: ignore[arg-type]
        "minilm_encoder/config.pbtxt differs from what this build writes",
        "minilm_tokenizer/config.pbtxt differs from what this build writes",
    ]
    # A served model or the tokenizer changed on the volume (or in the new image).
    (repo / "minilm_tokenizer" / "1" / "model.py").write_text("# old\n")
    (repo / "minilm_tokenizer" / "1" / "tokenizer.json").unlink()
    (repo / "minilm_encoder" / "1" / "stale.txt").write_text("x")
    problems = check_repository(_options(repo))  # type: ignore[arg-type]
    assert "minilm_tokenizer/1/model.py differs from what this build writes" in problems
    assert "minilm_tokenizer/1/tokenizer.json is missing" in problems
    assert "minilm_encoder/1/stale.txt is not written by this build" in problems


def test_the_check_changes_nothing(exported_minilm: Path, default_repository: Path, tmp_path: Path) -> None:
    from tritonbundle.build.stage import check_repository

    repo = tmp_path / "model_repository"
    shutil.copytree(default_repository, repo)
    before = {p: p.read_bytes() for p in repo.rglob("*") if p.is_file()}
    check_repository(_options(repo, instances=3))  # type: ignore[arg-type]
    assert {p: p.read_bytes() for p in repo.rglob("*") if p.is_file()} == before
    assert not list(tmp_path.glob(".model_repository.staging-*"))
