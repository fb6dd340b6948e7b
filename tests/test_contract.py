"""The contract between the build and the served models: names, the padding rule, parameter records."""

from __future__ import annotations

import dataclasses
import shutil
import typing
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as hs

from tritonbundle import contract
from tritonbundle.contract import ContractError, PyTorchParameters, TokenizerParameters


def test_model_names() -> None:
    assert contract.encoder_name("minilm") == "minilm_encoder"
    assert contract.encoder_name("resnet", text=False) == "resnet"
    assert contract.tokenizer_name("minilm") == "minilm_tokenizer"


@given(longest=hs.integers(min_value=1, max_value=600),
       targets=hs.lists(hs.integers(min_value=1, max_value=512), min_size=1, max_size=8, unique=True))
def test_pad_length_is_the_smallest_target_that_holds_the_row(longest: int, targets: list[int]) -> None:
    holding = [t for t in targets if t >= longest]
    assert contract.pad_length(longest, targets) == (min(holding) if holding else longest)
    if holding:
        assert sorted(targets)[int(contract.target_index([longest], sorted(targets))[0])] == min(holding)


def test_target_index_refuses_a_row_longer_than_every_target() -> None:
    assert contract.target_index(np.array([1, 10, 11]), [10, 64]).tolist() == [0, 0, 1]
    with pytest.raises(ValueError, match="longer than the longest padding target 64"):
        contract.target_index([65], [10, 64])
    assert contract.pad_length(7, []) == 7  # the ragged policy: pad to the request's own longest row


def test_token_ids_outside_the_table_are_named_with_their_place() -> None:
    ids = np.array([[101, 7, 102], [101, 30522, 102]], np.int64)
    assert contract.token_ids_problem("input_ids", ids, 30522) == (
        "input input_ids holds 30522 at [1, 1]: token ids must lie in [0, 30522) (the model's vocabulary)"
    )
    assert "holds -3 at [0, 2]" in contract.token_ids_problem("ids", np.array([[1, 2, -3]]), 10)
    assert contract.token_ids_problem("ids", np.array([[0, 9]]), 10) == ""
    assert contract.token_ids_problem("ids", np.array([[99]]), 0) == ""  # table size unknown: not checked
    assert contract.token_ids_problem("ids", np.zeros((1, 0), np.int64), 10) == ""


def _pytorch() -> PyTorchParameters:
    return PyTorchParameters(
        padding_policy="targets", padding_targets=(32, 512), max_sequence_length=512, weights_file="w",
        config_file="c", recipe="minilm", random_weights=False, precision="fp16", cuda_graphs=True,
        batch_buckets=(1, 8), packing=True,
    )


def test_a_record_round_trips_through_config_strings() -> None:
    params = _pytorch().to_parameters()
    assert params["padding_targets"] == "32,512" and params["cuda_graphs"] == "true" and params["batch_buckets"] == "1,8"
    assert PyTorchParameters.from_parameters(params, strict=True) == _pytorch()
    config = {"name": "enc", "parameters": {k: {"string_value": v} for k, v in params.items()}}
    assert PyTorchParameters.from_config(config) == _pytorch()


def test_a_record_resolves_its_field_types_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Clients decode a model's parameters for every token request: resolving the annotations each time
    cost the load generator 1.4 ms per request."""
    from tritonbundle.clients.modelinfo import ModelInfo

    params = _pytorch().to_parameters()
    calls: list[type] = []
    real = typing.get_type_hints

    def counted(cls: type) -> dict[str, object]:
        calls.append(cls)
        return real(cls)

    monkeypatch.setattr(typing, "get_type_hints", counted)
    monkeypatch.setattr(contract, "_FIELD_TYPES", {})
    for _ in range(3):
        PyTorchParameters.from_parameters(params)
    assert calls == [PyTorchParameters]
    info = ModelInfo("m", "1", (), (), 8, contract.EncoderParameters(
        padding_policy="targets", padding_targets=(16, 32), max_sequence_length=32).to_parameters())
    assert info.encoder is info.encoder and info.padding_targets == (16, 32)


def test_a_missing_or_renamed_parameter_is_named() -> None:
    params = _pytorch().to_parameters()
    params["padding_target"] = params.pop("padding_targets")
    with pytest.raises(ContractError, match="model 'enc': config parameters lack padding_targets"):
        PyTorchParameters.from_parameters(params, model="enc")
    params["padding_targets"] = "32"
    PyTorchParameters.from_parameters(params)  # extra keys are read past by the served model ...
    with pytest.raises(ContractError, match="padding_target are not in PyTorchParameters"):
        PyTorchParameters.from_parameters(params, strict=True)  # ... and refused by the build's check


def test_a_repository_written_before_a_key_was_added_reads_with_its_default() -> None:
    """vocab_sizes came later than the encoders' other keys: a client reading an older repository's config
    lost the whole record (padding targets, the length cap) over it. A key with a default may be missing;
    the build's own check still wants every key."""
    params = contract.EncoderParameters(padding_policy="targets", padding_targets=(16, 32), max_sequence_length=32,
                                        vocab_sizes={"input_ids": 30522}).to_parameters()
    del params["vocab_sizes"]
    older = contract.EncoderParameters.from_parameters(params, model="enc")
    assert older.padding_targets == (16, 32) and older.vocab_sizes == {}
    with pytest.raises(ContractError, match="lack vocab_sizes"):
        contract.EncoderParameters.from_parameters(params, strict=True, model="enc")


def test_a_malformed_value_is_named() -> None:
    params = _pytorch().to_parameters() | {"cuda_graphs": "yes"}
    with pytest.raises(ContractError, match="parameter cuda_graphs: expected true or false, got 'yes'"):
        PyTorchParameters.from_parameters(params)


def test_the_contract_imports_nothing_from_the_project() -> None:
    """It is copied next to served models that run where tritonbundle is not installed."""
    import ast

    tree = ast.parse(Path(contract.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert {m.split(".")[0] for m in imported} <= {"__future__", "bisect", "dataclasses", "json", "typing",
                                                   "collections", "numpy"}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_config_that_breaks_the_contract_fails_the_build_and_keeps_the_repository(
    repository: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import ARTIFACTS, MANIFEST
    from tritonbundle.build.stage import BuildOptions, build
    from tritonbundle.errors import BuildError
    from tritonbundle.runtimes.tokenizer import plugin

    repo = tmp_path / "model_repository"
    shutil.copytree(repository, repo)
    before = (repo / "minilm_tokenizer" / "config.pbtxt").read_text()
    real = plugin.config

    def renamed(*args: object, **kwargs: object) -> object:
        cfg = real(*args, **kwargs)  # type: ignore[arg-type]
        params = dict(cfg.parameters)
        params["max_len"] = params.pop("max_length")
        return dataclasses.replace(cfg, parameters=params)

    monkeypatch.setattr(plugin, "config", renamed)
    with pytest.raises(BuildError, match="minilm_tokenizer.*lack max_length"):
        build(BuildOptions(manifest=MANIFEST, artifacts=ARTIFACTS, repository=repo, export=False))
    assert (repo / "minilm_tokenizer" / "config.pbtxt").read_text() == before
    assert TokenizerParameters.keys()[1] == "max_length"
