"""Readiness that means "answers": the smallest real request to every served model.

Triton's ``/v2/health/ready`` says READY while a Python-backend model's stub is dead (aborted by a
malformed request, or SIGKILLed by the OOM killer): no release restarts a dead stub
(python_backend ``src/python_be.cc``, ``TRITONBACKEND_ModelInstanceExecute``: "If restart is equal to
true, it indicates that the stub process is unhealthy", r25.08 and r26.07 alike), and every request
to the model fails with "Stub process ... is not healthy". Since NGC 25.12/26.01 the model turns not
ready (python_backend 395a780, ``TRITONBACKEND_ModelInstanceReady``) and since 26.04 the server's
``/v2/health/ready`` says so too (core 53fc26e, server issue #8604); Triton 2.51, the CPU tier's, does
neither. This module sends each model one request built
from its own configuration (``/v2/models/<name>/config``: one row of BYTES ``"ok"`` or of ones, each
variable dimension 1) and reports the models that did not answer.

A timeout is "busy", not down, unless the server is hung: Triton 2.51's crash handler can deadlock
(server #7368 under gRPC cancellations) and leave a process whose ``/v2/health/ready`` answers 200 while
no inference ever completes, and a stopped process (SIGSTOP) answers nothing at all. So on a timeout the
canary asks Triton's metrics (``--metrics-url``): no answer from them either, or requests pending with
no success counted since before the probe, is **hung** (fatal); successes counted meanwhile is busy.

Answers alone cannot tell a hang from a long ``execute()``: on the CPU tier a batch of 32 long texts
takes 6-14 s on two cores, no success is counted meanwhile, and the canary called such a server hung
and had it stopped under legitimate load (a clean-clone CI run, 2026-12-02). So the canary can also
read the server's CPU time (``cpu_s``: its processes in ``/proc``, ``--server-cpu``): a server whose
processes used at least :data:`WORKING_CORES` over the probe is working, hence busy, not hung. A model
stuck in a busy loop, or stuck beside others that keep the server busy, is called down only once the
server goes quiet.

With model control (poll or explicit, ``--loaded``) the repository may hold models Triton has not loaded: a
folder copied in and not yet polled, or one that failed to load. Those are not the server's health, so the
canary asks Triton which models are loaded (``POST /v2/repository/index``, with the restricted API's key
from ``$TRITONBUNDLE_API_KEY`` in ``--api-header``) and probes only those whose state is READY; the others
are listed, never counted as down.

Standard library only, and no tritonbundle imports: the images and the Helm chart run this file as a
script for their health checks (``python3 canary.py --repository /models/model_repository``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Cores a server's processes keep busy, at least, while it works (a CPU ``execute()`` keeps one busy);
#: below it, a server that answers nothing is idle: hung or stuck.
WORKING_CORES = 0.25
#: Names (``/proc/<pid>/comm``, 15 characters at most) of a server's processes: Triton and its Python stubs.
SERVER_PROCESSES = ("tritonserver", "triton_python_b")

#: config.pbtxt data types -> the inference protocol's.
DATATYPES = {
    "TYPE_STRING": "BYTES", "TYPE_BOOL": "BOOL", "TYPE_UINT8": "UINT8", "TYPE_INT8": "INT8", "TYPE_INT16": "INT16",
    "TYPE_INT32": "INT32", "TYPE_INT64": "INT64", "TYPE_FP16": "FP16", "TYPE_FP32": "FP32", "TYPE_FP64": "FP64",
    "TYPE_BF16": "BF16",
}


def served_models(repository: Path) -> list[str]:
    """The models of a repository folder: sub-folders with a ``config.pbtxt``."""
    return sorted(p.parent.name for p in Path(repository).glob("*/config.pbtxt"))


def request_for(config: dict[str, Any]) -> dict[str, Any]:
    """The smallest request ``config``'s inputs accept: batch 1 (when it batches), variable dims 1."""
    batched = int(config.get("max_batch_size") or 0) > 0
    inputs = []
    for spec in config.get("input", []):
        if spec.get("optional"):
            continue
        dims = [int(d) for d in spec.get("dims", [])]
        if spec.get("reshape") is not None and not dims:
            dims = [1]
        shape = ([1] if batched else []) + [1 if d < 0 else d for d in dims]
        datatype = DATATYPES.get(spec.get("data_type", ""), "FP32")
        count = math.prod(shape) if shape else 1
        data: list[Any] = ["ok"] * count if datatype == "BYTES" else [True] * count if datatype == "BOOL" else [1] * count
        inputs.append({"name": spec["name"], "datatype": datatype, "shape": shape, "data": data})
    return {"inputs": inputs}


