"""The locustfile: HTTP and gRPC users of the bundle's clients, requests made by the model's task from
the traffic sample (:mod:`tritonbundle.payloads`: texts through embed, classify or rerank;
tensors of the declared shapes, or recorded inputs, through infer), load shapes, Triton's metrics
scraped during the run, and SLO gates on exit.

Run it through ``tritonbundle loadtest`` (headless, bounded, writes a report folder), or by hand
with Locust's web UI: ``locust -f loadtests/locustfile.py`` (settings from ``$TRITONBUNDLE_LOADTEST``).

* Closed model (``mode=closed``): ``users`` each send back-to-back: fixed concurrency.
* Open model (``mode=open``): each user is a Poisson source of ``rate / users`` requests per second
  that does not wait for answers, so queueing shows up as latency instead of as a lower send rate.
  Arrivals follow a schedule (each one a random gap after the previous one's due time, not after it
  was sent) and stop when the sending window closes; requests in flight then drain.

The sending window opens when the first user starts scheduling requests (after connecting) and
closes ``duration_s`` later in a headless run, or when Locust stops the users earlier
(``test_stopping``: SIGTERM, Ctrl-C, the web UI's stop button or a load shape's end there, Locust's
``-t``, which the runner sets as a backstop past the window); the summary's rates are over that
window. Load shapes are timed from the window's opening. Every few seconds a ``loadtest:`` progress
line is printed (the runner echoes those to the console), and so is the first error that ended a user
(an ``on_start`` that could not connect, an unknown model, unusable inputs).

Every call fires ``events.request`` with the protocol as request type and the input kind as name,
so Locust's statistics and CSV files cover both protocols. The first failure of the run is
printed on stderr as it happens (its reason would otherwise be only in the report's errors table).
"""

from __future__ import annotations

import faulthandler
import itertools
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import gevent
import numpy as np
from gevent.util import print_run_info
from locust import LoadTestShape, User, constant, events, task
from locust.env import Environment
from locust.runners import STATE_CLEANUP, STATE_RUNNING, STATE_SPAWNING

from tritonbundle.clients import RetryPolicy, connect
from tritonbundle.errors import ClientError
from tritonbundle.loadtests import timeline
from tritonbundle.loadtests.recorder import Recorder
from tritonbundle.loadtests.report import evaluate_gates, finite, summarize, unanswered
from tritonbundle.loadtests.settings import LoadSettings
from tritonbundle.measure import triton_metrics as metrics
from tritonbundle.payloads import Requests, for_model
from tritonbundle.traffic import TrafficSample, load, synthetic

SETTINGS = LoadSettings.from_env()

if gevent.monkey.is_module_patched("socket"):  # running under locust: make grpc cooperative
    import grpc.experimental.gevent as grpc_gevent

    grpc_gevent.init_gevent()
    # A run that does not stop in time is asked for its stacks before the runner kills it (locust.log):
    # every thread's Python stack (works even when the hub is stuck in C), then every greenlet's.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    gevent.signal_handler(signal.SIGUSR2, lambda: print_run_info(file=sys.stderr))


def _sample(settings: LoadSettings) -> TrafficSample:
    if settings.traffic:
        return load(settings.traffic)
    return synthetic(settings.synthetic, n=5000, seed=settings.seed)


SAMPLE = _sample(SETTINGS)
#: Every request's latency or failure (the summary's percentiles come from here).
RECORDER = Recorder()
_user_ids = itertools.count()
#: The users' clients not yet closed. Locust runs no on_stop for a user whose on_start failed or that
#: it killed, and a gRPC client left to the garbage collector closes its channel at interpreter exit,
#: where gevent can deadlock (a CI run's Locust hung there, in grpc's ``_channel.close`` from
#: tritonclient's ``__del__``): whatever is left is closed on Locust's quit event, before it exits.
OPEN_CLIENTS: set[Any] = set()
_first_failure: list[str] = []
#: Errors that ended a user (its ``on_start`` failed: server unreachable, unknown model, unusable
#: inputs) or one of its tasks, as "protocol: error" -> occurrences; the first is printed as it happens.
USER_ERRORS: dict[str, int] = {}


