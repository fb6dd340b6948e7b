"""The locustfile: HTTP and gRPC users of the bundle's clients, requests made by the model's task from
the traffic sample (:mod:`tritonbundle.payloads`: texts through embed, classify or rerank;
tensors of the declared shapes, or recorded inputs, through infer), load shapes, Triton's metrics
scraped during the run, and SLO gates on exit.

Run it through ``tritonbundle loadtest`` (headless, bounded, writes a report folder), or by hand
with Locust's web UI: ``locust -f loadtests/locustfile.py`` (settings from ``$TRITONBUNDLE_LOADTEST``).

* Closed model (``mode=closed``): ``users`` each send back-to-back: fixed concurrency.
* Open model (``mode=open``): each user is a Poisson source of ``rate / users`` requests per second
  that does not wait for answers, so queueing shows up as latency instead of as a lower send rate.

Every call fires ``events.request`` with the protocol as request type and the input kind as name,
so Locust's statistics, CSV and HTML reports cover both protocols. The first failure of the run is
printed on stderr as it happens (its reason would otherwise be only in the report's errors table).
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

import gevent
import numpy as np
from locust import LoadTestShape, User, constant, events, task
from locust.env import Environment

from tritonbundle.clients import RetryPolicy, connect
from tritonbundle.errors import ClientError
from tritonbundle.loadtests.report import Recorder, evaluate_gates, finite, summarize
from tritonbundle.loadtests.settings import LoadSettings, shape_users
from tritonbundle.measure import triton_metrics as metrics
from tritonbundle.payloads import Requests, for_model
from tritonbundle.traffic import TrafficSample, load, synthetic

SETTINGS = LoadSettings.from_env()

if gevent.monkey.is_module_patched("socket"):  # running under locust: make grpc cooperative
    import grpc.experimental.gevent as grpc_gevent

    grpc_gevent.init_gevent()


def _sample(settings: LoadSettings) -> TrafficSample:
    if settings.traffic:
        return load(settings.traffic)
    return synthetic(settings.synthetic, n=5000, seed=settings.seed)


SAMPLE = _sample(SETTINGS)
#: Every request's latency or failure (the summary's percentiles come from here).
RECORDER = Recorder()
_user_ids = itertools.count()
_first_failure: list[str] = []


def _report_first_failure(protocol: str, kind: str, error: BaseException) -> None:
    if not _first_failure:
        _first_failure.append(f"{protocol} {kind}: {error}")
        print(f"loadtest: first failed request: {_first_failure[0]}", file=sys.stderr, flush=True)


class TritonUser(User):
    """Base user: one bundle client per user, requests drawn from the traffic sample."""

    abstract = True
    protocol = "http"
    wait_time = constant(0)

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        self.settings = SETTINGS
        self.uid = next(_user_ids)
        self.rng = np.random.default_rng(self.settings.seed + self.uid)
        self.requests: list[Requests] = []
        self.client: Any = None

    def on_start(self) -> None:
        url = self.settings.http_url if self.protocol == "http" else self.settings.grpc_url
        assert url is not None, f"no URL for {self.protocol}"
        self.client = connect(
            url, protocol=self.protocol, model=self.settings.model, timeout_s=self.settings.timeout_s,
            connect_timeout_s=30, retry=RetryPolicy(max_attempts=max(1, self.settings.retries)),
            pool_size=min(64, self.settings.max_in_flight) if self.settings.mode == "open" else 1,
        )
        info = self.client.model_info(self.settings.model)
        kinds = ["auto", "tokens"] if self.settings.input == "both" else \
            ["tokens" if self.settings.input == "tokens" else "auto"]
        recorded = Path(self.settings.inputs) if self.settings.inputs else None
        self.requests = [for_model(info, SAMPLE, seed=self.settings.seed + self.uid, max_batch=self.settings.max_batch,
                                   kind=kind, recorded=recorded) for kind in kinds]
        self.sources = itertools.cycle(self.requests)

    def on_stop(self) -> None:
        if self.client is not None:
            self.client.close()

    def one_request(self) -> None:
        """Draw a request, send it, and report it to Locust."""
        call = next(self.sources).next()
        start = time.perf_counter()
        error: Exception | None = None
        size = 0
        try:
            size = _nbytes(call.send(self.client))
        except ClientError as e:
            error = e
            _report_first_failure(self.protocol, call.kind, e)
        elapsed_ms = (time.perf_counter() - start) * 1000
        RECORDER.add(self.protocol, call.kind, elapsed_ms, error is None)
        self.environment.events.request.fire(
            request_type=self.protocol, name=call.kind, response_time=elapsed_ms,
            response_length=size, exception=error, context={"tokens": call.tokens, "batch": call.rows},
        )


def _nbytes(result: Any) -> int:
    """Bytes of what a call returned: an array, a dict of arrays, or a list of records."""
    if isinstance(result, dict):
        return sum(int(np.asarray(v).nbytes) for v in result.values())
    if isinstance(result, np.ndarray):
        return int(result.nbytes)
    return len(result) if isinstance(result, list) else 0


class ClosedModel(TritonUser):
    """Back-to-back requests: fixed concurrency."""

    abstract = True

    @task
    def request(self) -> None:
        self.one_request()


class OpenModel(TritonUser):
    """A Poisson source: sleeps exponential gaps and sends without waiting for answers."""

    abstract = True
    in_flight = 0

    @task
    def request(self) -> None:
        rate = self.settings.rate / max(1, self.environment.runner.user_count if self.environment.runner else 1)
        gevent.sleep(self.rng.exponential(1.0 / rate))
        if self.in_flight >= self.settings.max_in_flight:
            RECORDER.add(self.protocol, "client saturated", 0.0, False)
            self.environment.events.request.fire(
                request_type=self.protocol, name="client saturated", response_time=0, response_length=0,
                exception=RuntimeError(f"{self.in_flight} requests already in flight"), context={},
            )
            return
        self.in_flight += 1  # counted before the greenlet runs, so on_stop waits for it
        gevent.spawn(self._tracked)

    def on_stop(self) -> None:
        # Let requests already sent finish (bounded by their deadline) before closing the client.
        deadline = time.monotonic() + self.settings.timeout_s
        while self.in_flight and time.monotonic() < deadline:
            gevent.sleep(0.05)
        super().on_stop()

    def _tracked(self) -> None:
        try:
            self.one_request()
        finally:
            self.in_flight -= 1


class HttpUser(ClosedModel):
    protocol = "http"


class GrpcUser(ClosedModel):
    protocol = "grpc"


class OpenHttpUser(OpenModel):
    protocol = "http"


class OpenGrpcUser(OpenModel):
    protocol = "grpc"


if SETTINGS.shape != "constant":

    class TrafficShape(LoadTestShape):
        """Step ramp, spike or soak over ``duration_s`` (users = concurrency, or Poisson sources)."""

        def tick(self) -> tuple[int, float] | None:
            users = shape_users(SETTINGS.shape, SETTINGS.users, SETTINGS.duration_s, self.get_run_time())  # type: ignore[no-untyped-call]
            return None if users is None else (users, SETTINGS.spawn_rate)


# -- server-side metrics and gates ---------------------------------------------------------------
_scrapes: list[tuple[float, metrics.Sample]] = []


def _scrape_forever(url: str) -> None:
    while True:
        try:
            _scrapes.append((time.time(), metrics.scrape(url)))
        except OSError:
            pass
        gevent.sleep(1.0)


def _start_scraper(environment: Environment, **_: Any) -> None:
    if SETTINGS.metrics_url and not getattr(environment, "_tritonbundle_scraper", None):
        environment._tritonbundle_scraper = gevent.spawn(_scrape_forever, SETTINGS.metrics_url)  # type: ignore[attr-defined]


def _gate(environment: Environment, **_: Any) -> None:
    """Write the JSON summary and set the exit code from the SLO gates."""
    scraper = getattr(environment, "_tritonbundle_scraper", None)
    if scraper is not None:
        scraper.kill()
        try:
            _scrapes.append((time.time(), metrics.scrape(SETTINGS.metrics_url or "")))
        except OSError:
            pass
    stats = environment.stats
    duration = max((stats.total.last_request_timestamp or stats.total.start_time) - stats.total.start_time, 1e-9)
    errors = [{"method": e.method, "name": e.name, "error": str(e.error), "occurrences": e.occurrences}
              for e in stats.errors.values()]
    summary = summarize(RECORDER, SETTINGS, duration, errors)
    if len(_scrapes) >= 2:
        summary["server"] = [v.to_json() for v in metrics.view(_scrapes[0][1], _scrapes[-1][1])]
        summary["server_timeline"] = {
            m: metrics.timeline(_scrapes, m) for m in sorted({v["model"] for v in summary["server"]})
        }
    gates = evaluate_gates(summary, SETTINGS.slo)
    summary["gates"] = gates
    report = Path(SETTINGS.report_dir)
    report.mkdir(parents=True, exist_ok=True)
    (report / "summary.json").write_text(json.dumps(finite(summary), indent=2))
    environment.process_exit_code = 0 if gates["passed"] else 1


events.test_start.add_listener(_start_scraper)  # type: ignore[no-untyped-call]
events.quitting.add_listener(_gate)  # type: ignore[no-untyped-call]
