"""``tritonbundle loadtest``: run Locust headless, bounded in time and users, and write a report.

Locust runs in its own process (it monkey-patches the standard library with gevent), with the
settings in ``$TRITONBUNDLE_LOADTEST``; its ``loadtest:`` lines (progress every few seconds, the
first failure) are echoed to the console. The report folder gets Locust's CSV files, ``summary.json``
(requests, failures, offered vs achieved rate over the sending window, p50/p90/p95/p99 per protocol
and request, the per-second timeline, Triton's server-side view, SLO gate results), ``timeline.csv``,
PNG charts and a self-contained ``report.html``, all drawn from the summary. The exit code is the
gate's: 0 when the SLO holds, 1 when not.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tritonbundle import traffic
from tritonbundle.errors import ConfigError, TritonBundleError
from tritonbundle.loadtests import charts, htmlreport, report
from tritonbundle.loadtests.settings import ENV, LoadSettings
from tritonbundle.log import LOG, step
from tritonbundle.measure.latency import StepResult
from tritonbundle.measure.search import Sweep, search_rate

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
PREFIX = "locust"
#: The locustfile closes the sending window ``duration_s`` after the first request was scheduled;
#: Locust's own time limit is this much later, a backstop for users that take long to connect.
STARTUP_GRACE_S = 30.0
#: How long past the window, the startup grace and one request's timeout Locust gets to stop by itself.
SHUTDOWN_GRACE_S = 60.0
#: How long each user (and :func:`preflight`) waits for a server that is starting.
CONNECT_TIMEOUT_S = 30.0


@dataclasses.dataclass
class RunResult:
    exit_code: int
    summary: dict[str, Any]
    report_dir: Path
    files: list[Path]
    #: The run was asked to stop (a signal) before its window's end: the report covers what it ran.
    stopped: bool = False


class Stop(threading.Event):
    """Set when the run should end early; ``signum`` is the signal that asked (None: set by code)."""

    signum: int | None = None

    @property
    def exit_code(self) -> int:
        """The shell's code for a process ended by ``signum`` (128 + the signal's number), else 1."""
        return 128 + self.signum if self.signum else 1

    @property
    def reason(self) -> str:
        return signal.Signals(self.signum).name if self.signum else "a stop request"


@contextlib.contextmanager
def stop_on_signals(signums: Sequence[int] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)) -> Iterator[Stop]:
    """A :class:`Stop` that ``signums`` set while the block runs (the previous handlers come back
    after). Pass it to :func:`run`, :func:`sweep` or :func:`search`: the Locust run in progress is sent
    SIGTERM and waited for (bounded), so that no load outlives the command. Handlers can only be set
    from the main thread; elsewhere the Stop is returned unwired."""
    stop = Stop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum: int, _frame: object) -> None:
        if not stop.is_set():
            stop.signum = signum
            print(f"{CONSOLE_PREFIX} received {signal.Signals(signum).name}: stopping the load test (requests in "
                  "flight drain, then the report is written)", file=sys.stderr, flush=True)
        stop.set()

    previous = {s: signal.signal(s, handler) for s in signums}
    try:
        yield stop
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


#: Per-run outputs in the report folder: removed before a run starts, so that a run that writes none
#: of them (Locust failed to start) is never reported from a previous run's files.
RUN_OUTPUTS = ("summary.json", "timeline.csv", "report.html", "latency.png", "throughput.png", "server.png",
               *(f"{PREFIX}_{name}.csv" for name in ("stats", "stats_history", "failures", "exceptions")))


def clear_outputs(report_dir: Path) -> None:
    """Remove a previous run's outputs from ``report_dir`` (only the files a run writes)."""
    for name in RUN_OUTPUTS:
        try:
            (report_dir / name).unlink(missing_ok=True)
        except OSError as e:
            raise TritonBundleError(f"cannot remove the previous run's {report_dir / name} ({e.strerror}): "
                                    "make it writable, or choose another --out") from e