def _report_first_failure(protocol: str, kind: str, error: BaseException) -> None:
    if not _first_failure:
        _first_failure.append(f"{protocol} {kind}: {error}")
        print(f"loadtest: first failed request: {_first_failure[0]}", file=sys.stderr, flush=True)


def _on_user_error(user_instance: Any, exception: BaseException, **_: Any) -> None:
    """Count an error that ended a user or a task; print the first (otherwise only in locust.log)."""
    protocol = getattr(user_instance, "protocol", None) or getattr(getattr(user_instance, "user", None), "protocol", "?")
    key = f"{protocol}: {exception}"
    if not USER_ERRORS:
        print(f"loadtest: a {protocol} user failed: {exception}", file=sys.stderr, flush=True)
    USER_ERRORS[key] = USER_ERRORS.get(key, 0) + 1


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
        OPEN_CLIENTS.add(self.client)
        try:
            info = self.client.model_info(self.settings.model)
            kinds = ["auto", "tokens"] if self.settings.input == "both" else \
                ["tokens" if self.settings.input == "tokens" else "auto"]
            recorded = Path(self.settings.inputs) if self.settings.inputs else None
            self.requests = [for_model(info, SAMPLE, seed=self.settings.seed + self.uid,
                                       max_batch=self.settings.max_batch, kind=kind, recorded=recorded)
                             for kind in kinds]
        except BaseException:  # Locust runs no on_stop after a failed on_start
            self._close_client()
            raise
        self.sources = itertools.cycle(self.requests)

    def on_stop(self) -> None:
        self._close_client()

    def _close_client(self) -> None:
        if self.client is not None:
            OPEN_CLIENTS.discard(self.client)
            self.client.close()

    def one_request(self) -> None:
        """Draw a request, send it, and report it to Locust."""
        call = next(self.sources).next()
        sent_at = time.time()
        RECORDER.begin(sent_at)
        RECORDER.n_sent += 1
        start = time.perf_counter()
        error: Exception | None = None
        size = 0
        try:
            size = _nbytes(call.send(self.client))
        except ClientError as e:
            error = e
            _report_first_failure(self.protocol, call.kind, e)
        elapsed_ms = (time.perf_counter() - start) * 1000
        RECORDER.add(self.protocol, call.kind, elapsed_ms, error is None, sent_at=sent_at)
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
    """A Poisson source: requests at scheduled arrival times, sent without waiting for answers.

    The gap to the next arrival is Locust's wait time, so Locust stops the user at once when the
    run ends (a sleep inside the task would be waited for, and send one more request after the end).
    """

    abstract = True
    in_flight = 0
    #: When the next request is due (unix s); None until the user starts its schedule.
    due: float | None = None

    def wait_time(self) -> float:
        return 0.0 if self.due is None else max(0.0, self.due - time.time())

    def _gap(self) -> float:
        """The next gap: the total rate the load shape wants now, spread over the users running now."""
        runner = self.environment.runner
        sources = max(1, runner.user_count if runner else 1)
        return float(self.rng.exponential(sources / self.settings.rate_at(_window_time())))

    @task
    def request(self) -> None:
        now = time.time()
        if self.due is None:  # the schedule starts when the user is ready: first arrival one gap later
            RECORDER.begin(now)
            self.due = now + self._gap()
            return
        if RECORDER.stopped is not None:  # the sending window is closed: nothing more is sent
            self.due = now + 1.0
            return
        RECORDER.lag_ms.append((now - self.due) * 1000)
        self.due += self._gap()
        if self.in_flight >= self.settings.max_in_flight:
            RECORDER.n_sent += 1
            RECORDER.add(self.protocol, "client saturated", 0.0, False, sent_at=now)
            self.environment.events.request.fire(
                request_type=self.protocol, name="client saturated", response_time=0, response_length=0,
                exception=RuntimeError(f"{self.in_flight} requests already in flight"), context={},
            )
            return
        self.in_flight += 1  # counted before the greenlet runs, so on_stop waits for it
        gevent.spawn(self._tracked)

    def on_stop(self) -> None:
        # Let requests already sent finish (bounded by their deadline) before closing the client; Locust
        # kills a user still here after its --stop-timeout, and the client is closed then too (a request
        # still in flight then fails: it is past its deadline or Locust's).
        deadline = time.monotonic() + self.settings.timeout_s
        try:
            while self.in_flight and time.monotonic() < deadline:
                gevent.sleep(0.05)
        finally:
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


