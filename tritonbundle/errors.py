"""The project's exception types.

A :class:`TritonBundleError` is a user error (bad manifest, unreachable server, rejected request):
the CLI prints its one-line message without a traceback and exits non-zero. Anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations


class TritonBundleError(Exception):
    """Base class of every error the user can act on."""

    exit_code = 1


class ConfigError(TritonBundleError):
    """A manifest, traffic sample, plan or model config is invalid."""

    exit_code = 2


class ExportError(TritonBundleError):
    """Exporting a model to ONNX failed, or the export does not match the source model."""


class BuildError(TritonBundleError):
    """The build stage failed (engine build, accuracy gate, repository swap)."""


class CommandError(TritonBundleError):
    """An external command (trtexec, docker, helm) failed; the message quotes the command."""


class ServerError(TritonBundleError):
    """The Triton server could not be started, did not become ready, or died."""


class ClientError(TritonBundleError):
    """A request to a Triton server failed.

    Every message names the model, the protocol and the server's reason.
    """

    def __init__(
        self,
        message: str,
        *,
        model: str | None = None,
        protocol: str | None = None,
        status: str | None = None,
        attempts: int = 1,
    ) -> None:
        super().__init__(message)
        self.model = model
        self.protocol = protocol
        self.status = status
        self.attempts = attempts


class InvalidInputError(ClientError):
    """The server refused the request's content (HTTP 400 / gRPC INVALID_ARGUMENT). Never retried."""


class ModelNotFoundError(ClientError):
    """The model or version does not exist on the server (HTTP 400/404, gRPC NOT_FOUND)."""


#: Triton's own texts for its two load answers (core's RequestQueue and its queue policy): the gateway
#: maps them to HTTP 429 and 503, the bench counts a level's refusals by them.
QUEUE_FULL = "Exceeds maximum queue size"
QUEUE_TIMEOUT = "Request timeout expired"


class ServerUnavailableError(ClientError):
    """The server could not be reached or refused for load (connection refused, HTTP 503, UNAVAILABLE)."""


class ClientBusyError(ClientError):
    """This client already has its limit of requests in flight: refused at once, like the server's
    own overload answer, instead of queueing where no deadline or metric sees it. Not retried."""


class DeadlineExceededError(ClientError):
    """The call did not finish within its deadline (client side or Triton's server-side timeout)."""


class UnauthorizedError(ClientError):
    """A restricted API (model control, repository, shared memory) was called without the right key."""


class MetadataMismatchError(ClientError):
    """The served model does not match what the client expects (checked at connect)."""
