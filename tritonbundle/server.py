"""Start, supervise and stop a real ``tritonserver`` (found by :mod:`tritonbundle.installation`).

The server binds to 127.0.0.1 unless told otherwise, writes its log to a file, and is stopped with
SIGTERM (Triton then drains in-flight requests for up to ``exit_timeout_s``) and SIGKILL after that.
With ``TRITONBUNDLE_GPU_SHARING=mps`` its model instances share the GPU through a private CUDA MPS
daemon, started before it and stopped after it (:mod:`tritonbundle.gpu_sharing`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tritonbundle import proc
from tritonbundle.canary import Canary
from tritonbundle.contract import RESTRICTED_APIS, RESTRICTED_HEADER, TENANT_HEADER
from tritonbundle.errors import ServerError
from tritonbundle.gpu_sharing import MpsDaemon, sharing_from_env
from tritonbundle.installation import Installation, find_installation
from tritonbundle.log import LOG


def redact(text: str, secret: str | None) -> str:
    """``text`` with ``secret`` replaced by ``***`` (keys never reach a log)."""
    return text.replace(secret, "***") if secret else text


@dataclass
class ServerOptions:
    """What ``tritonserver`` is started with; ports of 0 are replaced by free ones."""

    model_repository: Path
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    address: str = "127.0.0.1"
    log_path: Path | None = None
    model_control_mode: str = "none"
    load_models: Sequence[str] = ()
    exit_timeout_s: int = 30
    #: The key the repository (model control), shared-memory, trace and logging APIs need. None
    #: locks them with a random key nobody knows (they are never left open).
    restricted_api_key: str | None = None
    #: Leave those APIs open (tests of the unrestricted server only; never shipped).
    unrestricted: bool = False
    log_verbose: int = 0
    #: READY only while every model is (Triton's --strict-readiness). Default: on, except with
    #: explicit model control, where a failed load of a new version (the old one keeps serving)
    #: must not take the whole server out of its load balancer.
    strict_readiness: bool | None = None
    extra_args: Sequence[str] = ()
    tritonserver: str | None = None

    def __post_init__(self) -> None:
        if self.model_control_mode not in ("none", "poll", "explicit"):
            raise ServerError(f"model control mode must be none, poll or explicit, not {self.model_control_mode!r}")
        if not self.restricted_api_key and not self.unrestricted:
            import secrets

            self.restricted_api_key = secrets.token_urlsafe(24)


#: Error lines the wheel's CPU-only tritonserver writes at every start.
_BENIGN_ERRORS = ("CudaDriverHelper has not been initialized", "CUDA driver", "cuda", "GPU metrics")


@dataclass
class TritonServer:
    """A running ``tritonserver`` process; a context manager that stops it on exit.

    >>> with TritonServer(ServerOptions(Path("model_repository"), http_port=0)).start() as server:
    ...     server.http_url
    """

    options: ServerOptions
    installation: Installation | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)
    _log_offset: int = field(default=0, init=False, repr=False)
    #: The server's own MPS daemon while it runs with ``TRITONBUNDLE_GPU_SHARING=mps``.
    mps: MpsDaemon | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        o = self.options
        taken = {o.http_port, o.grpc_port, o.metrics_port}
        spare = iter(p for p in proc.free_ports(6) if p not in taken)  # six: three are enough after any taken
        o.http_port = o.http_port or next(spare)
        o.grpc_port = o.grpc_port or next(spare)
        o.metrics_port = o.metrics_port or next(spare)
        if self.installation is None:
            self.installation = find_installation(o.tritonserver)

    # -- addresses ------------------------------------------------------------------------------
    @property
    def _host(self) -> str:
        return "127.0.0.1" if self.options.address in ("0.0.0.0", "") else self.options.address

    @property
    def http_url(self) -> str:
        return f"{self._host}:{self.options.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self._host}:{self.options.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self._host}:{self.options.metrics_port}/metrics"

    @property
    def _strict(self) -> bool:
        o = self.options
        return o.strict_readiness if o.strict_readiness is not None else o.model_control_mode != "explicit"

    # -- lifecycle -------------------------------------------------------------------------------
    def command(self) -> list[str]:
        o = self.options
        assert self.installation is not None
        argv = [
            str(self.installation.binary),
            f"--model-repository={Path(o.model_repository).resolve()}",
            f"--backend-directory={self.installation.backend_dir}",
            f"--http-address={o.address}", f"--http-port={o.http_port}",
            f"--grpc-address={o.address}", f"--grpc-port={o.grpc_port}",
            f"--metrics-address={o.address}", f"--metrics-port={o.metrics_port}",
            f"--model-control-mode={o.model_control_mode}",
            f"--exit-timeout-secs={o.exit_timeout_s}",
            f"--log-verbose={o.log_verbose}",
            f"--strict-readiness={str(self._strict).lower()}",
            # The gateway's tenant header reaches the models as a request parameter (request.parameters()).
            f"--grpc-header-forward-pattern={TENANT_HEADER}", f"--http-header-forward-pattern={TENANT_HEADER}",
        ]
        argv += [f"--load-model={m}" for m in o.load_models]
        if o.restricted_api_key:
            for api in RESTRICTED_APIS:
                argv.append(f"--http-restricted-api={api}:{RESTRICTED_HEADER}={o.restricted_api_key}")
                argv.append(f"--grpc-restricted-protocol={api}:{RESTRICTED_HEADER}={o.restricted_api_key}")
        argv += list(o.extra_args)
        return argv

    def start(self, *, ready_timeout_s: float = 120.0, wait: bool = True,
              stop: threading.Event | None = None) -> TritonServer:
        """Start tritonserver and (``wait``) wait until it is ready, or until ``stop`` is set."""
        if self.process is not None and self.process.poll() is None:
            raise ServerError("server already running")
        o = self.options
        # First: a start that fails before launching anything (a port taken, the repository gone) must not
        # read the last start's log, whose "Started" lines would make it a crash of a server that came up.
        log = Path(o.log_path) if o.log_path else None
        self._log_offset = log.stat().st_size if log is not None and log.exists() else 0
        repo = Path(o.model_repository)
        if not repo.is_dir():
            raise ServerError(f"model repository {repo} does not exist (run `tritonbundle repo` first)")
        assert self.installation is not None
        for what, folder in (("model repository", repo.resolve()), ("backend directory", self.installation.backend_dir)):
            if any(c.isspace() for c in str(folder)):  # the Python backend's stub gets its paths split at spaces
                raise ServerError(f"the {what} {str(folder)!r} has a space in its path, which Triton's Python "
                                  "backend cannot start from: move it, or reach it through a symlink without one")
        self._check_ports()
        LOG.debug("starting %s", redact(" ".join(self.command()), o.restricted_api_key))
        # The key reaches tritonserver on its command line only (2.51 has no other way to take it):
        # never through the environment, which every Python stub inherits and may log.
        env = {k: v for k, v in {**os.environ, **self.installation.env, **self._gpu_sharing_env()}.items()
               if not (o.restricted_api_key and v == o.restricted_api_key)}
        # Dies with us (a SIGKILLed `serve` leaves no server holding the ports), but only when started
        # from the main thread: the kernel's "parent" is the thread that forked (prctl(2),
        # PR_SET_PDEATHSIG), so a server started from a short-lived thread would die with that thread.
        try:
            self.process = proc.start_group(self.command(), log=o.log_path, env=env, inherit_env=False,
                                            die_with_parent=threading.current_thread() is threading.main_thread())
        except OSError as e:  # not executable, not a program
            self._stop_gpu_sharing()
            raise ServerError(f"cannot run tritonserver {self.installation.binary}: {e}") from e
        except BaseException:
            self._stop_gpu_sharing()
            raise
        if wait:
            self.wait_ready(timeout_s=ready_timeout_s, stop=stop)
        return self

    def _gpu_sharing_env(self) -> dict[str, str]:
        """With ``TRITONBUNDLE_GPU_SHARING=mps``: this server's own MPS daemon (started with the server,
        stopped by :meth:`stop`) and the variables that send its processes there."""
        if sharing_from_env() != "mps":
            return {}
        if self.mps is None:
            daemon = MpsDaemon()
            # A daemon that does not start leaves nothing for the next start to trip on; one that did
            # dies with this thread, as the server does (see start()).
            daemon.start(die_with_parent=threading.current_thread() is threading.main_thread())
            self.mps = daemon
        return self.mps.env

    def _stop_gpu_sharing(self) -> None:
        if self.mps is not None:  # after the server: its processes are the daemon's clients
            self.mps.stop()
            self.mps = None

    def _check_ports(self) -> None:
        """Refuse to start on a port someone else holds: the readiness poll would ask them, not us."""
        o = self.options
        for what, port in (("HTTP", o.http_port), ("gRPC", o.grpc_port), ("metrics", o.metrics_port)):
            if not proc.port_free(o.address, port):
                raise ServerError(f"the {what} port {o.address}:{port} is taken by {proc.port_holder(port)}: "
                                  "stop it or choose another port")

    def _start_log(self) -> str | None:
        """What tritonserver logged since the last start (None without a log file)."""
        path = self.options.log_path
        if path is None or not Path(path).exists():
            return None
        with open(path, "rb") as f:
            f.seek(self._log_offset)
            return f.read().decode(errors="replace")

    def start_log(self) -> str | None:
        """What tritonserver logged since its last start (None: no log)."""
        return self._start_log()

    def came_up(self) -> bool:
        """Whether the last start reached serving (its log says the endpoints started), even if it
        went down before the readiness poll saw it."""
        text = self._start_log() or ""
        return "Started HTTPService" in text or "Started GRPCInferenceService" in text

    def is_ready(self) -> bool:
        return proc.http_ok(f"http://{self.http_url}/v2/health/ready")

    def wait_ready(self, *, timeout_s: float = 120.0, stop: threading.Event | None = None) -> bool:
        """Wait until ``/v2/health/ready`` answers 200 (True), or ``stop`` is set (False: SIGTERM while the
        models load must not wait for them); raise with the log's tail if it never gets ready."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if stop is not None and stop.is_set():
                return False
            if self.process is not None and self.process.poll() is not None:
                self._stop_gpu_sharing()
                raise ServerError(f"tritonserver exited with code {self.process.returncode} before becoming ready: "
                                  f"{self.cause()}\n{self.log_tail()}")
            if self.is_ready():
                return True
            time.sleep(0.1)
        self.stop()
        raise ServerError(f"tritonserver was not ready after {timeout_s:g} s: {self.cause()}\n{self.log_tail()}")

    def cause(self) -> str:
        """The first error this start logged (a "failed to load" line, then any other glog ``E``
        line except the CPU build's CUDA notices), else a pointer to the log."""
        text = self._start_log()
        if text is None:
            return "no server log to say why"
        lines = [line.strip() for line in text.splitlines()]
        if any(line.startswith("Usage: tritonserver") for line in lines):  # it refused its command line:
            return next(line for line in reversed(lines) if line)  # the usage text, then why, last
        errors = [line for line in lines if len(line) > 5 and line[0] == "E" and line[1:5].isdigit()
                  and not any(noise in line for noise in _BENIGN_ERRORS)]
        for line in [line for line in lines if "failed to load" in line] + errors:
            return line.split("] ", 1)[1] if "] " in line else line
        return f"no error line in {self.options.log_path} (its tail follows)"

    def crash_line(self) -> str:
        """The log's first sign of a crash since the last start (an ASSERTION FAILED, a "Signal (11)
        received", an uncaught exception), else ''."""
        for line in (self._start_log() or "").splitlines():
            if any(mark in line for mark in ("ASSERTION FAILED", "Signal (", "terminate called", "Segmentation fault")):
                return line.strip()
        return ""

    def pgid(self) -> int:
        """The process group of tritonserver and its stubs (it is started as a group leader), -1 when
        none runs: the canary's CPU evidence (:func:`tritonbundle.canary.server_cpu_s`)."""
        process = self.process
        return process.pid if process is not None and process.poll() is None else -1

    def down_reason(self) -> str:
        """Why the server is down ('' when it is not): it exited (the log's crash line), or its metrics
        endpoint no longer answers (stopped or deadlocked). For measurements between load levels."""
        process = self.process
        if process is not None and process.poll() is not None:
            return f"tritonserver exited with code {process.returncode}: {self.crash_line() or self.cause()}"
        if not proc.http_ok(self.metrics_url, timeout_s=5.0):
            return f"tritonserver's metrics endpoint does not answer: hung ({self.crash_line() or 'no crash line'})"
        return ""

    def log_tail(self, lines: int = 25) -> str:
        path = self.options.log_path
        if path is None or not Path(path).exists():
            return "(no server log; pass --log-file to keep one)"
        text = Path(path).read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def stop(self, *, timeout_s: float | None = None) -> int | None:
        """SIGTERM, wait for Triton's own drain (``exit_timeout_s`` + margin), then SIGKILL."""
        grace = timeout_s if timeout_s is not None else self.options.exit_timeout_s + 10
        code = None if self.process is None else proc.stop_group(self.process, grace_s=grace)
        self._stop_gpu_sharing()
        return code

    def __enter__(self) -> TritonServer:
        if self.process is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def supervise(
    server: TritonServer, *, restart: bool, max_restarts: int = 10, backoff_s: float = 1.0,
    stop_event: threading.Event | None = None, ready_timeout_s: float = 120.0, already_started: bool = False,
    canary: Canary | None = None, canary_interval_s: float = 5.0, canary_misses: int = 2,
) -> int:
    """Run the server until ``stop_event`` is set. It is down when its process exits, or when the
    ``canary`` finds a model that cannot answer ``canary_misses`` times in a row (every
    ``canary_interval_s``): a dead Python stub, which Triton 2.51 still reports READY.

    Without ``restart`` a down server ends the run with a non-zero code and the reason logged (so
    compose or Kubernetes restart the container). With it, a server that was up and went down (a
    crash, most often caused by a request, or a hang the canary found) is restarted at once: a backoff
    there would let a few poison requests a minute keep it down. Only starts that fail back off (1 s,
    2 s, ... at most 30 s), and only a start that never came up (no READY, and no "Started" line in its
    log: a poison request can crash a server before the readiness poll sees it) counts towards
    ``max_restarts``; that many in a row end the run with :class:`ServerError`. A start that fails on one
    model version moves that version out of the repository when the model has another
    (:func:`quarantine_failed_version`) and starts again.
    """
    stop_event = stop_event or threading.Event()
    failed_starts = 0
    if not already_started:
        server.start(ready_timeout_s=ready_timeout_s, stop=stop_event)
    up_since = time.monotonic()
    while True:
        reason = _watch(server, stop_event, canary, canary_interval_s, canary_misses)  # None when stopped
        if reason is None:
            asked = time.monotonic()
            stopped = server.stop() or 0
            LOG.info("tritonserver stopped in %.1f s (exit code %d)", time.monotonic() - asked, stopped)
            return stopped
        # A server whose models cannot answer would drain for its whole exit timeout, waiting on
        # requests a dead stub never finishes: a short grace, then SIGKILL.
        grace = min(2.0, server.options.exit_timeout_s + 1.0)
        if not restart:
            LOG.error("%s: stopping (run with --restart to restart it here)", reason)
            code = server.stop(timeout_s=grace)
            return code if code else 1
        LOG.warning("%s after %.0f s up: restarting tritonserver now", reason, time.monotonic() - up_since)
        server.stop(timeout_s=grace)
        while True:
            try:
                server.start(ready_timeout_s=ready_timeout_s, stop=stop_event)
                if stop_event.is_set():  # stopped while it started: _watch returns None, and it is stopped
                    break
                failed_starts = 0
                up_since = time.monotonic()
                LOG.info("tritonserver is ready again")
                break
            except ServerError as e:
                if server.came_up():  # up, then down again at once (a request): a crash, restarted at once
                    LOG.warning("tritonserver came up and went down before it was seen ready: %s",
                                str(e).splitlines()[0])
                    up_since = time.monotonic()
                    break
                if quarantine_failed_version(server) is not None:
                    continue
                failed_starts += 1
                LOG.warning("restart %d of at most %d failed: %s", failed_starts, max_restarts, str(e).splitlines()[0])
                if failed_starts >= max_restarts:
                    raise ServerError(f"tritonserver failed to start {failed_starts} times in a row; giving up\n"
                                      f"{server.log_tail()}") from e
                if stop_event.wait(min(30.0, backoff_s * 2 ** (failed_starts - 1))):
                    return 0