def _window_time() -> float:
    """Seconds since the sending window opened (0 before it does)."""
    return 0.0 if RECORDER.started is None else max(0.0, time.time() - RECORDER.started)


class TrafficShape(LoadTestShape):
    """Step ramp, spike or soak over the sending window (users = concurrency, or Poisson sources; the
    open model's rate follows the users, :meth:`LoadSettings.rate_at`). Timed from the window's opening,
    not from Locust's start (users connect in between). In a headless run the shape never ends the
    test: the window's closer does, letting requests in flight drain (a shape ending the test raced
    it, and the summary was written with requests still in flight); in the web UI it ends the test at
    the window's end. Locust uses it only with a shape other than constant (``abstract`` otherwise)."""

    abstract = SETTINGS.shape == "constant"

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.last: tuple[int, float] | None = None

    def tick(self) -> tuple[int, float] | None:
        users = SETTINGS.users_at(_window_time())
        if users is None and not _headless(self.runner.environment if self.runner else None):
            return None
        if users is not None:
            self.last = (users, SETTINGS.spawn_rate)
        return self.last or (SETTINGS.users, SETTINGS.spawn_rate)


def _headless(environment: Environment | None) -> bool:
    return bool(getattr(getattr(environment, "parsed_options", None), "headless", False))


# -- progress, server-side metrics and gates -----------------------------------------------------
_scrapes: list[tuple[float, metrics.Sample]] = []


#: Triton counts a request in its metrics a moment after the client has the answer: the final scrape
#: waits this long (a CI run's scrape right after the last answer counted 358 of 360 requests).
SETTLE_S = 0.5


def _scrape(url: str) -> None:
    try:
        _scrapes.append((time.time(), metrics.scrape(url)))
    except OSError:
        pass


def _scrape_forever(url: str) -> None:
    while True:
        gevent.sleep(1.0)
        _scrape(url)


def _tick_forever(environment: Environment) -> None:
    """Every second, note the user count; every few seconds, print a progress line."""
    every = timeline.progress_every_s(SETTINGS.duration_s)
    last = time.time()
    sent_before = 0
    while True:
        gevent.sleep(1.0)
        now = time.time()
        users = environment.runner.user_count if environment.runner else None
        if users is not None and RECORDER.stopped is None:
            RECORDER.users.append((now, users))
        if RECORDER.started is None or now - last < every - 0.05:
            continue
        line = timeline.progress_line(
            now - RECORDER.started, RECORDER.n_sent, RECORDER.n_failed, now - last, RECORDER.n_sent - sent_before,
            RECORDER.take_recent(), users, draining=RECORDER.stopped is not None)
        print(line, flush=True)
        last, sent_before = now, RECORDER.n_sent


def _close_window(environment: Environment, opened: float) -> None:
    """Stop the run ``duration_s`` after the first request was scheduled (or after the test started,
    when no user got ready)."""
    while True:
        deadline = (RECORDER.started or opened) + SETTINGS.duration_s
        now = time.time()
        if now >= deadline:
            break
        gevent.sleep(deadline - now if RECORDER.started is not None else min(0.5, deadline - now))
    RECORDER.end()
    if environment.runner is not None:
        environment.runner.quit()