@dataclass(frozen=True)
class Problem:
    """A model that did not answer. ``fatal``: it cannot (an internal error such as a dead stub, or
    no server); else it is busy (503 overload, a timeout) or the probe itself was refused (4xx), which
    a restart would not fix."""

    model: str
    message: str
    fatal: bool

    def __str__(self) -> str:
        return f"{self.model}: {self.message}"


@dataclass
class Canary:
    """Probes ``models`` on the server at ``url`` (``http://host:port``); with ``metrics_url`` (Triton's
    ``http://host:port/metrics``) a timeout is told apart from a hang (module docstring)."""

    url: str
    models: Sequence[str]
    timeout_s: float = 5.0
    metrics_url: str | None = None
    #: The server's CPU seconds so far (:func:`server_cpu_s`); None: a silent server is judged by its
    #: answers alone.
    cpu_s: Callable[[], float | None] | None = None
    #: Probe only the models Triton reports loaded (READY in its repository index): with model control a
    #: model folder may be new (not polled yet) or failed to load, which is not the server's health.
    loaded_only: bool = False
    #: Headers of the repository index request (the restricted API's key).
    index_headers: dict[str, str] = field(default_factory=dict)
    #: Headers of every request (a tenant's key, where an edge with tenants stands before the server).
    headers: dict[str, str] = field(default_factory=dict)
    #: Seconds the whole check may take (None: no bound). A kubelet counts a probe that outlasts its
    #: ``timeoutSeconds`` as failed, and a check of three models makes 9 requests: a model after the first
    #: is asked only while the deadline leaves it its worst case (:data:`MODEL_TIMEOUTS` timeouts); the
    #: others are "not probed" (busy, never fatal). No request is cut short: a verdict (a dead stub's 500
    #: after its 1 s check, a hang told by the metrics) needs its whole timeout.
    deadline_s: float | None = None
    _requests: dict[str, dict[str, Any]] = field(default_factory=dict, init=False, repr=False)
    _end: float | None = field(default=None, init=False, repr=False)

    def check(self) -> list[Problem]:
        """One problem per model that did not answer (empty: every model answered). With ``loaded_only``
        the models Triton has not loaded are problems that are never fatal."""
        problems: list[Problem] = []
        models = list(self.models)
        self._end = None if self.deadline_s is None else time.monotonic() + self.deadline_s
        if self.loaded_only:
            models, skipped = self._loaded(models)
            problems += skipped
        before = self._progress()
        cpu_before = self._cpu()
        for i, model in enumerate(models):
            if i and self._end is not None and self._end - time.monotonic() < MODEL_TIMEOUTS * self.timeout_s:
                problems += [Problem(m, f"not probed: the check's {self.deadline_s:g} s (--deadline-s) would not hold "
                                        "another model's requests", False) for m in models[i:]]
                break
            try:
                self._infer(model)
            except (OSError, ValueError) as e:
                problem = Problem(model, _describe(e), _fatal(e))
                if self.metrics_url and (_timed_out(e) or _overloaded(e)):
                    problem = self._hung(model, problem, before) if _timed_out(e) else self._stuck(model, problem)
                    problem = self._unless_working(problem, cpu_before)
                problems.append(problem)
                if HUNG in problem.message:  # the whole server: the other models are not asked
                    problems += [Problem(m, f"not probed: {HUNG}", True) for m in models[i + 1:]]
                    break
        return problems

    def _loaded(self, models: list[str]) -> tuple[list[str], list[Problem]]:
        """The models of ``models`` Triton's repository index reports READY, and a problem (never fatal)
        for each other one; when the index does not answer, one problem for every model, fatal as
        :func:`_fatal` judges the error (no server: fatal; a timeout or a refusal: not)."""
        try:
            index = json.loads(self._call("/v2/repository/index", {}, self.index_headers))
        except (OSError, ValueError) as e:
            why, fatal = _describe(e), _fatal(e)
            if isinstance(e, urllib.error.HTTPError) and e.code in (401, 403):
                why += f" (the restricted API's key: --api-header, ${API_KEY_ENV})"
            elif _timed_out(e) and self.metrics_url and self._metrics() is None:
                why, fatal = f"{why}, and the metrics endpoint did not answer either: {HUNG}", True
            return [], [Problem(m, f"not probed: the repository index: {why}", fatal) for m in models]
        states: dict[str, str] = {}
        for entry in index if isinstance(index, list) else []:
            name, state = str(entry.get("name", "")), str(entry.get("state", "") or "no state")
            if states.get(name) != "READY":  # one READY version makes the model served
                states[name] = state + (f": {entry['reason']}" if entry.get("reason") and state != "READY" else "")
        ready = [m for m in models if states.get(m) == "READY"]
        skipped = [Problem(m, f"not probed: Triton has not loaded it ({states.get(m, 'not in its repository index')})",
                           fatal=False) for m in models if m not in ready]
        return ready, skipped

    def _cpu(self) -> tuple[float, float] | None:
        """(the server's CPU seconds, when) or None without ``cpu_s``."""
        used = self.cpu_s() if self.cpu_s is not None else None
        return None if used is None else (used, time.monotonic())

    def _unless_working(self, problem: Problem, before: tuple[float, float] | None) -> Problem:
        """A hung or stuck verdict stands only if the server's processes were idle since the check began."""
        after = self._cpu()
        if not problem.fatal or before is None or after is None:
            return problem
        cores = (after[0] - before[0]) / max(after[1] - before[1], 1e-3)
        if cores < WORKING_CORES:
            return Problem(problem.model, f"{problem.message} (its processes idle: {cores:.2f} cores)", fatal=True)
        return Problem(problem.model, f"{problem.message.split(': ' + HUNG)[0]}; no answer counted, but its processes "
                                      f"kept {cores:.1f} cores busy: a long execute(), busy, not hung", fatal=False)

    def _progress(self) -> tuple[float, float] | None:
        """(inferences answered so far, requests pending now) from Triton's metrics; None: no answer."""
        text = self._metrics()
        if text is None:
            return None
        return metric_sum(text, "nv_inference_request_success"), metric_sum(text, "nv_inference_pending_request_count")

    def _metrics(self) -> str | None:
        """Triton's metrics page (``metrics_url``); None without one, or when it does not answer."""
        if not self.metrics_url:
            return None
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=self.timeout_s) as r:  # noqa: S310 - the server's own address
                return str(r.read().decode("utf-8", "replace"))
        except OSError:
            return None

    def _hung(self, model: str, busy: Problem, before: tuple[float, float] | None) -> Problem:
        after = self._progress()
        if after is None:
            return Problem(model, f"{busy.message}, and the metrics endpoint did not answer either: {HUNG} (stopped, "
                                  "or deadlocked)", fatal=True)
        if before is not None and after[0] <= before[0] and after[1] > 0:
            return Problem(model, f"{busy.message}; no inference answered since the probe began while "
                                  f"{after[1]:.0f} request(s) are pending: {HUNG}", fatal=True)
        return busy

    def _stuck(self, model: str, refused: Problem) -> Problem:
        """A refusal (503, the queue full) is busy unless Triton counts no answer from ``model`` for
        ``timeout_s``: a model stuck in its ``execute()`` keeps its queue full, so every request is
        refused at once and a timeout never comes (the H200's stalled lanes, docs/benchmarks.md)."""
        first = self._answered(model)
        deadline = time.monotonic() + self.timeout_s
        while first is not None and time.monotonic() < deadline:
            time.sleep(0.2)
            now = self._answered(model)
            if now is None or now > first:
                return refused
        if first is None:
            return refused
        return Problem(model, f"{refused.message}, and no request of it answered in {self.timeout_s:g} s: {HUNG} "
                              "(the model is stuck)", fatal=True)

    def _answered(self, model: str) -> float | None:
        """Requests of ``model`` Triton has answered so far (its metrics); None: no answer from them."""
        text = self._metrics()
        if text is None:
            return None
        label = f'model="{model}"'
        return metric_sum("\n".join(line for line in text.splitlines() if label in line), "nv_inference_request_success")

    def _infer(self, model: str) -> None:
        try:  # 2.51 says ready with a dead stub; NGC 26.04+ says not ready (then requests get a 4xx)
            self._call(f"/v2/models/{model}/ready")
        except urllib.error.HTTPError as e:
            if e.code in (400, 404):
                raise NotReadyError(f"model not ready (HTTP {e.code} from /v2/models/{model}/ready)") from e
            raise
        if model not in self._requests:
            config = json.loads(self._call(f"/v2/models/{model}/config"))
            self._requests[model] = request_for(config)
        self._call(f"/v2/models/{model}/infer", self._requests[model])

    def _call(self, path: str, body: dict[str, Any] | None = None, headers: dict[str, str] | None = None) -> bytes:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url.rstrip("/") + path, data=data, headers={
            **({"Content-Type": "application/json"} if data else {}), **self.headers, **(headers or {})})
        with urllib.request.urlopen(req, timeout=self.timeout_s) as r:  # noqa: S310 - the server's own address
            return bytes(r.read())