def preflight(settings: LoadSettings) -> None:
    """Check what Locust would otherwise fail on in its own log, before it starts: the files named
    (recorded inputs, traffic sample) and, for each protocol, that the server answers and serves the
    model (waiting, as the users do, up to ``CONNECT_TIMEOUT_S`` for a server that is starting)."""
    if settings.inputs and not Path(settings.inputs).is_file():
        raise ConfigError(f"recorded inputs {settings.inputs} do not exist: give the .npz file of recorded inputs to "
                          "--inputs, or leave it out for random inputs")
    if settings.traffic:
        traffic.load(settings.traffic)  # a missing or malformed sample: its ConfigError names the file
    from tritonbundle.clients import connect

    for protocol in settings.protocols:
        url = settings.http_url if protocol == "http" else settings.grpc_url
        assert url is not None
        try:
            connect(url, protocol=protocol, model=settings.model, timeout_s=settings.timeout_s,
                    connect_timeout_s=CONNECT_TIMEOUT_S).close()
        except TritonBundleError as e:
            flag = "--http-url" if protocol == "http" else "--grpc-url"
            raise TritonBundleError(f"the {protocol} users could not start against {url}: {e}. Check {flag}, "
                                    "--model and that the server is up (`tritonbundle health`)") from e


def locust_command(settings: LoadSettings) -> list[str]:
    report_dir = Path(settings.report_dir)
    return [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
        "-u", str(settings.users), "-r", str(settings.spawn_rate), "-t", f"{settings.duration_s + STARTUP_GRACE_S:g}s",
        "--stop-timeout", f"{_stop_timeout_s(settings)}",
        "--csv", str(report_dir / PREFIX), "--csv-full-history",
        "--only-summary", "--loglevel", "WARNING", "--exit-code-on-error", "0",
        *settings.user_classes(),
    ]


