"""What the HTTP, gRPC and asyncio clients share: retry policy, error mapping, model checks,
request splitting and padding. Nothing here does I/O."""

from __future__ import annotations

import random
import re
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tritonbundle import contract
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
#: The client method that calls each task's user-facing model (tritonbundle.tasks says the same).
METHODS = {"tensor": "infer", "text-embedding": "embed", "text-classification": "classify", "text-pair": "rerank"}


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
            return ServerUnavailableError(message, model=model, protocol=protocol, status=code)
        return ClientError(message, model=model, protocol=protocol, status=code or None)
    # A connection dropped mid-request (the server died or restarted) is safe to retry too: these
    # models are stateless, so an inference request is idempotent.
    if isinstance(error, ConnectionError) or type(error).__name__ in ("HTTPConnectionClosed", "ConnectionClosed"):
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


# -- model description ------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorInfo:
    name: str
    datatype: str  # protocol name: BYTES, INT64, FP32...
    shape: tuple[int, ...]  # as the metadata reports it (batch included as -1 when batched)


@dataclass(frozen=True)
class ModelInfo:
    name: str
    version: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    max_batch_size: int
    parameters: dict[str, str] = field(default_factory=dict)

    def input(self, name: str) -> TensorInfo:
        for t in self.inputs:
            if t.name == name:
                return t
        raise KeyError(name)

    @property
    def task(self) -> str | None:
        """What the model's config says it is (:class:`tritonbundle.contract.TaskParameters`: ``tensor``,
        ``text-embedding``, ``text-classification``, ``text-pair``); None for a model the build did not
        write (see :meth:`kind`)."""
        return self.parameters.get("task") or None

    def kind(self) -> str:
        """The task, else a guess from the inputs: ``text-pair`` with BYTES ``QUERY`` and ``TEXT``,
        ``text-embedding`` with a BYTES ``TEXT``, else ``tensor``."""
        if self.task:
            return self.task
        served = {t.name: t.datatype for t in self.inputs}
        if served.get(contract.TEXT_INPUT) == "BYTES":
            return "text-pair" if served.get(contract.QUERY_INPUT) == "BYTES" else "text-embedding"
        return "tensor"

    @property
    def encoder(self) -> contract.EncoderParameters | None:
        """What the encoder's config says about token input (None for a model the build did not write)."""
        try:
            return contract.EncoderParameters.from_parameters(self.parameters, model=self.name)
        except contract.ContractError:
            return None

    @property
    def padding_targets(self) -> tuple[int, ...]:
        """Lengths the build stage's plan pads to."""
        return tuple(sorted(self.encoder.padding_targets)) if self.encoder else ()

    @property
    def max_sequence_length(self) -> int:
        return self.encoder.max_sequence_length if self.encoder else 0


def model_info(metadata: dict[str, Any], config: dict[str, Any]) -> ModelInfo:
    """Build :class:`ModelInfo` from the JSON-shaped metadata and config (HTTP form, or gRPC via
    ``as_json=True``)."""
    cfg = config.get("config", config)

    def tensors(items: Sequence[dict[str, Any]]) -> tuple[TensorInfo, ...]:
        return tuple(TensorInfo(t["name"], t["datatype"], tuple(int(d) for d in t.get("shape", ()))) for t in items)

    params = {}
    for key, value in (cfg.get("parameters") or {}).items():
        params[key] = value.get("string_value", "") if isinstance(value, dict) else str(value)
    versions = metadata.get("versions") or [""]
    return ModelInfo(
        name=metadata["name"],
        version=str(versions[-1]),
        inputs=tensors(metadata.get("inputs", ())),
        outputs=tensors(metadata.get("outputs", ())),
        max_batch_size=int(cfg.get("max_batch_size", 0) or 0),
        parameters=params,
    )


def check_inputs(info: ModelInfo, expected: dict[str, str], *, protocol: str, url: str) -> None:
    """Raise :class:`MetadataMismatchError` naming both sides if the served inputs differ."""
    served = {t.name: t.datatype for t in info.inputs}
    missing = [n for n in expected if n not in served]
    if missing:
        raise MetadataMismatchError(
            f"model {info.name!r} at {url} over {protocol} has inputs {_fmt(served)}, "
            f"but the client expects {_fmt(expected)}",
            model=info.name, protocol=protocol,
        )
    wrong = {n: (served[n], d) for n, d in expected.items() if served[n] != d}
    if wrong:
        details = ", ".join(f"{n}: server {s}, client {c}" for n, (s, c) in wrong.items())
        raise MetadataMismatchError(
            f"model {info.name!r} at {url} over {protocol}: input data types differ ({details})",
            model=info.name, protocol=protocol,
        )


def check_output(info: ModelInfo, output: str | None, *, protocol: str, url: str) -> str:
    names = [t.name for t in info.outputs]
    if output is None:
        if not names:
            raise MetadataMismatchError(f"model {info.name!r} has no outputs", model=info.name, protocol=protocol)
        return names[0]
    if output not in names:
        raise MetadataMismatchError(
            f"model {info.name!r} at {url} over {protocol} has outputs {names}, but the client expects {output!r}",
            model=info.name, protocol=protocol,
        )
    return output