HUNG = "the server is hung"
#: One model's worst case, in request timeouts: ready, config and inference, then Triton's metrics (or
#: the wait for an answer counted while the queue refuses). The check's first metrics read is one more.
MODEL_TIMEOUTS = 4
#: Where ``--api-header``'s key comes from: the server container's own variable (the Helm chart's).
API_KEY_ENV = "TRITONBUNDLE_API_KEY"


def server_cpu_s(pgid: int | None = None, proc: Path = Path("/proc")) -> float | None:
    """CPU seconds (user + system) the server's processes have used so far: those of process group
    ``pgid`` (``tritonbundle serve`` starts tritonserver as a group leader; its stubs stay in the group),
    or without one every process named in :data:`SERVER_PROCESSES` that ``proc`` shows (in a container or
    a pod: this server's own). None where there is no such process or no /proc (not Linux).
    Fields of ``/proc/<pid>/stat`` after the command name: proc(5), pgrp is field 5, utime 14, stime 15."""
    try:
        ticks = os.sysconf("SC_CLK_TCK")
        entries = [e for e in proc.iterdir() if e.name.isdigit()]
    except (OSError, ValueError, AttributeError):
        return None
    total, found = 0, False
    for entry in entries:
        try:
            text = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        name, fields = text[text.find("(") + 1 : text.rfind(")")], text[text.rfind(")") + 2 :].split()
        if len(fields) < 13 or not (int(fields[2]) == pgid if pgid is not None else name in SERVER_PROCESSES):
            continue
        total += int(fields[11]) + int(fields[12])
        found = True
    return total / ticks if found else None