def run(settings: LoadSettings, stop: threading.Event | None = None) -> RunResult:
    """One bounded Locust run; returns its gate exit code and summary. Setting ``stop`` ends the run
    before its window does: Locust stops on SIGTERM as at the window's end (the users stop, requests in
    flight drain, the gates run and write the summary), its window then as long as it ran; it is killed
    if it has not exited ``stop_grace_s`` later. A previous run's outputs in the report folder are
    removed first: a run that writes no summary is an error, never a previous run's result."""
    report_dir = Path(settings.report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    clear_outputs(report_dir)
    settings = dataclasses.replace(settings, report_dir=str(report_dir.resolve()))
    env = {**os.environ, ENV: settings.to_env()}
    env.pop("LOCUST_SKIP_MONKEY_PATCH", None)  # Locust needs gevent's patches in its own process
    argv = locust_command(settings)
    budget = settings.duration_s + STARTUP_GRACE_S + settings.timeout_s + SHUTDOWN_GRACE_S
    LOG.debug("$ %s", " ".join(argv))
    log = report_dir / "locust.log"
    summary_path = report_dir / "summary.json"
    returncode, output, hung = _run_locust(argv, env, budget, log, stop, summary_path, stop_grace_s(settings))
    if not summary_path.exists():
        tail = "\n".join(output.strip().splitlines()[-15:])
        if hung:
            raise TritonBundleError(f"locust did not stop within {budget:.0f} s and wrote no summary; its stacks "
                                    f"at the end are in {log}:\n{tail}")
        raise TritonBundleError(f"locust exited with code {returncode} and wrote no summary:\n{tail}")
    summary = json.loads(summary_path.read_text())
    if hung:  # the gates ran (they write the summary): only Locust's own shutdown did not finish
        LOG.warning("locust wrote its summary but did not exit (within %.0f s of writing it, or of its %.0f-s "
                    "budget); killed it (stacks in %s)", EXIT_GRACE_S, budget, log)
        returncode = 0 if summary["gates"]["passed"] else 1
    files = [*charts.write_pngs(report_dir, summary), write_timeline_csv(report_dir / "timeline.csv", summary),
             htmlreport.write(report_dir / "report.html", summary)]
    return RunResult(returncode, summary, report_dir, files, stopped=stop is not None and stop.is_set())


def stop_grace_s(settings: LoadSettings) -> float:
    """How long Locust gets to exit once asked to stop: its users' --stop-timeout (requests in flight
    drain), the gates, and its own exit."""
    return _stop_timeout_s(settings) + EXIT_GRACE_S + 5.0


def _stop_timeout_s(settings: LoadSettings) -> int:
    return max(5, int(settings.timeout_s) + 1)


TIMELINE_COLUMNS = ("t", "dt", "sent", "requests", "failures", "offered_rps", "achieved_rps", "p50_ms", "p99_ms",
                    "users")


def write_timeline_csv(path: Path, summary: dict[str, Any]) -> Path:
    """summary.json's per-second timeline as CSV (an empty p99 in a row with requests: failures, infinite)."""
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(TIMELINE_COLUMNS)
        for row in summary.get("timeline") or []:
            out.writerow(["" if row.get(c) is None else row[c] for c in TIMELINE_COLUMNS])
    return path


#: Lines of the Locust process that are for the user, not only for locust.log.
CONSOLE_PREFIX = "loadtest:"


#: Before killing a Locust run that outlived its budget, ask it for its greenlets' and threads' stacks
#: (the locustfile's signal handlers print them into locust.log) and give it this long to write them.
STACKS_GRACE_S = 2.0
#: Once the gates have written this run's summary, how long Locust gets to exit before it is killed as
#: hung (the report no longer needs it). A gRPC channel closed from a client's ``__del__`` during the
#: interpreter's last garbage collection can deadlock under gevent: a CI run's locust.log ended in
#: grpc/_channel.py ``close`` under "Garbage-collecting", ~3.5 minutes after the summary was written.
EXIT_GRACE_S = 15.0


def _run_locust(argv: list[str], env: dict[str, str], budget_s: float, log: Path,
                stop: threading.Event | None = None, summary: Path | None = None,
                stop_grace_s: float = 30.0) -> tuple[int, str, bool]:
    """Run Locust, keeping its whole output in ``log`` and echoing the lines meant for the console (the
    progress lines, the first failure) as they come; SIGTERM it once ``stop`` is set. Returns the exit
    code, the output, and whether it had to be killed for outliving ``budget_s``, ``stop_grace_s`` past
    the stop, or ``EXIT_GRACE_S`` past writing ``summary``. Locust runs in a session of its own, so that
    a Ctrl-C at the terminal reaches only this process, which stops it once (see :func:`stop_on_signals`)."""
    lines: list[str] = []
    hung = False
    with log.open("w") as out:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                out.write(line)
                lines.append(line)
                if line.startswith(CONSOLE_PREFIX):
                    print(line.rstrip(), file=sys.stderr, flush=True)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            _wait(proc, budget_s, stop, summary, stop_grace_s)
        except subprocess.TimeoutExpired:
            hung = True
            for sig in (signal.SIGUSR2, signal.SIGUSR1):
                proc.send_signal(sig)
                time.sleep(STACKS_GRACE_S / 2)
            proc.kill()
            proc.wait()
        except BaseException:  # never leave Locust sending load behind this process
            proc.kill()
            proc.wait()
            raise
        reader.join(timeout=10)
    return proc.returncode, "".join(lines), hung


def _wait(proc: subprocess.Popen[str], budget_s: float, stop: threading.Event | None,
          summary: Path | None = None, stop_grace_s: float = 30.0) -> None:
    """``proc.wait(budget_s)``, sending ``proc`` SIGTERM once when ``stop`` is set before it exits and
    waiting at most ``stop_grace_s`` more, and at most ``EXIT_GRACE_S`` more once ``summary`` is written
    (a file older than the process is not this run's). Raises ``subprocess.TimeoutExpired`` past the
    deadline."""
    started = time.time()
    deadline, signalled, written = time.monotonic() + budget_s, False, False
    while True:
        try:
            proc.wait(timeout=max(0.0, min(0.25, deadline - time.monotonic())))
            return
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                raise
            if stop is not None and stop.is_set() and not signalled:  # once: Locust's handler drains and exits
                proc.send_signal(signal.SIGTERM)
                signalled = True
                deadline = min(deadline, time.monotonic() + stop_grace_s)
            if summary is not None and not written and summary.exists() and summary.stat().st_mtime >= started:
                deadline, written = min(deadline, time.monotonic() + EXIT_GRACE_S), True


def describe(summary: dict[str, Any]) -> str:
    lines = [f"target: {', '.join(summary['hosts'].values())}"] if summary.get("hosts") else []
    lines += [f"{'protocol':<10}{'requests':>9}{'failures':>9}{'req/s':>9}{'p50 ms':>9}{'p90 ms':>9}{'p95 ms':>9}{'p99 ms':>9}"]

    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:.0f}"

    for name, row in [*summary["by_protocol"].items(), ("all", summary["total"])]:
        lines.append(
            f"{name:<10}{row['requests']:>9}{row['failures']:>9}{row['throughput_rps']:>9.1f}"
            f"{fmt(row['p50_ms']):>9}{fmt(row['p90_ms']):>9}{fmt(row['p95_ms']):>9}{fmt(row['p99_ms']):>9}"
        )
    if summary.get("unanswered"):
        lines.append(f"unanswered: {summary['unanswered']} request(s) still in flight when the users were stopped")
    window, rate = summary.get("window"), summary.get("rate")
    if window and rate:
        target = f" (target {rate['target_rps']:g})" if rate.get("target_rps") else ""
        lines.append(f"rate: offered {rate['offered_rps']:.1f} req/s{target}, achieved {rate['achieved_rps']:.1f} "
                     f"req/s over the {window['sending_s']:.1f} s sending window; then {window['drain_s']:.1f} s of drain")
    for view in summary.get("server", []):
        lines.append(
            f"server {view['model']}: {view['requests']:.0f} requests in {view['executions']:.0f} executions "
            f"(avg batch {view['avg_batch_size']:.1f}); queue {view['queue_ms_per_request']:.1f} ms vs compute "
            f"{view['compute_ms_per_request']:.1f} ms per request"
        )
    gates = summary["gates"]
    lines.append("SLO: passed" if gates["passed"] else "SLO: FAILED: " + "; ".join(gates["failures"]))
    return "\n".join(lines)


