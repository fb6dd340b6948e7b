"""Triton's own view of a load test, from its Prometheus metrics endpoint.

Counters are scraped during the run; differences between scrapes give, per model: requests,
executions, the average batch size (``nv_inference_count / nv_inference_exec_count``), and the time a
request spends queued versus computing (``nv_inference_queue_duration_us`` vs
``nv_inference_compute_infer_duration_us``, per request), with the two parts of a call around the
backend's compute: ``compute_input`` (from the backend's start of the call to its compute start) and
``compute_output`` (from its compute end to the call's end). Each request counts its whole call's
(core r24.10 ``src/infer_stats.cc`` ``UpdateSuccess``). For the Python backend that is the server's half
of its hand-over: compute_input stages the requests in shared memory, compute_infer is the round trip
to the stub (its ``execute()`` inside), compute_output creates, copies out and sends each response
(python_backend r24.10 ``src/python_be.cc`` ``ProcessRequests`` 1320-1353 sets compute start and end
around the stub's round trip; ``TRITONBACKEND_ModelInstanceExecute`` 2297-2310 the call's start and end),
the frontend's response callback included (server r24.10: gRPC's fills and finishes the reply there,
HTTP's defers it to its own thread; ``scripts/handover_split.py`` measures both).
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

COUNTERS = (
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
)
_LINE = re.compile(r'^(?P<name>nv_[a-z_]+)\{(?P<labels>[^}]*)\}\s+(?P<value>[-+0-9.eE]+|NaN)\s*$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')
_PENDING = re.compile(r"^nv_inference_pending_request_count\{[^}]*\}\s+([0-9.eE+-]+)", re.M)

Sample = dict[str, dict[str, float]]  # model -> counter -> value


def parse(text: str) -> Sample:
    """Per-model counters from the Prometheus text format (versions summed)."""
    out: Sample = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if not match or match["name"] not in COUNTERS:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        model = labels.get("model")
        if model is None:
            continue
        value = float(match["value"])
        counters = out.setdefault(model, {})
        counters[match["name"]] = counters.get(match["name"], 0.0) + value
    return out


def scrape(url: str, *, timeout_s: float = 2.0) -> Sample:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - our own server
        return parse(response.read().decode())


@dataclass(frozen=True)
class ServerView:
    model: str
    requests: float
    failures: float
    executions: float
    inferences: float
    avg_batch_size: float
    queue_ms_per_request: float
    compute_ms_per_request: float
    request_ms_per_request: float
    compute_input_ms_per_request: float
    compute_output_ms_per_request: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def view(first: Sample, last: Sample) -> list[ServerView]:
    """What the server did between two scrapes, per model that saw requests."""
    out = []
    for model, counters in sorted(last.items()):
        before = first.get(model, {})

        def delta(name: str, counters: Mapping[str, float] = counters, before: Mapping[str, float] = before) -> float:
            return counters.get(name, 0.0) - before.get(name, 0.0)

        requests = delta("nv_inference_request_success") + delta("nv_inference_request_failure")
        if requests <= 0:
            continue
        executions = delta("nv_inference_exec_count")
        inferences = delta("nv_inference_count")
        out.append(ServerView(
            model=model,
            requests=requests,
            failures=delta("nv_inference_request_failure"),
            executions=executions,
            inferences=inferences,
            avg_batch_size=inferences / executions if executions else 0.0,
            queue_ms_per_request=delta("nv_inference_queue_duration_us") / requests / 1000,
            compute_ms_per_request=delta("nv_inference_compute_infer_duration_us") / requests / 1000,
            request_ms_per_request=delta("nv_inference_request_duration_us") / requests / 1000,
            compute_input_ms_per_request=delta("nv_inference_compute_input_duration_us") / requests / 1000,
            compute_output_ms_per_request=delta("nv_inference_compute_output_duration_us") / requests / 1000,
        ))
    return out


def timeline(samples: Sequence[tuple[float, Sample]], model: str) -> list[dict[str, float]]:
    """Per-interval queue/compute time and batch size for one model (for the plots)."""
    rows = []
    for (t0, a), (t1, b) in zip(samples, samples[1:]):
        views = [v for v in view(a, b) if v.model == model]
        if views:
            v = views[0]
            rows.append({"t": t1, "rps": v.requests / max(t1 - t0, 1e-9), "queue_ms": v.queue_ms_per_request,
                         "compute_ms": v.compute_ms_per_request, "avg_batch": v.avg_batch_size})
    return rows


def pending_requests(url: str, *, timeout_s: float = 5.0) -> float:
    """Requests queued in Triton, all models (``nv_inference_pending_request_count``); inf when unreachable."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - our own server
            text = response.read().decode()
    except OSError:
        return float("inf")
    return sum(float(m.group(1)) for m in _PENDING.finditer(text))