def _fmt(tensors: dict[str, str]) -> str:
    return "[" + ", ".join(f"{n} ({d})" for n, d in tensors.items()) + "]"


#: The task each text method calls (``infer`` calls any model).
TASK_OF_METHOD = {"embed": "text-embedding", "classify": "text-classification", "rerank": "text-pair"}


def check_method(info: ModelInfo, method: str, *, text_input: str, protocol: str, url: str) -> None:
    """Raise :class:`MetadataMismatchError` when ``method`` (``embed``, ``classify``, ``rerank``) cannot
    call the model: its config names another task, or (a model the build did not write) it lacks the
    inputs or outputs the method sends and reads. The message names the model, its inputs and the
    method that calls it."""
    expected_task = TASK_OF_METHOD[method]
    served = {t.name: t.datatype for t in info.inputs}
    where = f"model {info.name!r} at {url} over {protocol}"

    def mismatch(problem: str) -> MetadataMismatchError:
        use = METHODS.get(info.kind(), "infer")
        if use == method:  # the task fits, the tensors do not: a model outside the contract, or text_input=...
            hint = "infer() sends whatever tensors it takes"
        elif use == "infer":
            hint = "call infer({input name: numpy array, ...}) with its tensors instead"
        else:
            hint = f"call {use}() instead"
        return MetadataMismatchError(f"{where} {problem}: {hint}", model=info.name, protocol=protocol)

    sends = {**({contract.QUERY_INPUT: "BYTES"} if method == "rerank" else {}), text_input: "BYTES"}
    if info.task is not None and info.task != expected_task:
        raise mismatch(f"is a {info.task} model with inputs {_fmt(served)}; {method}() sends {_fmt(sends)} to "
                       f"{expected_task} models")
    if any(served.get(n) != d for n, d in sends.items()):
        raise mismatch(f"has inputs {_fmt(served)}, but {method}() sends {_fmt(sends)}")
    reads = {"classify": (contract.LABEL_OUTPUT, contract.SCORE_OUTPUT), "rerank": (contract.SCORE_OUTPUT,)}
    names = [t.name for t in info.outputs]
    missing = [n for n in reads.get(method, ()) if n not in names]
    if missing:
        raise mismatch(f"has outputs {names}, but {method}() reads {list(reads[method])}")


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
    rows = [t.encode("utf-8") if isinstance(t, str) else bytes(t) for t in texts]
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


@dataclass(frozen=True, eq=False)
class Classification:
    """One text's answer from a text-classification model."""

    #: The top class's label (the model's labels; the class index as text when it has none).
    label: str
    #: Its softmax probability.
    score: float
    #: The encoder's logits for this text, float32 [classes] (empty when the model returns none).
    logits: np.ndarray[Any, Any]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Classification):
            return NotImplemented
        return (self.label, self.score) == (other.label, other.score) and np.array_equal(self.logits, other.logits)

    __hash__ = None  # type: ignore[assignment]  # holds an array, like the array itself


def logits_output(info: ModelInfo) -> str | None:
    """The encoder's logits among a text-classification model's outputs: the first that is not label or score."""
    return next((t.name for t in info.outputs if t.name not in (contract.LABEL_OUTPUT, contract.SCORE_OUTPUT)), None)


def task_outputs(logits: str | None, *added: str) -> list[str]:
    """The outputs a classify or rerank request names: what the task added, and the logits with them
    even where only the score is read. Triton 2.51's ensemble scheduler fails a request that names
    ``score`` without ``logits`` ("unexpected deadlock, at least one output is not set"): ``logits``
    is both an ensemble output and the post-processing step's input."""
    return [*([logits] if logits else []), *added]


def classifications(outputs: dict[str, np.ndarray[Any, Any]], logits: str | None) -> list[Classification]:
    """Rows of ``label`` (BYTES [N, 1]), ``score`` (FP32 [N, 1]) and the logits (FP32 [N, classes])."""
    labels = outputs[contract.LABEL_OUTPUT].reshape(-1)
    scores = outputs[contract.SCORE_OUTPUT].reshape(-1)
    if labels.shape[0] != scores.shape[0]:
        raise ClientError(f"the response has {labels.shape[0]} labels for {scores.shape[0]} scores")
    n = labels.shape[0]
    rows = (outputs[logits].reshape(n, -1).astype(np.float32, copy=False) if logits is not None
            else np.empty((n, 0), dtype=np.float32))
    return [
        Classification(label=v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v), score=float(s), logits=row)
        for v, s, row in zip(labels, scores, rows)
    ]


def response_output_names(result: Any) -> list[str]:
    """The outputs a tritonclient ``InferResult`` holds, in the response's order: HTTP's
    ``get_response()`` is the JSON header (``{"outputs": [{"name": ...}, ...]}``), gRPC's a
    ``ModelInferResponse`` whose ``outputs`` have ``.name``."""
    response = result.get_response()
    items = (response.get("outputs") or []) if isinstance(response, dict) else response.outputs
    return [str(o["name"] if isinstance(o, dict) else o.name) for o in items]


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
        self.url = url.removeprefix("http://").removeprefix("https://")
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