def sweep(settings: LoadSettings, levels: Sequence[float],
          stop: threading.Event | None = None) -> tuple[int, list[dict[str, Any]], dict[str, Any] | None]:
    """One run per level (users in the closed model, requests/s in the open model); the best level is
    the highest throughput that met the SLO. Every level is checked before the first runs; ``stop``
    ends the level in progress and skips the rest (the report covers the levels run)."""
    base = Path(settings.report_dir)
    runs = sweep_levels(settings, levels)
    for name in ("sweep.json", "sweep.png"):
        (base / name).unlink(missing_ok=True)
    results = []
    for level, level_settings in runs:
        step(f"sweep level {level:g} ({'requests/s' if settings.mode == 'open' else 'users'})")
        result = run(level_settings, stop)
        summary = {**result.summary, "level": level}
        LOG.info("    %s", describe(summary).splitlines()[-1])
        results.append(summary)
        if result.stopped:
            break
    best = report.best_level(results)
    (base / "sweep.json").write_text(json.dumps(
        {"levels": [{"level": r["level"], "total": r["total"], "gates": r["gates"]} for r in results],
         "best": None if best is None else {"level": best["level"], "throughput_rps": best["total"]["throughput_rps"]}},
        indent=2))
    charts.plot_sweep(base / "sweep.png", results, settings.slo.p99_ms, "requests/s" if settings.mode == "open" else "users")
    return (0 if best is not None else 1), results, best


