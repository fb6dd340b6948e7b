"""What the HTTP, gRPC and asyncio clients share: retry policy, error mapping, request building,
splitting and padding (the model's description and checks: :mod:`.modelinfo`). Nothing here does I/O."""

from __future__ import annotations

import random
import re
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tritonbundle import contract
from tritonbundle.clients.modelinfo import (
    ModelInfo,
    check_inputs,
    check_method,
    check_output,
    logits_output,
    response_output_names,
    task_outputs,
)
from tritonbundle.clients.pin import ReleasePin
from tritonbundle.errors import (
    ClientError,
    DeadlineExceededError,
    InvalidInputError,
    MetadataMismatchError,
    ModelNotFoundError,
    ServerUnavailableError,
    UnauthorizedError,
)

PROTOCOLS = ("http", "grpc")
#: The Python backend's answer while a model's stub process is dead (python_backend ``src/python_be.cc``:
#: "Stub process '<model>_0_0' is not healthy."; through an ensemble: "in ensemble '<name>', Stub ...").
STUB_RESTARTING = re.compile(r"Stub process '[^']*' is not healthy", re.IGNORECASE)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter, only for errors that are safe to retry.

    Safe: the connection was refused or dropped (the served models are stateless, so an inference
    is idempotent even when the server died mid-request), HTTP 503, gRPC UNAVAILABLE (overload, or
    the server is restarting). Never retried: invalid input, unknown
    model, deadline exceeded, internal errors, this client's own in-flight limit. Attempts stop early
    when the call's deadline would pass before the next one could start.

    The default keeps retrying until the call's deadline (``timeout_s``, 30 s by default), at most
    one attempt a second once backed off: a restart of the server (a few seconds; up to about 15 s
    when the supervisor's canary restarts it) is ridden over. Set ``max_attempts`` to bound it.
    """

    max_attempts: int = 1000
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 1.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if self.initial_backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError("backoff times must be >= 0")

    def delays(self, rng: random.Random | None = None) -> Iterator[float]:
        """Sleep before attempt 2, 3, ...: uniform in [0, min(max, initial * multiplier^k)]."""
        rng = rng or random.Random()
        for k in range(self.max_attempts - 1):
            yield rng.uniform(0, min(self.max_backoff_s, self.initial_backoff_s * self.multiplier**k))


NO_RETRY = RetryPolicy(max_attempts=1)


#: Transport errors, by name, of a connection that dropped (geventhttpclient's, grpc's, aiohttp's: aiohttp's
#: ``ServerDisconnectedError`` is no OSError, and is what a stale keep-alive connection to a restarted server raises).
DROPPED = ("HTTPConnectionClosed", "ConnectionClosed", "ServerDisconnectedError", "ServerConnectionError",
           "ClientConnectionError")


def classify(error: BaseException, *, model: str, protocol: str) -> ClientError:
    """Map a tritonclient/transport exception to the project's error types."""
    from tritonclient.utils import InferenceServerException

    if isinstance(error, ClientError):
        return error
    if isinstance(error, InferenceServerException):
        status = str(error.status() or "")
        reason = error.message() or str(error)
        code = status.removeprefix("StatusCode.")
        message = f"model {model!r} over {protocol}: {reason}"
        if "is restricted, expecting header" in reason or code in ("401", "403", "PERMISSION_DENIED", "UNAUTHENTICATED"):
            return UnauthorizedError(
                f"{message} (restricted API: pass the server's key, api_key=... / $TRITONBUNDLE_API_KEY)",
                model=model, protocol=protocol, status=code,
            )
        if code in ("400", "INVALID_ARGUMENT"):
            if "unknown model" in reason.lower() or "not found" in reason.lower():
                return ModelNotFoundError(message, model=model, protocol=protocol, status=code)
            return InvalidInputError(message, model=model, protocol=protocol, status=code)
        if code in ("404", "NOT_FOUND"):
            return ModelNotFoundError(message, model=model, protocol=protocol, status=code)
        if code in ("503", "UNAVAILABLE"):
            return ServerUnavailableError(message, model=model, protocol=protocol, status=code)
        if STUB_RESTARTING.search(reason):
            # HTTP 500 / INTERNAL, but not the request's fault: the model's Python stub died (a crash, the
            # OOM killer). Triton 2.51 does not restart it; `tritonbundle serve --restart` restarts the server
            # when its canary sees it (seconds). The served models are stateless, so the request is as safe
            # to send again as one whose connection was refused; without a supervisor, retries end at the
            # call's deadline, as for a server that stays down.
            return ServerUnavailableError(
                f"{message} (the model's Python stub is dead and restarting)", model=model, protocol=protocol,
                status=code,
            )
        if code in ("504", "408", "DEADLINE_EXCEEDED") or "deadline exceeded" in reason.lower():
            return DeadlineExceededError(message, model=model, protocol=protocol, status=code)
        if code in ("429", "RESOURCE_EXHAUSTED"):
            if "size" in reason.lower() and "exceed" in reason.lower():  # "metadata size exceeds ...": no retry fixes it
                return InvalidInputError(message, model=model, protocol=protocol, status=code)
            return ServerUnavailableError(message, model=model, protocol=protocol, status=code)
        return ClientError(message, model=model, protocol=protocol, status=code or None)
    # A connection dropped mid-request (the server died or restarted) is safe to retry too: these
    # models are stateless, so an inference request is idempotent.
    if isinstance(error, ConnectionError) or type(error).__name__ in DROPPED:
        return ServerUnavailableError(
            f"model {model!r} over {protocol}: cannot reach the server ({error})", model=model, protocol=protocol,
            status="UNAVAILABLE",
        )
    if isinstance(error, (TimeoutError, socket.timeout)) or type(error).__name__ in ("Timeout", "TimeoutError"):
        return DeadlineExceededError(
            f"model {model!r} over {protocol}: no response within the deadline", model=model, protocol=protocol,
            status="DEADLINE_EXCEEDED",
        )
    if isinstance(error, OSError):
        return ServerUnavailableError(
            f"model {model!r} over {protocol}: connection failed ({error})", model=model, protocol=protocol,
            status="UNAVAILABLE",
        )
    return ClientError(f"model {model!r} over {protocol}: {type(error).__name__}: {error}", model=model, protocol=protocol)


def retryable(error: ClientError) -> bool:
    return isinstance(error, ServerUnavailableError)


def with_attempts(error: ClientError, attempts: int) -> ClientError:
    """The final error of a retried call: says how many attempts were made."""
    if attempts > 1:
        error.args = (f"{error.args[0]} (after {attempts} attempts)",)
    error.attempts = attempts
    return error


# -- request building --------------------------------------------------------------------------------
def chunks(n: int, max_batch_size: int) -> list[slice]:
    """Row slices of at most ``max_batch_size`` (all rows when the model has no batch limit)."""
    if n == 0:
        return []
    size = max_batch_size if max_batch_size > 0 else n
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def text_array(texts: Sequence[str | bytes]) -> np.ndarray[Any, Any]:
    """A [N, 1] BYTES array; str is UTF-8 encoded, bytes are sent as given (the server checks them)."""
    if isinstance(texts, (str, bytes)):
        raise TypeError("texts must be a sequence of strings, not a single string")
    rows = []
    for i, t in enumerate(texts):
        if not isinstance(t, (str, bytes, bytearray)):  # bytes(3) would be three NUL bytes
            raise TypeError(f"texts[{i}] is {type(t).__name__}, not str or bytes")
        rows.append(t.encode("utf-8") if isinstance(t, str) else bytes(t))
    out = np.empty((len(rows), 1), dtype=object)
    for i, row in enumerate(rows):
        out[i, 0] = row
    return out


def pair_arrays(query: str | bytes, passages: Sequence[str | bytes]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(QUERY, TEXT) rows of a text-pair request: the query repeated beside each passage, [N, 1] each."""
    if not isinstance(query, (str, bytes)):
        raise TypeError(f"query must be one string, not {type(query).__name__}")
    texts = text_array(passages)
    return text_array([query] * texts.shape[0]), texts


def pad_tokens(
    ids: Sequence[Sequence[int]] | np.ndarray[Any, Any], mask: Sequence[Sequence[int]] | np.ndarray[Any, Any] | None,
    targets: Sequence[int], *, max_length: int = 0, pad_id: int = 0,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Pad token rows to the smallest padding target that holds the longest row.

    With no targets (the ragged policy) rows are padded to the longest row only. Rows longer than
    ``max_length`` (when set) are refused here, before a request is sent.
    """
    rows = [np.asarray(r, dtype=np.int64).reshape(-1) for r in ids]
    if mask is None:
        masks = [np.ones_like(r) for r in rows]
    else:
        masks = [np.asarray(m, dtype=np.int64).reshape(-1) for m in mask]
        if len(masks) != len(rows) or any(len(a) != len(b) for a, b in zip(rows, masks)):
            raise InvalidInputError("token ids and attention mask must have the same shape, row by row")
    if not rows:
        raise InvalidInputError("no token rows: send at least one")

    def used(row: np.ndarray[Any, Any], row_mask: np.ndarray[Any, Any]) -> int:
        nonzero = np.flatnonzero(row_mask)
        return int(nonzero[-1]) + 1 if nonzero.size else 0

    longest = max(1, max(used(r, m) for r, m in zip(rows, masks)))
    if max_length and longest > max_length:
        raise InvalidInputError(f"a row has {longest} tokens; the model takes at most {max_length}")
    length = contract.pad_length(longest, targets)
    out_ids = np.full((len(rows), length), pad_id, dtype=np.int64)
    out_mask = np.zeros((len(rows), length), dtype=np.int64)
    for i, (r, m) in enumerate(zip(rows, masks)):
        n = min(len(r), length)
        out_ids[i, :n] = r[:n]
        out_mask[i, :n] = m[:n]
    return out_ids, out_mask


def server_timeout_us(timeout_s: float | None) -> int | None:
    """Triton's server-side request timeout (microseconds) for a client deadline."""
    if timeout_s is None:
        return None
    return max(1, int(timeout_s * 1_000_000))


class ClientBase:
    """Settings and request preparation shared by the blocking and the asyncio clients."""

    protocol = ""

    def __init__(
        self,
        url: str,
        *,
        model: str = "minilm",
        token_model: str | None = None,
        text_input: str | None = None,
        token_inputs: tuple[str, str] = ("input_ids", "attention_mask"),
        output: str | None = None,
        timeout_s: float = 30.0,
        connect_timeout_s: float = 10.0,
        retry: RetryPolicy | None = None,
        pool_size: int = 4,
        check_model: bool = True,
        headers: dict[str, str] | None = None,
        api_key: str | None = None,
        shared_memory: bool = False,
        shared_memory_min_bytes: int = 1 << 20,
        verbose: bool = False,
    ) -> None:
        if timeout_s <= 0 or connect_timeout_s <= 0:
            raise ValueError("timeout_s and connect_timeout_s must be > 0")
        if pool_size < 1:
            raise ValueError("pool_size must be >= 1")
        if url.startswith(("https://", "grpcs://")):  # dropping the scheme would send the key in the clear
            raise ValueError(f"{url}: these clients speak plain HTTP and gRPC, not TLS; call the server (or the "
                             "edge) at its plain address inside the cluster, or through a TLS-terminating proxy")
        self.url = url.removeprefix("http://")
        self.model = model
        self.token_model = token_model or contract.encoder_name(model)
        self.text_input = text_input or contract.TEXT_INPUT
        self._named_text_input = text_input is not None
        self.token_inputs = token_inputs
        self.output = output
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.retry = retry or RetryPolicy()
        self.pool_size = pool_size
        self.check_model = check_model
        self.headers = dict(headers or {})
        self.api_key = api_key
        self.shared_memory = shared_memory
        self.shared_memory_min_bytes = shared_memory_min_bytes
        self.verbose = verbose
        self._infos: dict[str, ModelInfo] = {}
        self._rng = random.Random()
        #: The token model's version the text model's ensemble pins, which ``embed_tokens`` names (pin.py).
        self._pin = ReleasePin(self.model, self.token_model)

    def _restricted_headers(self) -> dict[str, str]:
        """Headers for the restricted APIs (repository, model control, shared memory)."""
        headers = dict(self.headers)
        if self.api_key:
            prefix = contract.GRPC_RESTRICTED_PREFIX if self.protocol == "grpc" else ""
            headers[prefix + contract.RESTRICTED_HEADER] = self.api_key
        return headers

    def _not_ready(self) -> ServerUnavailableError:
        return ServerUnavailableError(
            f"server at {self.url} over {self.protocol} is not ready", model=self.model, protocol=self.protocol,
            status="UNAVAILABLE",
        )

    def _unknown_model(self, available: Sequence[str] | None) -> MetadataMismatchError:
        there = f"; models there: {', '.join(available)}" if available else ""
        return MetadataMismatchError(
            f"the client expects model {self.model!r}, but the server at {self.url} over {self.protocol} "
            f"does not serve it{there}", model=self.model, protocol=self.protocol,
        )

    def _request_headers(self) -> dict[str, str]:
        """A fresh copy of the headers for one request: tritonclient's HTTP clients write the request's
        ``Inference-Header-Content-Length`` into the dict they are given, and threads sharing one dict
        sent each other's lengths (the server then split the body at the wrong byte)."""
        return dict(self.headers)

    def _remember(self, model: str, info: ModelInfo) -> ModelInfo:
        """Cache a model's description; for the client's own model, check what the caller named
        (``text_input=``, ``output=``) at once. What each method needs is checked by the method, so
        a client connects to a model of any task."""
        if model == self.model and self.check_model:
            if self._named_text_input:
                check_inputs(info, {self.text_input: "BYTES"}, protocol=self.protocol, url=self.url)
            if self.output is not None:
                check_output(info, self.output, protocol=self.protocol, url=self.url)
        self._infos[model] = info
        return info

    def _check_method(self, info: ModelInfo, method: str) -> None:
        check_method(info, method, text_input=self.text_input, protocol=self.protocol, url=self.url)

    def _no_rows(self, what: str) -> InvalidInputError:
        return InvalidInputError(f"no {what}: send at least one", model=self.model, protocol=self.protocol)

    def _embed_request(self, info: ModelInfo, texts: Sequence[str | bytes]) -> tuple[dict[str, np.ndarray[Any, Any]], str]:
        self._check_method(info, "embed")
        array = text_array(texts)
        if array.shape[0] == 0:
            raise self._no_rows("texts")
        output = check_output(info, self.output, protocol=self.protocol, url=self.url)
        return {self.text_input: array}, output

    def _classify_request(
        self, info: ModelInfo, texts: Sequence[str | bytes]
    ) -> tuple[dict[str, np.ndarray[Any, Any]], list[str], str | None]:
        """The TEXT rows, the outputs to read (logits, label, score) and the logits' name."""
        self._check_method(info, "classify")
        array = text_array(texts)
        if array.shape[0] == 0:
            raise self._no_rows("texts")
        logits = logits_output(info)
        return {self.text_input: array}, task_outputs(logits, contract.LABEL_OUTPUT, contract.SCORE_OUTPUT), logits

    def _rerank_request(
        self, info: ModelInfo, query: str | bytes, passages: Sequence[str | bytes]
    ) -> tuple[dict[str, np.ndarray[Any, Any]], list[str]]:
        """One (QUERY, TEXT) pair per row (the query beside each passage, in the passages' order), and
        the outputs to read."""
        self._check_method(info, "rerank")
        queries, texts = pair_arrays(query, passages)
        if texts.shape[0] == 0:
            raise self._no_rows("passages")
        outputs = task_outputs(logits_output(info), contract.SCORE_OUTPUT)
        return {contract.QUERY_INPUT: queries, self.text_input: texts}, outputs

    def _token_request(
        self, info: ModelInfo, ids: Sequence[Sequence[int]] | np.ndarray[Any, Any], mask: Sequence[Sequence[int]] | np.ndarray[Any, Any] | None
    ) -> tuple[dict[str, np.ndarray[Any, Any]], str]:
        """Pad token rows to the plan's padding targets (read from the model config)."""
        check_inputs(info, dict.fromkeys(self.token_inputs, "INT64"), protocol=self.protocol, url=self.url)
        output = check_output(info, self.output, protocol=self.protocol, url=self.url)
        padded_ids, padded_mask = pad_tokens(ids, mask, info.padding_targets, max_length=info.max_sequence_length)
        # Refused here, before a request: a TensorRT plan indexes its table with whatever it is sent.
        problem = contract.token_ids_problem(self.token_inputs[0], padded_ids, info.vocab_sizes.get(self.token_inputs[0], 0))
        if problem:
            raise InvalidInputError(f"model {info.name!r}: {problem}")
        return {self.token_inputs[0]: padded_ids, self.token_inputs[1]: padded_mask}, output

    def _outputs(self, result: Any, names: Sequence[str], model: str) -> dict[str, np.ndarray[Any, Any]]:
        """The requested outputs of a response (every output it holds when none were named); a
        requested output the response lacks is an error, not None."""
        out = {}
        for name in names or response_output_names(result):
            value = result.as_numpy(name)
            if value is None:
                raise ClientError(
                    f"model {model!r} over {self.protocol}: the response has no output {name!r} "
                    "(the model returned something else)", model=model, protocol=self.protocol,
                )
            out[name] = value
        return out

    def _remaining(self, deadline: float) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise DeadlineExceededError(
                f"model {self.model!r} over {self.protocol}: deadline exceeded", model=self.model,
                protocol=self.protocol, status="DEADLINE_EXCEEDED",
            )
        return left

    def _deadline_error(self, model: str, timeout_s: float) -> DeadlineExceededError:
        return DeadlineExceededError(
            f"model {model!r} over {self.protocol}: no response within {timeout_s:.3g} s", model=model,
            protocol=self.protocol, status="DEADLINE_EXCEEDED",
        )

    def _retry_or_raise(
        self, error: BaseException, model: str, attempts: int, delay: float | None, deadline: float
    ) -> ClientError | None:
        """Classify ``error``; return it when the call must stop here (the caller raises it)."""
        err = classify(error, model=model, protocol=self.protocol)
        if not retryable(err) or delay is None or time.monotonic() + delay >= deadline:
            return with_attempts(err, attempts)
        return None


def until_deadline(policy: RetryPolicy) -> RetryPolicy:
    """For waiting on a starting server: keep trying until the deadline, not a fixed count."""
    return RetryPolicy(max_attempts=10_000, initial_backoff_s=max(policy.initial_backoff_s, 0.1), max_backoff_s=1.0)


def batching_summary(cfg: dict[str, Any]) -> str:
    if cfg.get("platform") == "ensemble":
        return "ensemble"
    db = cfg.get("dynamic_batching")
    if db is None:
        return "off"
    preferred = db.get("preferred_batch_size") or []
    delay = db.get("max_queue_delay_microseconds", 0)
    return f"dynamic (preferred {list(map(int, preferred)) or '-'}, max delay {delay} us)"
