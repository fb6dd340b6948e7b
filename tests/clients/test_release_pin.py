"""``embed_tokens`` names the encoder version the text model's ensemble pins (a release loads its
candidate as the newest version beside the pinned one): the rule for when the pin is read again, and
the retry when the version named was unloaded meanwhile. The transport is a double here (the calls
made and the versions named); tests/reliability/test_release.py runs it on the real server through a
release."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tritonbundle import contract
from tritonbundle.clients import AsyncGrpcClient, GrpcClient, HttpClient
from tritonbundle.errors import ModelNotFoundError, ServerUnavailableError


class _Server:
    """An encoder serving ``served`` versions behind an ensemble pinned to ``pin`` (-1: none)."""

    def __init__(self, served: set[str], pin: int) -> None:
        self.served, self.pin, self.reads, self.named = served, pin, 0, []  # type: set[str], int, int, list[str]
        self.down = False

    def config(self, model: str) -> dict[str, Any]:
        assert model == "minilm", model  # the text model's, where the pin is
        self.reads += 1
        if self.down:
            raise ServerUnavailableError("the server is restarting")
        steps = [{"model_name": "minilm_tokenizer"}, {"model_name": "minilm_encoder", "model_version": str(self.pin)}]
        return {"platform": "ensemble", "ensemble_scheduling": {"step": steps}}

    def infer(self, model: str, version: str) -> dict[str, np.ndarray[Any, Any]]:
        assert model == "minilm_encoder", model
        self.named.append(version)
        if version and version not in self.served:
            raise ModelNotFoundError(f"Request for unknown model: 'minilm_encoder' version {version} is not found")
        return {"out": np.ones((1, 4), np.float32)}


def _blocking(cls: type, server: _Server, **options: Any) -> Any:
    client = cls("127.0.0.1:1", model="minilm", **options)
    client.model_info = lambda model: SimpleNamespace(max_batch_size=32)
    client._token_request = lambda info, ids, mask: ({"input_ids": np.asarray(ids)}, "out")
    client._config_json = lambda model, retry=None: server.config(model)
    client._batched = lambda model, arrays, outputs, max_batch, timeout_s, version="": server.infer(model, version)
    return client


def _asyncio(server: _Server, **options: Any) -> Any:
    client = AsyncGrpcClient("127.0.0.1:1", model="minilm", **options)

    async def model_info(model: str) -> SimpleNamespace:
        return SimpleNamespace(max_batch_size=32)

    async def config(model: str) -> dict[str, Any]:
        return server.config(model)

    async def batched(model: str, arrays: Any, outputs: Any, max_batch: int, timeout_s: Any, headers: Any = None,
                      version: str = "") -> dict[str, np.ndarray[Any, Any]]:
        return server.infer(model, version)

    client.model_info, client._config_json, client._batched = model_info, config, batched
    client._token_request = lambda info, ids, mask: ({"input_ids": np.asarray(ids)}, "out")
    return client


def _aging(client: Any, seconds: float) -> None:
    """The client's last pin read and claim, ``seconds`` further in the past."""
    client._pin_read_at -= seconds
    client._pin_claimed_at -= seconds


@pytest.mark.parametrize("cls", [HttpClient, GrpcClient], ids=["http", "grpc"])
def test_token_rows_name_the_pinned_version_read_again_every_half_second(cls: type) -> None:
    server = _Server({"1", "2"}, pin=1)
    client = _blocking(cls, server)
    client.embed_tokens([[101, 102]])
    client.embed_tokens([[101, 102]])
    assert server.named == ["1", "1"] and server.reads == 1, "read once, then kept for PIN_REFRESH_S"
    server.pin = 2  # a release moved the pin: the calls follow once the pin read is PIN_REFRESH_S old
    _aging(client, contract.PIN_REFRESH_S)
    client.embed_tokens([[101, 102]])
    assert server.named[-1] == "2" and server.reads == 2
    server.pin = -1  # unpinned again: the newest version, unnamed
    _aging(client, contract.PIN_REFRESH_S)
    client.embed_tokens([[101, 102]])
    assert server.named[-1] == "" and server.reads == 3
    client.embed_tokens([[101, 102]], version="1")  # a version named by the caller: no read
    assert server.named[-1] == "1" and server.reads == 3