def _on_test_start(environment: Environment, **_: Any) -> None:
    if SETTINGS.metrics_url and not getattr(environment, "_tritonbundle_scraper", None):
        _scrape(SETTINGS.metrics_url)  # the baseline, before the first user sends (test_start fires first)
        environment._tritonbundle_scraper = gevent.spawn(_scrape_forever, SETTINGS.metrics_url)  # type: ignore[attr-defined]
    if not getattr(environment, "_tritonbundle_ticker", None):
        environment._tritonbundle_ticker = gevent.spawn(_tick_forever, environment)  # type: ignore[attr-defined]
        if _headless(environment):  # in the web UI, the user stops the run
            environment._tritonbundle_closer = gevent.spawn(_close_window, environment, time.time())  # type: ignore[attr-defined]


def _on_test_stopping(environment: Environment, **_: Any) -> None:
    RECORDER.end()  # the sending window closes: the users send nothing more, requests in flight drain


def _stop_users(environment: Environment) -> None:
    """Stop the users if they still run (their requests in flight drain), or wait for a stop under way;
    bounded by Locust's --stop-timeout, after which Locust kills the users that are left."""
    runner = environment.runner
    if runner is None:
        return
    if runner.state in (STATE_SPAWNING, STATE_RUNNING):
        runner.stop()
    deadline = time.monotonic() + (environment.stop_timeout or 0.0) + 1.0
    while runner.state == STATE_CLEANUP and time.monotonic() < deadline:
        gevent.sleep(0.05)


def _gate(environment: Environment, **_: Any) -> None:
    """Stop the users if they still run, then write the JSON summary and set the exit code from the SLO
    gates. Locust fires ``quitting`` before it stops the users when it is sent SIGTERM: stopping them
    here (bounded by --stop-timeout) lets the requests in flight drain into the summary, and stops the load."""
    RECORDER.end()
    _stop_users(environment)
    for name in ("_tritonbundle_ticker", "_tritonbundle_closer"):
        greenlet = getattr(environment, name, None)
        if greenlet is not None and greenlet is not gevent.getcurrent():
            greenlet.kill()
    scraper = getattr(environment, "_tritonbundle_scraper", None)
    if scraper is not None:
        scraper.kill()
        gevent.sleep(SETTLE_S)
        _scrape(SETTINGS.metrics_url or "")
    stats = environment.stats
    errors = [{"method": e.method, "name": e.name, "error": str(e.error), "occurrences": e.occurrences}
              for e in stats.errors.values()]
    summary = summarize(RECORDER, SETTINGS, errors)
    summary["user_errors"] = [{"error": e, "occurrences": n} for e, n in USER_ERRORS.items()]
    summary["sent"] = RECORDER.n_sent  # more than total's requests: some were still in flight here
    summary["unanswered"] = unanswered(summary)
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


def close_open_clients(**_: Any) -> None:
    """Close the clients users left open (see :data:`OPEN_CLIENTS`), saying how many."""
    if not OPEN_CLIENTS:
        return
    print(f"loadtest: closing {len(OPEN_CLIENTS)} client(s) whose user did not close them", file=sys.stderr,
          flush=True)
    while OPEN_CLIENTS:
        client = OPEN_CLIENTS.pop()
        try:
            client.close()
        except Exception as e:  # noqa: BLE001 - the rest are still closed
            print(f"loadtest: closing a client failed: {e}", file=sys.stderr, flush=True)


events.test_start.add_listener(_on_test_start)  # type: ignore[no-untyped-call]
events.test_stopping.add_listener(_on_test_stopping)  # type: ignore[no-untyped-call]
events.user_error.add_listener(_on_user_error)  # type: ignore[no-untyped-call]
events.quitting.add_listener(_gate)  # type: ignore[no-untyped-call]
events.quit.add_listener(close_open_clients)  # type: ignore[no-untyped-call]