def sweep_levels(settings: LoadSettings, levels: Sequence[float]) -> list[tuple[float, LoadSettings]]:
    """Each sweep level's settings (users in the closed model, requests/s in the open model), every one
    checked: a ConfigError names the first level that cannot run."""
    if not levels:
        raise ConfigError("a sweep needs at least one level, e.g. --sweep 1,4,16")
    base = Path(settings.report_dir)
    runs = []
    for level in levels:
        changes: dict[str, Any] = {"report_dir": str(base / f"level-{level:g}")}
        if settings.mode == "open":
            changes["rate"] = float(level)
        elif level != int(level):
            raise ConfigError(f"closed-model sweep levels are users, whole numbers: {level:g} is not; "
                              "give levels such as 1,4,16 (or --mode open for rates)")
        else:
            changes["users"] = int(level)
        try:
            runs.append((level, dataclasses.replace(settings, **changes)))
        except ConfigError as e:
            raise ConfigError(f"sweep level {level:g}: {e}") from e
    return runs


def check_search(settings: LoadSettings) -> None:
    """What a rate search needs of the settings."""
    if settings.mode != "open":
        raise ConfigError("a rate search needs the open model (--mode open): the level is a rate")
    if settings.slo.p99_ms is None and settings.slo.p95_ms is None:
        raise ConfigError("a rate search needs a latency objective: --slo-p99-ms or --slo-p95-ms")


def step_from(summary: dict[str, Any], offered_rps: float) -> StepResult:
    """A run's totals as one load level of the rate search (percentiles as the summary computed them)."""
    total = summary["total"]

    def value(key: str) -> float:
        v = total.get(key)
        return float("inf") if v is None else float(v)

    # A request still unanswered when the users were stopped is a failure of its level.
    missing = report.unanswered(summary)
    sent, failed = int(total["requests"]) + missing, int(total["failures"]) + missing
    return StepResult(
        offered_rps=offered_rps, window_s=float(summary["duration_s"]), sent=sent, completed=sent - failed,
        failed=failed, p50_ms=value("p50_ms"), p90_ms=value("p90_ms"), p95_ms=value("p95_ms"), p99_ms=value("p99_ms"),
        mean_ms=value("mean_ms"), max_ms=value("max_ms"), achieved_rps=float(total["throughput_rps"]),
    )


def search(settings: LoadSettings, *, start: float, factor: float = 2.0, refine: int = 2, max_rate: float = 1e5,
           stop: Stop | None = None) -> Sweep:
    """The highest open-model rate that meets the SLO: :func:`tritonbundle.measure.search.search_rate`
    with one bounded Locust run per level (``level-<rate>/`` report folders, ``search.json``). ``stop``
    ends the level in progress and the search, as an error naming the levels' folders."""
    check_search(settings)
    base = Path(settings.report_dir)

    def measure(rate: float) -> StepResult:
        step(f"search: {rate:.1f} requests/s")
        result = run(dataclasses.replace(settings, rate=rate, report_dir=str(base / f"level-{rate:.1f}")), stop)
        if result.stopped:
            raise TritonBundleError(f"the rate search was stopped ({stop.reason if stop else 'a stop request'}) "
                                    f"at {rate:.1f} requests/s; the levels it ran are in {base}/level-*/")
        level = step_from(result.summary, rate)
        LOG.info("    %s", describe(result.summary).splitlines()[-1])
        return level

    found = search_rate(measure, slo=settings.slo, start=start, factor=factor, refine=refine, max_rate=max_rate)
    (base / "search.json").write_text(json.dumps(report.finite(found.to_json()), indent=2))
    return found