@pytest.mark.parametrize("cls", [HttpClient, GrpcClient], ids=["http", "grpc"])
def test_a_pinned_version_unloaded_meanwhile_is_retried_once_with_the_pin_read_again(cls: type) -> None:
    """A promotion pins N+1 and then unloads N: a call that read N before is retried with the new pin."""
    server = _Server({"1", "2"}, pin=1)
    client = _blocking(cls, server)
    client.embed_tokens([[101, 102]])
    server.pin, server.served = 2, {"2"}
    client.embed_tokens([[101, 102]])  # the pin read 0 s ago says 1: refused, read again, 2
    assert server.named == ["1", "1", "2"] and server.reads == 2
    server.served = set()  # the pin read again says what it said: the refusal is the answer
    with pytest.raises(ModelNotFoundError, match="version 2 is not found"):
        client.embed_tokens([[101, 102]])
    assert server.named[-2:] == ["2", "2"]


def test_a_failed_pin_read_keeps_the_last_pin_and_the_call_goes_on() -> None:
    server = _Server({"1"}, pin=1)
    client = _blocking(GrpcClient, server)
    client.embed_tokens([[101, 102]])
    server.down, server.pin = True, 2
    _aging(client, contract.PIN_REFRESH_S)
    client.embed_tokens([[101, 102]])
    assert server.named == ["1", "1"] and server.reads == 2


def test_one_caller_reads_a_stale_pin_while_the_others_go_on_until_it_is_twice_as_old() -> None:
    """Under steady calls one read per PIN_REFRESH_S; after a quiet spell (the pin 2 x PIN_REFRESH_S old,
    a release may have moved it since) every caller reads it before calling."""
    client = GrpcClient("127.0.0.1:1", model="minilm")
    first = client._claim_pin_read()
    assert first is not None and client._claim_pin_read() is not None, "no pin read yet: every caller reads"
    client._take_pin({}, first)
    assert client._claim_pin_read() is None
    _aging(client, contract.PIN_REFRESH_S)
    claimed = client._claim_pin_read()
    assert claimed is not None and client._claim_pin_read() is None, "one read per PIN_REFRESH_S"
    _aging(client, contract.PIN_REFRESH_S)  # that read never finished; the pin is now 2 x PIN_REFRESH_S old
    assert client._claim_pin_read() is not None and client._claim_pin_read() is not None
    assert client._claim_pin_read(again=True) is not None
    assert GrpcClient("127.0.0.1:1", model="minilm", token_model="minilm")._claim_pin_read() is None, \
        "a client of the encoder itself has no ensemble to read"


def test_a_pin_read_that_began_earlier_does_not_overwrite_a_later_one() -> None:
    client = GrpcClient("127.0.0.1:1", model="minilm")
    earlier = client._claim_pin_read()
    _aging(client, 2 * contract.PIN_REFRESH_S)
    later = client._claim_pin_read()
    assert earlier is not None and later is not None
    step = {"ensemble_scheduling": {"step": [{"model_name": "minilm_encoder", "model_version": "3"}]}}
    assert client._take_pin(step, later) == "3"
    assert client._take_pin({}, earlier) == "3", "the read that began first finished last: not kept"


def test_the_asyncio_client_follows_the_pin_and_retries_alike() -> None:
    server = _Server({"1", "2"}, pin=1)
    client = _asyncio(server)

    async def calls() -> None:
        await asyncio.gather(*(client.embed_tokens([[101, 102]]) for _ in range(8)))
        assert server.named == ["1"] * 8 and server.reads == 1, "one read for calls at the same moment"
        server.pin, server.served = 2, {"2"}
        await client.embed_tokens([[101, 102]])
        assert server.named[-2:] == ["1", "2"] and server.reads == 2
        await client.embed_tokens([[101, 102]], version="")  # "": the newest, named by the caller
        assert server.named[-1] == "" and server.reads == 2

    asyncio.run(calls())