def metric_sum(text: str, name: str) -> float:
    """The sum of a Prometheus metric's samples (every label set) in an exposition ``text``."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
            try:
                total += float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
    return total


def _timed_out(e: BaseException) -> bool:
    if isinstance(e, urllib.error.URLError) and not isinstance(e, urllib.error.HTTPError):
        return isinstance(e.reason, TimeoutError)
    return isinstance(e, TimeoutError)


class NotReadyError(ValueError):
    """The server says the model is not ready: a dead stub on NGC 26.04 and later."""


def _overloaded(e: BaseException) -> bool:
    """Refused for want of room (503: the queue full; 504): busy, or a model stuck with its queue full.
    Any other refusal (4xx) is the probe's own: it says nothing of the server's health."""
    return isinstance(e, urllib.error.HTTPError) and e.code in (503, 504)


def _fatal(e: BaseException) -> bool:
    if isinstance(e, NotReadyError):
        return True
    if isinstance(e, urllib.error.HTTPError):
        return e.code >= 500 and e.code not in (503, 504)
    if isinstance(e, urllib.error.URLError):
        return not isinstance(e.reason, TimeoutError)
    return not isinstance(e, TimeoutError)


def _describe(e: BaseException) -> str:
    if isinstance(e, urllib.error.HTTPError):
        try:
            message = json.loads(e.read() or b"{}").get("error", "")
        except ValueError:
            message = ""
        return f"HTTP {e.code}{': ' + message if message else ''}"
    if isinstance(e, urllib.error.URLError):
        return f"no answer ({e.reason})"
    return f"{type(e).__name__}: {e}"


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, not {text!r}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="exit 0 when every served model answers its smallest request")
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="the server's HTTP address")
    ap.add_argument("--repository", type=Path, help="probe every model of this repository folder")
    ap.add_argument("--model", action="append", default=[], help="probe this model (repeatable)")
    ap.add_argument("--timeout-s", type=float, default=4.0, help="per request")
    ap.add_argument("--deadline-s", type=_positive, help="the whole check (a probe's timeoutSeconds less a margin): a "
                    f"model after the first is asked only while {MODEL_TIMEOUTS} request timeouts are left; the others "
                    "count as busy, not down")
    ap.add_argument("--metrics-url", help="Triton's metrics (http://127.0.0.1:8002/metrics): tells a hung server from "
                                          "a busy one when a request times out")
    ap.add_argument("--server-cpu", action="store_true",
                    help="run beside the server (its container or pod): a server whose tritonserver and stub processes "
                         "keep CPU busy is working, not hung, though no answer is counted (a long execute())")
    ap.add_argument("--loaded", action="store_true",
                    help="model control (poll, explicit): probe only the models Triton reports loaded (READY in "
                         "POST /v2/repository/index); a model not loaded or still loading is listed, not counted as down")
    ap.add_argument("--api-header", help="with --loaded: the restricted API's header, sent with the key in "
                                         f"${API_KEY_ENV} (the model-repository API is restricted)")
    ap.add_argument("--bearer-env", metavar="VARIABLE", help="send 'Authorization: Bearer' with the key in this "
                                                             "variable (a tenant's key, through an edge with tenants)")
    ap.add_argument("--strict", action="store_true",
                    help="every model must answer: a refusal or a busy server fails too (a release gate, not a "
                         "liveness probe)")
    args = ap.parse_args(argv)
    models = list(args.model) + (served_models(args.repository) if args.repository else [])
    if not models:
        ap.error("name the models: --repository DIR or --model NAME")
    bearer = os.environ.get(args.bearer_env, "").strip() if args.bearer_env else None
    if bearer == "":
        ap.error(f"--bearer-env: ${args.bearer_env} is empty or not set")
    headers = {args.api_header: os.environ.get(API_KEY_ENV, "")} if args.api_header else {}
    started = time.monotonic()
    problems = Canary(args.url, models, timeout_s=args.timeout_s, metrics_url=args.metrics_url,
                      cpu_s=server_cpu_s if args.server_cpu else None, loaded_only=args.loaded,
                      index_headers=headers, headers={"Authorization": f"Bearer {bearer}"} if bearer else {},
                      deadline_s=args.deadline_s).check()
    for problem in problems:
        aside = " (not loaded: not counted as down)" if "has not loaded" in problem.message else " (busy or refused: not counted as down)"
        print(f"canary: {problem}{'' if problem.fatal else aside}", file=sys.stderr)
    print(f"canary: {len(models) - len(problems)} of {len(models)} models answered in "
          f"{(time.monotonic() - started) * 1000:.0f} ms")
    return 1 if any(p.fatal or args.strict for p in problems) else 0


if __name__ == "__main__":
    sys.exit(main())
