"""A Triton server in memory, behind tritonclient's own request and result objects.

The clients' ``_infer`` runs for real: it builds tritonclient ``InferInput``s and ``InferRequestedOutput``s,
and the fakes here decode those back to arrays (what the wire would carry), answer with a function of
them, and return real ``InferResult``s (HTTP: a JSON header + binary body; gRPC: a ``ModelInferResponse``),
so request building and response parsing are tested without a server.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tritonclient.utils import (
    deserialize_bytes_tensor,
    np_to_triton_dtype,
    serialize_byte_tensor,
    triton_to_np_dtype,
)

from tritonbundle.clients import modelinfo

Arrays = dict[str, np.ndarray[Any, Any]]
#: (model, inputs) -> every output the model returns.
Respond = Callable[[str, Arrays], Arrays]


@dataclass
class Request:
    model: str
    inputs: Arrays
    #: The outputs the request named (None: it named none, so the server returns every output).
    outputs: list[str] | None
    headers: dict[str, str] | None
    #: The model version it named ("": none, the newest; the async clients' ``model_version``).
    version: str = ""


def _decode(raw: bytes, datatype: str, shape: list[int]) -> np.ndarray[Any, Any]:
    if datatype == "BYTES":
        return np.asarray(deserialize_bytes_tensor(raw)).reshape(shape)
    return np.frombuffer(raw, dtype=triton_to_np_dtype(datatype)).reshape(shape)


def _raw(array: np.ndarray[Any, Any]) -> bytes:
    if array.dtype == object:
        return bytes(serialize_byte_tensor(array).item())
    return np.ascontiguousarray(array).tobytes()


def http_result(outputs: Mapping[str, np.ndarray[Any, Any]]) -> Any:
    """A tritonclient HTTP ``InferResult`` holding ``outputs`` as binary data, as Triton sends them."""
    import tritonclient.http as httpclient

    raws = {name: _raw(a) for name, a in outputs.items()}
    header = json.dumps({"model_name": "m", "model_version": "1", "outputs": [
        {"name": name, "datatype": np_to_triton_dtype(a.dtype), "shape": list(a.shape),
         "parameters": {"binary_data_size": len(raws[name])}} for name, a in outputs.items()]}).encode()
    return httpclient.InferResult.from_response_body(header + b"".join(raws.values()), header_length=len(header))


def grpc_result(outputs: Mapping[str, np.ndarray[Any, Any]]) -> Any:
    """A tritonclient gRPC ``InferResult`` around a ``ModelInferResponse`` holding ``outputs``."""
    import tritonclient.grpc as grpcclient
    from tritonclient.grpc import service_pb2

    response = service_pb2.ModelInferResponse(model_name="m", model_version="1")
    for name, a in outputs.items():
        response.outputs.add(name=name, datatype=np_to_triton_dtype(a.dtype), shape=list(a.shape))
        response.raw_output_contents.append(_raw(a))
    return grpcclient.InferResult(response)


def info(name: str, inputs: Mapping[str, str], outputs: Mapping[str, str], *, max_batch_size: int = 0,
         task: str | None = None, parameters: Mapping[str, str] | None = None) -> modelinfo.ModelInfo:
    """A ModelInfo parsed from metadata and config as Triton's HTTP API writes them (``parameters``: the
    config's, e.g. an encoder's ``EncoderParameters.to_parameters()``)."""
    metadata = {"name": name, "versions": ["1"],
                "inputs": [{"name": n, "datatype": d, "shape": [-1, 1]} for n, d in inputs.items()],
                "outputs": [{"name": n, "datatype": d, "shape": [-1, 1]} for n, d in outputs.items()]}
    config: dict[str, Any] = {"name": name, "max_batch_size": max_batch_size}
    given = {**(parameters or {}), **({"task": task} if task is not None else {})}
    if given:
        config["parameters"] = {k: {"string_value": v} for k, v in given.items()}
    return modelinfo.model_info(metadata, config)


@dataclass
class FakeTriton:
    """Answers with ``respond``; records every request."""

    respond: Respond
    requests: list[Request] = field(default_factory=list)

    def _answer(self, model: str, inputs: list[Any], outputs: list[Any] | None, headers: dict[str, str] | None,
                raw: Callable[[Any], bytes], version: str = "") -> Arrays:
        arrays = {i.name(): _decode(raw(i), i.datatype(), i.shape()) for i in inputs}
        named = [o.name() for o in outputs] if outputs is not None else None
        self.requests.append(Request(model, arrays, named, headers, version))
        if headers is not None:  # what tritonclient's HTTP client does to the dict it is given
            headers["Inference-Header-Content-Length"] = str(len(self.requests))
        every = self.respond(model, arrays)
        return every if named is None else {n: every[n] for n in named}


class _Pending:
    def __init__(self, result: Any) -> None:
        self.result = result

    def get_result(self, block: bool = True, timeout: float | None = None) -> Any:
        return self.result


class FakeHttp(FakeTriton):
    """tritonclient.http.InferenceServerClient's ``async_infer``."""

    def async_infer(self, model: str, inputs: list[Any], model_version: str = "", outputs: list[Any] | None = None, timeout: Any = None,
                    headers: dict[str, str] | None = None) -> _Pending:
        return _Pending(http_result(self._answer(model, inputs, outputs, headers, lambda i: i._get_binary_data())))

    def close(self) -> None:
        pass


class FakeGrpc(FakeTriton):
    """tritonclient.grpc.InferenceServerClient's ``infer``."""

    def infer(self, model: str, inputs: list[Any], model_version: str = "", outputs: list[Any] | None = None, client_timeout: Any = None,
              timeout: Any = None, headers: dict[str, str] | None = None) -> Any:
        return grpc_result(self._answer(model, inputs, outputs, headers, lambda i: i._get_content()))

    def close(self) -> None:
        pass


class FakeAioHttp(FakeTriton):
    async def infer(self, model: str, inputs: list[Any], model_version: str = "", outputs: list[Any] | None = None,
                    timeout: Any = None, headers: dict[str, str] | None = None) -> Any:
        return http_result(self._answer(model, inputs, outputs, headers, lambda i: i._get_binary_data(), model_version))

    async def close(self) -> None:
        pass


class FakeAioGrpc(FakeTriton):
    async def infer(self, model: str, inputs: list[Any], model_version: str = "", outputs: list[Any] | None = None,
                    client_timeout: Any = None, timeout: Any = None, headers: dict[str, str] | None = None) -> Any:
        return grpc_result(self._answer(model, inputs, outputs, headers, lambda i: i._get_content(), model_version))

    async def close(self) -> None:
        pass


def attach(client: Any, fake: FakeTriton, *models: modelinfo.ModelInfo) -> Any:
    """Put ``fake`` under ``client`` (no connection is made) and give it the models' descriptions."""
    protocol = getattr(client, "protocol", "")
    if isinstance(fake, (FakeAioHttp, FakeAioGrpc)):
        client._client = fake
    elif protocol == "http":
        client._open()
        client._pool = lambda timeout_s: fake  # every thread's pool, whatever its timeout
    else:
        client._clients = [fake]
        client._next = itertools.cycle(client._clients)
        client._client = fake
    for m in models:
        client._infos[m.name] = m
    return client
