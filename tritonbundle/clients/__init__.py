"""Python clients for the bundle's models, on top of ``tritonclient``.

* :class:`HttpClient`, :class:`GrpcClient`: blocking; :func:`connect` picks one by protocol name.
* :class:`AsyncHttpClient`, :class:`AsyncGrpcClient`: asyncio.

One method per task of the served model (its config's ``task`` parameter, :attr:`ModelInfo.task`):
``infer`` (any tensors, every output), ``embed``, ``classify`` (:class:`Classification` per text) and
``rerank`` (a relevance score per passage). All are context managers, check at connect that the model
exists, check before each call that the method fits the model (naming the one that does), take
keyword-only ``timeout_s`` deadlines, retry only safe failures, and raise the project's error types
(``tritonbundle.errors``).
"""

from tritonbundle.clients.core import RetryPolicy
from tritonbundle.clients.modelinfo import Classification, ModelInfo
from tritonbundle.clients.sync import GrpcClient, HttpClient, connect
from tritonbundle.errors import (
    ClientBusyError,
    ClientError,
    DeadlineExceededError,
    InvalidInputError,
    MetadataMismatchError,
    ModelNotFoundError,
    ServerUnavailableError,
    UnauthorizedError,
)

__all__ = [
    "Classification", "ClientBusyError", "ClientError", "DeadlineExceededError", "GrpcClient", "HttpClient", "InvalidInputError",
    "MetadataMismatchError", "ModelInfo", "ModelNotFoundError", "RetryPolicy", "ServerUnavailableError", "UnauthorizedError", "connect",
]


def __getattr__(name: str) -> object:
    # The asyncio clients import aiohttp / grpc.aio lazily.
    if name in ("AsyncHttpClient", "AsyncGrpcClient", "aconnect"):
        from tritonbundle.clients import aio

        return getattr(aio, name)
    raise AttributeError(name)