def _watch(server: TritonServer, stop_event: threading.Event, canary: Canary | None, interval_s: float,
           misses_allowed: int) -> str | None:
    """Wait until the server is down (the reason) or ``stop_event`` is set (None)."""
    misses = 0
    next_probe = time.monotonic() + interval_s
    while not stop_event.wait(0.25):
        process = server.process
        if process is None or process.poll() is not None:
            return f"tritonserver exited with code {None if process is None else process.returncode}"
        if canary is None or time.monotonic() < next_probe:
            continue
        problems = [p for p in canary.check() if p.fatal]
        next_probe = time.monotonic() + interval_s
        if not problems:
            misses = 0
            continue
        misses += 1
        text = "; ".join(str(p) for p in problems)
        LOG.warning("canary %d of %d: %s", misses, misses_allowed, text)
        if misses >= misses_allowed:
            return f"models do not answer ({text})"
    return None


def refused_versions(error: BaseException) -> list[str]:
    """The versions a load refused, as Triton names them ("version 11 is at UNAVAILABLE state: <why>"),
    from its error: only this load's (the model index also lists retired versions and versions refused
    before as UNAVAILABLE)."""
    import re

    return re.findall(r"version (\d+) is at UNAVAILABLE state", str(error))


def quarantine(repository: Path, model: str, version: str, reason: str) -> Path:
    """Move a version that must not serve (Triton refused it, or a release did) out of the served repository,
    next to it, with its error:
    ``<repository>.quarantine/<model>/<version>-<UTC time>/`` and ``error.txt``. Left in place, the
    broken version would be the latest one again at the next start, and that start would fail
    ("failed to load all models")."""
    import datetime

    repository = Path(repository).resolve()  # `--repository .`: its name, not "", names the quarantine
    source = repository / model / version
    if not source.is_dir():
        raise ServerError(f"{source} is not a version folder of model {model!r}")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    target = repository.parent / f"{repository.name}.quarantine" / model / f"{version}-{stamp}"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(source), str(target))
    (target / "error.txt").write_text(reason.rstrip() + "\n")
    return target


def quarantine_failed_version(server: TritonServer) -> Path | None:
    """After a start that failed on a model version (Triton: "failed to load '<model>' version <n>"), move
    that version out of the repository when the model has another one to serve (the one that was serving
    before it), so the next start loads; None when there is nothing to move. A version that never went
    through ``tritonbundle load --repository`` would otherwise fail every restart."""
    import re

    match = re.search(r"failed to load '([^']+)' version (\d+): (.*)", server.start_log() or "")
    repository = Path(server.options.model_repository)
    if match is None:
        return None
    model, version, why = match.groups()
    others = [p for p in (repository / model).glob("[0-9]*") if p.is_dir() and p.name != version]
    if not (repository / model / version).is_dir() or not others:
        return None
    moved = quarantine(repository, model, version, f"tritonserver refused it at start: {why}")
    LOG.warning("moved %s/%s out of the repository (Triton refused it: %s): %s; the model serves version %s",
                model, version, why[:200], moved, max(p.name for p in others))
    return moved
