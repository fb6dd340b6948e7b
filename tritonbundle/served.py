"""The bundle as a measured system: the real ``tritonserver`` on a built repository, driven by the
open-model load generators, with Triton's metrics, the encoder's own statistics, CPU per process and
the GPU observed around every load level. ``bench`` (its bundle phase) and ``tune`` (every point)
serve and measure through this one class.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from tritonbundle import proc
from tritonbundle.canary import Canary, server_cpu_s
from tritonbundle.gpu_sharing import servers_words
from tritonbundle.log import LOG
from tritonbundle.measure import triton_metrics
from tritonbundle.measure.latency import Slo
from tritonbundle.measure.levels import Ladder, Probes, Sampler, Timing, measure_rates, wait_idle
from tritonbundle.measure.loadgen import LoadPool
from tritonbundle.measure.probes import CpuMeter
from tritonbundle.measure.search import Sweep
from tritonbundle.runtimes.stacks import STACKS_SIGNAL
from tritonbundle.runtimes.stats import STATS_DIR_ENV, read_stats, read_stats_info
from tritonbundle.server import ServerOptions, TritonServer

#: Seconds one small request may take after a level before the measured model counts as stalled.
STALL_S = 10.0
#: The Python backend's stub process (what ``ps`` shows; the kernel keeps its first 15 characters).
STUB_NAME = "triton_python_backend_stub"
#: Seconds a stub is given to write its stacks before the next one is asked (each writes a few KiB).
STACKS_WRITE_S = 0.3


class ServedRepository:
    """``with ServedRepository(repo, folder) as served: served.start(...); served.connect(pool, ...);
    served.measure(...)``. ``folder`` receives the encoder's statistics and (unless ``log_path`` says
    otherwise) the server's log."""

    def __init__(self, repository: Path, folder: Path, *, extra_args: Sequence[str] = (),
                 log_path: Path | None = None) -> None:
        self.stats_dir = folder / "stats"
        self.stats_dir.mkdir(parents=True, exist_ok=True)
        for old in self.stats_dir.glob("*.json"):
            old.unlink()
        self.server = TritonServer(ServerOptions(
            repository, http_port=0, grpc_port=0, metrics_port=0, log_path=log_path or folder / "tritonserver.log", exit_timeout_s=5,
            extra_args=list(extra_args)))
        self.startup_s: float | None = None
        #: The MPS servers' process ids after the start (``TRITONBUNDLE_GPU_SHARING=mps``; else None).
        self.mps_servers: list[int] | None = None
        self._start_timeout_s = 120.0
        self._pool: LoadPool | None = None
        #: connect()'s arguments, for the load generators' setup after a restart.
        self._connected: dict[str, Any] = {}
        self._meter: CpuMeter | None = None
        #: The model the load generators call (connect()); the one a stall is looked for in.
        self.model: str | None = None
        self.stall_s = STALL_S

    def __enter__(self) -> ServedRepository:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def start(self, timeout_s: float) -> float:
        """Start the server (the encoder and tokenizer write their statistics to ``folder/stats``); seconds to ready."""
        self._start_timeout_s = timeout_s
        self.startup_s = self._launch(timeout_s)
        installation = self.server.installation
        LOG.info("    tritonserver ready in %.1f s (%s)", self.startup_s, installation.description if installation else "")
        self.mps_servers = self.server.mps.servers() if self.server.mps is not None else None
        if self.mps_servers is not None:
            LOG.info("    %s", servers_words(self.mps_servers))
        return self.startup_s

    def restart(self, timeout_s: float) -> float:
        """Stop what is left of a server that went down, start it again on the same ports within
        ``timeout_s`` and set the load generators up again (fresh channels, one checked call each: a
        channel left in gRPC's reconnect backoff would fail the next level's first requests); seconds."""
        t0 = time.monotonic()
        self.server.stop(timeout_s=20)
        self._launch(max(1.0, min(self._start_timeout_s, timeout_s - (time.monotonic() - t0))))
        if self._pool is not None:
            self.connect(self._pool, **self._connected)
        seconds = time.monotonic() - t0
        LOG.info("    tritonserver back in %.1f s", seconds)
        return seconds

    def _launch(self, timeout_s: float) -> float:
        t0 = time.monotonic()
        previous = os.environ.get(STATS_DIR_ENV)
        os.environ[STATS_DIR_ENV] = str(self.stats_dir)
        try:
            self.server.start(wait=False)
        finally:  # the server took its environment at start; later servers get their own folder
            if previous is None:
                os.environ.pop(STATS_DIR_ENV, None)
            else:
                os.environ[STATS_DIR_ENV] = previous
        self.server.wait_ready(timeout_s=timeout_s)
        return time.monotonic() - t0

    def stop(self) -> None:
        self.server.stop(timeout_s=20)

    @property
    def grpc_url(self) -> str:
        return self.server.grpc_url

    def instances(self) -> list[dict[str, Any]]:
        """What each encoder instance reported at start-up (device, graphs, launch timings)."""
        return read_stats_info(self.stats_dir)

    def launch_ms(self) -> dict[str, float] | None:
        """"<batch>x<padded length>" -> ms per launch, as the pytorch runtime's engine timed its graphs
        at start-up (:func:`fastest_launch_ms` over the instances); None for runtimes that report none."""
        return fastest_launch_ms(self.instances())

    def connect(self, pool: LoadPool, *, model: str, traffic: Path, seed: int, timeout_s: float,
                ready_timeout_s: float, requests: str = "auto") -> None:
        """Point the load generators at ``model`` over gRPC, each with its requests drawn from ``traffic``
        (``requests``: ``auto``, the model's own; ``tokens``, token rows to its encoder)."""
        assert self.server.process is not None, "start() first"
        pool.setup(kind="grpc", url=self.server.grpc_url, model=model, traffic=str(traffic), seed=seed,
                   timeout_s=timeout_s, ready_timeout_s=ready_timeout_s, requests=requests, http_url=self.server.http_url)
        self._pool = pool
        self.model = model
        self._connected = {"model": model, "traffic": traffic, "seed": seed, "timeout_s": timeout_s,
                           "ready_timeout_s": ready_timeout_s, "requests": requests}
        self._meter = CpuMeter({"server": self.server.process.pid, **{f"load{i}": p for i, p in enumerate(pool.pids)}})

    def probes(self) -> Probes:
        assert self._meter is not None, "connect() first"
        metrics_url = self.server.metrics_url

        def meter() -> CpuMeter:  # read at each level: a restart's connect() meters the new server's process
            assert self._meter is not None
            return self._meter

        def observe() -> dict[str, Any]:
            time.sleep(0.3)  # let the encoder's statistics file catch up (written every 0.25 s)
            try:
                sample = triton_metrics.scrape(metrics_url)
            except OSError:
                sample = {}
            return {"metrics": sample, "stats": read_stats(self.stats_dir),
                    "tokenizer": read_stats(self.stats_dir, "tokenizer"), "cpu": meter().read(),
                    "threads": dict(meter().threads), "t": time.monotonic()}

        def finish(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
            views = {v.model: v.to_json() for v in triton_metrics.view(before["metrics"], after["metrics"])}
            tokenizer = {k: v - before["tokenizer"].get(k, 0.0) for k, v in after["tokenizer"].items()}
            return {
                "triton": views,
                "encoder": {k: after["stats"][k] - before["stats"].get(k, 0.0) for k in after["stats"]},
                **({"tokenizer": tokenizer} if tokenizer else {}),
                "cpu_cores": CpuMeter.delta(before["cpu"], after["cpu"], after["t"] - before["t"]),
                "cpu_processes": dict(meter().processes),
                "cpu_threads": CpuMeter.busiest_threads(before["threads"], after["threads"], after["t"] - before["t"]),
            }

        def drain(max_s: float) -> float:
            return wait_idle(lambda: triton_metrics.pending_requests(metrics_url), max_s, 0.0)

        return Probes(observe=observe, finish=finish, drain=drain, down=self.down_reason, restart=self.restart)

    def down_reason(self) -> str:
        """Why the server is down ('' while it serves): it exited or its metrics went quiet
        (:meth:`TritonServer.down_reason`), or the measured model is stuck: the canary's one small
        request finds a dead stub, or is refused or times out while Triton counts no answer from the
        model for ``stall_s`` (:data:`STALL_S`; :mod:`tritonbundle.canary`, "hung"). Before the server is
        called down, its Python stubs write every thread's stack to its log
        (:mod:`tritonbundle.runtimes.stacks`), so the report can say where they stopped."""
        why = self.server.down_reason()
        model = self.model
        if why or not model:
            return why
        canary = Canary(url=f"http://{self.server.http_url}", models=[model], timeout_s=self.stall_s,
                        metrics_url=self.server.metrics_url, cpu_s=lambda: server_cpu_s(self.server.pgid()))
        stuck = [problem.message for problem in canary.check() if problem.fatal]
        if not stuck:
            return ""
        return f"{model}: {stuck[0]} ({self.write_stacks()})"

    def write_stacks(self) -> str:
        """Ask every Python stub of the server, one at a time, to write each thread's stack to the server
        log (:mod:`tritonbundle.runtimes.stacks`), each block under a line naming the stub's process and
        model instance, and say so: a model that stopped answering can be read. (Signalled at once, seven
        stubs on the H200 wrote their stacks into one another, line by line.)"""
        if self.server.process is None:
            return "no server process to ask for its stubs' stacks"
        log = self.server.options.log_path
        written = 0
        # Appended to, like the server does (O_APPEND): the headers land between the stubs' blocks.
        with open(log or os.devnull, "a", encoding="utf-8") as f:
            for pid in proc.descendants(self.server.process.pid, STUB_NAME):
                f.write(f"\n== the stacks of Python stub {pid} ({stub_instance(pid)}):\n")
                f.flush()
                try:
                    os.kill(pid, STACKS_SIGNAL)
                except ProcessLookupError:
                    continue
                written += 1
                time.sleep(STACKS_WRITE_S)  # the stub writes from its signal handler: let it finish
        return f"{written} Python stub(s) wrote every thread's stack to {log}"

    def measure(self, *, system: str, slo: Slo, timing: Timing, ladder: Ladder, deadline: float, seed: int,
                samplers: Sequence[Sampler] = ()) -> Sweep:
        """The rate search on this server (:func:`tritonbundle.measure.levels.measure_rates`)."""
        assert self._pool is not None, "connect() first"
        return measure_rates(self._pool, system=system, slo=slo, timing=timing, ladder=ladder, probes=self.probes(),
                             deadline=deadline, seed=seed, samplers=samplers)


def stub_instance(pid: int) -> str:
    """The model instance a Python stub serves: the second-to-last word of its command line
    (python_backend ``stub_launcher.cc``: ``... <model instance name> <runtime modeldir>``)."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "gone"
    words = [w for w in words if w]
    return words[-2].decode(errors="replace") if len(words) >= 2 else "?"


def fastest_launch_ms(instances: list[dict[str, Any]]) -> dict[str, float] | None:
    """Per shape, the fastest time any encoder instance measured for it. The instances replay the same
    graphs on the same GPU, so they differ only by what else ran meanwhile: before each instance timed
    alone (engine.py, "Launch costs"), the slowest of four read 64 x 512 at up to 90 ms where it takes
    21 on an H200, and `tune` cut its batch buckets at 32 rows on figures like that. (On a host with
    GPUs of different kinds this is the fastest kind's figure; tune measures one GPU's host.)"""
    timings: dict[str, float] = {}
    for info in instances:
        for shape, ms in (info.get("timings_ms") or {}).items():
            timings[shape] = min(timings.get(shape, float("inf")), float(ms))
    return timings or None
