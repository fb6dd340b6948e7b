"""``tritonbundle bench gpu``: three systems, one GPU, the same traffic, measured in turn.

For each model (all-MiniLM-L6-v2 with its real weights, a BERT-base-sized encoder with random
weights):

1. **naive**: :mod:`tritonbundle.bench.naive_server` (aiohttp, PyTorch FP32 eager, one request at a
   time, tokenizing in the server), driven over HTTP;
2. **bundle**: the real ``tritonserver`` serving the repository the build stage writes for
   ``--target gpu --runtime pytorch`` (tokenizer + encoder + ensemble, dynamic batching, padding to
   the plan's targets, CUDA graphs), driven over gRPC by ``AsyncGrpcClient`` from several processes;
3. **ceiling**: the same encoder engine in this process, no server: every (batch, padding target)
   graph timed with CUDA events, combined with the traffic's share of rows per target.

Naive and bundle get the same open-model rate search (Poisson arrivals, a geometric ladder then
bisection; see :func:`tritonbundle.bench.stats.search_rate`) on the same request stream. Every phase
runs inside its share of ``--budget-s``; a phase that fails is recorded as failed and the run goes on.
All processes are stopped at the end, whatever happened. Results are written after every phase.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tritonbundle import traffic as traffic_mod
from tritonbundle.bench import probes
from tritonbundle.bench import stats as st
from tritonbundle.bench.loadgen import LoadPool
from tritonbundle.errors import ConfigError, TritonBundleError
from tritonbundle.log import LOG, step

SYSTEMS = ("naive", "bundle", "ceiling")
TOKENIZER_ENV = "TRITONBUNDLE_TOKENIZER"


@dataclass(frozen=True)
class ModelDef:
    key: str
    name: str
    recipe: str
    hidden: int
    random_weights: bool
    description: str


MODELS = {
    "minilm": ModelDef("minilm", "minilm", "minilm", 384, False, "all-MiniLM-L6-v2 (real weights; 6 layers, hidden 384)"),
    "bert-base": ModelDef("bert-base", "bert_base", "bert-base-random", 768, True,
                          "BERT-base-sized encoder (RANDOM weights, seed 0: speed only; 12 layers, hidden 768)"),
}


@dataclass
class BenchOptions:
    out: Path
    work: Path | None = None
    budget_s: float = 420.0
    models: tuple[str, ...] = ("minilm", "bert-base")
    systems: tuple[str, ...] = SYSTEMS
    device: str = "cuda"
    slo_ms: float = 50.0
    traffic: Path | None = None
    sequence_buckets: int = 16
    batch_buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    queue_delay_us: int = 1000
    instances: int = 2
    #: The tokenizer is single-threaded Python: the first H200 runs showed one instance saturated.
    tokenizer_instances: int = 4
    load_procs: int = 0
    ladder_start: float = 50.0
    ladder_factor: float = 4.0
    refine: int = 3
    max_rate: float = 60000.0
    ceiling_batches: tuple[int, ...] = (1, 8, 32, 64, 128, 256)
    #: Client deadline per request (0: 20 x the SLO, at least 1 s).
    timeout_s: float = 0.0
    seed: int = 0
    keep_work: bool = False
    #: Share of each model's time for naive / bundle / ceiling (unused time rolls over).
    shares: dict[str, float] = field(default_factory=lambda: {"naive": 0.28, "bundle": 0.52, "ceiling": 0.20})

    def __post_init__(self) -> None:
        unknown = [m for m in self.models if m not in MODELS]
        if unknown:
            raise ConfigError(f"unknown model(s) {unknown}; known: {', '.join(MODELS)}")
        bad = [s for s in self.systems if s not in SYSTEMS]
        if bad:
            raise ConfigError(f"unknown system(s) {bad}; known: {', '.join(SYSTEMS)}")
        if self.device not in ("cuda", "cpu"):
            raise ConfigError(f"--device must be cuda or cpu, not {self.device!r}")
        if self.budget_s < 30:
            raise ConfigError("--budget-s must be at least 30 seconds")
        missing = [s for s in self.systems if not self.shares.get(s, 0) > 0]
        if missing:
            raise ConfigError(f"--shares: give each system a share > 0 (missing: {', '.join(missing)})")

    @property
    def target(self) -> str:
        return "gpu" if self.device == "cuda" else "cpu"

    @property
    def precision(self) -> str:
        return "fp16" if self.device == "cuda" else "fp32"


# -- time ----------------------------------------------------------------------------------------------
class Clock:
    def __init__(self, budget_s: float) -> None:
        self.start = time.monotonic()
        self.deadline = self.start + budget_s

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start


# -- inputs -----------------------------------------------------------------------------------------------
def tokenizer_file() -> Path:
    """BERT uncased tokenizer.json: ``$TRITONBUNDLE_TOKENIZER``, the MiniLM folder's, or the package's."""
    explicit = os.environ.get(TOKENIZER_ENV)
    if explicit:
        return Path(explicit)
    minilm = os.environ.get("TRITONBUNDLE_MINILM_DIR")
    if minilm and (Path(minilm) / "tokenizer.json").exists():
        return Path(minilm) / "tokenizer.json"
    from tritonbundle.export import recipes

    return recipes.tokenizer_file("minilm")


def manifest_for(model: ModelDef, options: BenchOptions, traffic_path: Path, tokenizer: Path) -> dict[str, Any]:
    return {
        "version": 1,
        "traffic": str(traffic_path.resolve()),
        "defaults": {
            "target": options.target, "runtime": "pytorch", "precision": options.precision,
            "batch_buckets": list(options.batch_buckets), "sequence_buckets": options.sequence_buckets,
            "max_queue_delay_us": options.queue_delay_us, "instances": options.instances,
            "tokenizer_instances": options.tokenizer_instances,
            "cuda_graphs": options.device == "cuda",
        },
        "models": [{
            "name": model.name, "task": "text-embedding", "source": {"recipe": model.recipe},
            "tokenizer": {"file": str(tokenizer.resolve()), "max_length": 512}, "max_sequence_length": 512,
            "inputs": [
                {"name": "input_ids", "dtype": "INT64", "shape": ["batch", "sequence"]},
                {"name": "attention_mask", "dtype": "INT64", "shape": ["batch", "sequence"]},
            ],
            "outputs": [{"name": "embedding", "dtype": "FP32", "shape": ["batch", model.hidden]}],
        }],
    }


@dataclass
class Built:
    spec: Any
    plan: Any
    repository: Path
    version_dir: Path
    manifest: Path


def build_repository(model: ModelDef, options: BenchOptions, work: Path, traffic_path: Path, tokenizer: Path) -> Built:
    """The build stage's plan + repository writer for ``--target gpu --runtime pytorch``.

    Same steps as ``tritonbundle build`` except the ONNX export, which the pytorch runtime does not
    use (and which needs the example-model package, absent on the GPU machine).
    """
    from tritonbundle.build.repository import ModelArtifacts, write_repository
    from tritonbundle.build.stage import BuildOptions, load_manifest, plan_all

    folder = work / model.name
    folder.mkdir(parents=True, exist_ok=True)
    manifest_path = folder / "models.yaml"
    manifest_path.write_text(yaml.safe_dump(manifest_for(model, options, traffic_path, tokenizer), sort_keys=False))
    build_options = BuildOptions(manifest=manifest_path, repository=folder / "model_repository", artifacts=folder / "artifacts")
    spec = load_manifest(build_options).models[0]
    plan = plan_all(build_options)[0][1]
    repo = folder / "model_repository"
    write_repository([(spec, plan, ModelArtifacts(None, tokenizer))], repo, work_root=build_options.artifacts)
    return Built(spec, plan, repo, repo / spec.encoder_name / "1", manifest_path)


# -- processes --------------------------------------------------------------------------------------------
def _free_port() -> int:
    from tritonbundle.server import free_port

    return free_port()


@contextlib.contextmanager
def naive_server(built: Built, tokenizer: Path, device: str, log: Path, timeout_s: float) -> Iterator[tuple[str, int]]:
    port = _free_port()
    argv = [sys.executable, "-m", "tritonbundle.bench.naive_server", "--weights", str(built.version_dir),
            "--tokenizer", str(tokenizer), "--device", device, "--port", str(port)]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,  # noqa: S603
                                env=_child_env())
        _remember_pid(proc.pid)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                if proc.poll() is not None:
                    raise TritonBundleError(f"the naive server exited with code {proc.returncode}: {_tail(log)}")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:  # noqa: S310
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise TritonBundleError(f"the naive server was not ready after {timeout_s:.0f} s: {_tail(log)}")
                time.sleep(0.2)
            yield f"127.0.0.1:{port}", proc.pid
        finally:
            _stop_group(proc)
            _forget_pid(proc.pid)


PIDFILE_ENV = "TRITONBUNDLE_PIDFILE"


def _remember_pid(pid: int) -> None:
    """Note a process group this run started (``$TRITONBUNDLE_PIDFILE``), so that a later run can end
    it by id if this one is killed before it can clean up (scripts/device_bench.sh does)."""
    path = os.environ.get(PIDFILE_ENV)
    if path:
        with contextlib.suppress(OSError), open(path, "a") as f:
            f.write(f"{pid}\n")


def _forget_pid(pid: int) -> None:
    path = os.environ.get(PIDFILE_ENV)
    if path and os.path.exists(path):
        with contextlib.suppress(OSError):
            kept = [line for line in Path(path).read_text().splitlines() if line.strip() and line.strip() != str(pid)]
            Path(path).write_text("".join(f"{x}\n" for x in kept))


def _stop_group(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


STUB_BIN_ENV = "TRITONBUNDLE_STUB_BIN"


def prepare_process_env() -> None:
    """Environment the servers and Python stubs inherit: this interpreter first on PATH (the stubs run
    isolated and find their packages through the ``python3`` on PATH), or ``$TRITONBUNDLE_STUB_BIN``
    before it when set (a bin/ whose environment has numpy 1.x: the wheel's stubs need it), and this
    interpreter's libpython first on LD_LIBRARY_PATH (a stub must embed the libpython that matches
    the standard library it finds)."""
    import sysconfig

    first = [p for p in (os.environ.get(STUB_BIN_ENV, ""), str(Path(sys.executable).parent)) if p]
    os.environ["PATH"] = os.pathsep.join((*first, os.environ.get("PATH", "")))
    libdir = sysconfig.get_config_var("LIBDIR")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    if libdir and Path(libdir, f"libpython{version}.so.1.0").exists():
        current = os.environ.get("LD_LIBRARY_PATH", "")
        if libdir not in current.split(os.pathsep):
            os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, current) if p)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _health_s(url: str) -> float:
    """Seconds the naive server takes to answer /health (its event loop is blocked while it computes)."""
    start = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - our own server
            r.read()
    except OSError:
        return math.inf
    return time.monotonic() - start


def pending_requests(metrics_url: str) -> float:
    """Requests queued in Triton, all models (``nv_inference_pending_request_count``)."""
    import re

    try:
        with urllib.request.urlopen(metrics_url, timeout=5) as r:  # noqa: S310 - our own server
            text = r.read().decode()
    except OSError:
        return math.inf
    return sum(float(m.group(1)) for m in re.finditer(r"^nv_inference_pending_request_count\{[^}]*\}\s+([0-9.eE+-]+)", text, re.M))


def wait_idle(probe: Callable[[], float], max_s: float, threshold: float) -> float:
    """Poll ``probe()`` until it reads <= ``threshold`` twice in a row (or ``max_s`` passes); return the wait."""
    start = time.monotonic()
    calm = 0
    while time.monotonic() - start < max_s:
        if probe() <= threshold:
            calm += 1
            if calm >= 2:
                break
        else:
            calm = 0
        time.sleep(0.05)
    return time.monotonic() - start


def read_stats(folder: Path) -> dict[str, float]:
    """The encoder instances' counters (pytorch_encoder.py's statistics files), summed."""
    total: dict[str, float] = {}
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for k, v in data.get("stats", {}).items():
            total[k] = total.get(k, 0.0) + float(v)
    return total


def read_stats_info(folder: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted(folder.glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            out.append(json.loads(path.read_text()).get("info", {}))
    return out


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after}


# -- phases -------------------------------------------------------------------------------------------------
@dataclass
class Context:
    options: BenchOptions
    clock: Clock
    work: Path
    logs: Path
    traffic_path: Path
    sample: traffic_mod.TrafficSample
    tokenizer: Path
    gpu: probes.GpuSampler | None
    save: Callable[[], None]
    references: dict[str, tuple[list[str], Any]] = field(default_factory=dict)


def step_timing(options: BenchOptions, phase_left: float, expected_steps: int) -> tuple[float, float, float]:
    """(warm-up, measured window, grace) seconds per load level, scaled to the time the phase has left."""
    grace = min(2.0, max(1.0, 4 * options.slo_ms / 1000.0))
    usable = max(0.0, phase_left) / max(1, expected_steps)
    window = min(5.0, max(1.0, (usable - grace - 2.0) / 1.25))
    warmup = max(0.5, 0.25 * window)
    return warmup, window, grace


def client_timeout_s(options: BenchOptions) -> float:
    """The client's deadline per request (also Triton's queue timeout): explicit, else 20 x the SLO, at least 1 s.
    A request slower than that has failed the SLO anyway; a short deadline keeps an overloaded level
    from leaving a long backlog behind for the next one."""
    return options.timeout_s if options.timeout_s > 0 else max(1.0, 20 * options.slo_ms / 1000.0)


def _setup_timeout(deadline: float) -> float:
    return min(120.0, max(20.0, deadline - time.monotonic()))


def _expected_steps(options: BenchOptions, system: str) -> int:
    ladder = max(1, int(math.log(options.max_rate / options.ladder_start) / math.log(options.ladder_factor)) + 1)
    guess = 3 if system == "naive" else 5
    return min(ladder, guess) + options.refine


def sweep(ctx: Context, pool: LoadPool, phase_deadline: float, system: str, observe: Callable[[], dict[str, Any]] | None,
          finish: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]] | None,
          drain: Callable[[float], float] | None = None) -> st.Sweep:
    """Rate search on one system, with server-side observations around each level. Before each level
    ``drain(max_s)`` waits until the system has no backlog left from the previous one."""
    o = ctx.options
    warmup, window, grace = step_timing(o, phase_deadline - time.monotonic(), _expected_steps(o, system))
    LOG.info("    %s: levels of %.1f s (+%.1f s warm-up), p99 SLO %g ms", system, window, warmup, o.slo_ms)
    cost = warmup + window + grace + 2.0
    level = [0]

    def measure(rate: float) -> st.StepResult:
        level[0] += 1
        drained = drain(min(15.0, max(1.0, phase_deadline - time.monotonic() - cost))) if drain else 0.0
        before = observe() if observe else {}
        t0 = time.monotonic()
        result = pool.step(rate, warmup_s=warmup, window_s=window, grace_s=grace, seed=o.seed * 100 + level[0])
        w0, w1 = t0 + warmup, t0 + warmup + window
        if ctx.gpu is not None:
            result.extra.update(ctx.gpu.window(w0, w1))
        if observe and finish:
            result.extra.update(finish(before, observe()))
        result.extra["drain_s"] = round(drained, 2)
        LOG.info("    %s @ %8.1f req/s offered: %8.1f answered/s, p50 %7.1f ms, p99 %7.1f ms, failed %d%s",
                 system, rate, result.achieved_rps, result.p50_ms, result.p99_ms, result.failed,
                 f", GPU {result.extra['gpu_util_mean']:.0f}%" if result.extra.get("gpu_util_mean") is not None else "")
        return result

    return st.search_rate(
        measure, slo_ms=o.slo_ms, start=o.ladder_start, factor=o.ladder_factor, refine=o.refine, max_rate=o.max_rate,
        can_continue=lambda: time.monotonic() + cost < phase_deadline,
    )


MIN_COSINE = 0.99


def reference(ctx: Context, built: Built) -> tuple[list[str], Any]:
    """A few texts from the traffic sample and their embeddings from the engine in FP32 on the CPU."""
    import numpy as np
    from tokenizers import Tokenizer

    from tritonbundle.bench.loadgen import text_pool
    from tritonbundle.triton_models.pytorch_encoder import Engine

    key = built.spec.name
    if key not in ctx.references:
        texts = [t for _, t in text_pool(str(ctx.traffic_path), seed=12345, size=8)]
        tok = Tokenizer.from_file(str(ctx.tokenizer))
        tok.no_padding()
        tok.enable_truncation(max_length=512)
        rows = [np.array(tok.encode(t).ids, dtype=np.int64) for t in texts]
        engine = Engine(built.version_dir, device="cpu", precision="fp32", targets=built.plan.padding_targets or (512,),
                        cuda_graphs=False)
        vectors = engine.embed(rows, [np.ones_like(r) for r in rows], np.array([len(r) for r in rows]))
        del engine
        ctx.references[key] = (texts, vectors)
    return ctx.references[key]


def check_answers(system: str, got: Any, expected: Any) -> dict[str, Any]:
    """Cosine of each answer with the FP32 reference; raise when a system computes something else."""
    import numpy as np

    got = np.asarray(got, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if got.shape != expected.shape:
        raise TritonBundleError(f"{system} answered shape {list(got.shape)}, expected {list(expected.shape)}")
    cosine = (got * expected).sum(axis=1) / np.maximum(np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1), 1e-12)
    worst = float(np.nan_to_num(cosine, nan=-1.0).min())
    if not worst >= MIN_COSINE:
        raise TritonBundleError(f"{system} answers differ from the FP32 reference (min cosine {worst:.4f} < {MIN_COSINE}): "
                                "its throughput would mean nothing")
    return {"texts": int(got.shape[0]), "min_cosine": worst}


def run_naive(ctx: Context, built: Built, model: ModelDef, deadline: float) -> dict[str, Any]:
    o = ctx.options
    procs = max(1, min(2, o.load_procs or 2))
    log = ctx.logs / f"naive-{model.name}.log"
    texts, expected = reference(ctx, built)
    with naive_server(built, ctx.tokenizer, o.device, log, timeout_s=min(180.0, max(30.0, deadline - time.monotonic()))) as (url, pid):
        answers = []
        for text in texts:
            request = urllib.request.Request(f"http://{url}/embed", data=json.dumps({"text": text}).encode(),
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=30) as r:  # noqa: S310 - our own server
                answers.append(json.loads(r.read())["embedding"])
        correctness = check_answers("the naive server", answers, expected)
        with LoadPool(procs, ctx.logs, f"naive-{model.name}", uvloop=True) as pool:
            pool.setup(kind="http", url=url, model=model.name, traffic=str(ctx.traffic_path), seed=o.seed,
                       timeout_s=client_timeout_s(o), ready_timeout_s=_setup_timeout(deadline))
            meter = probes.CpuMeter({"naive": pid, **{f"load{i}": p for i, p in enumerate(pool.pids)}})

            def observe() -> dict[str, Any]:
                return {"cpu": meter.read(), "t": time.monotonic()}

            def finish(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
                return {"cpu_cores": probes.CpuMeter.delta(before["cpu"], after["cpu"], after["t"] - before["t"])}

            def drain(max_s: float) -> float:
                return wait_idle(lambda: _health_s(f"http://{url}/health"), max_s, o.slo_ms / 1000.0)

            result = sweep(ctx, pool, deadline, "naive", observe, finish, drain)
    return {"status": "ok", "sweep": result.to_json(), "best_rps": result.best_rps, "load_processes": procs,
            "correctness": correctness, "protocol": "http (aiohttp)", "precision": "fp32", "padding": "none (each request at its own length)",
            "computed_per_useful": 1.0}


def run_bundle(ctx: Context, built: Built, model: ModelDef, deadline: float) -> dict[str, Any]:
    from tritonbundle.loadtests import metrics as tmetrics
    from tritonbundle.server import ServerOptions, TritonServer

    o = ctx.options
    procs = o.load_procs or max(1, min(8, (os.cpu_count() or 2) // 2 - 1))
    stats_dir = ctx.work / model.name / "stats"
    shutil.rmtree(stats_dir, ignore_errors=True)
    stats_dir.mkdir(parents=True)
    os.environ["TRITONBUNDLE_STATS_DIR"] = str(stats_dir)
    server = TritonServer(ServerOptions(
        built.repository, http_port=0, grpc_port=0, metrics_port=0, log_path=ctx.logs / f"tritonserver-{model.name}.log",
        exit_timeout_s=5,
        extra_args=["--allow-gpu-metrics=false", "--backend-config=python,shm-default-byte-size=16777216"],
    ))
    texts, expected = reference(ctx, built)
    t_start = time.monotonic()
    try:
        server.start(wait=False)
        assert server.process is not None
        _remember_pid(server.process.pid)
        server.wait_ready(timeout_s=min(300.0, max(30.0, deadline - time.monotonic())))
        startup_s = time.monotonic() - t_start
        LOG.info("    bundle: tritonserver ready in %.1f s (%s)", startup_s, server.installation.description if server.installation else "")
        info = read_stats_info(stats_dir)
        from tritonbundle.clients import GrpcClient

        with GrpcClient(server.grpc_url, model=model.name, timeout_s=60.0) as client:
            correctness = check_answers("the bundle", client.embed(texts), expected)
        assert server.process is not None
        with LoadPool(procs, ctx.logs, f"bundle-{model.name}") as pool:
            pool.setup(kind="grpc", url=server.grpc_url, model=model.name, traffic=str(ctx.traffic_path), seed=o.seed,
                       timeout_s=client_timeout_s(o), ready_timeout_s=_setup_timeout(deadline))
            meter = probes.CpuMeter({"server": server.process.pid, **{f"load{i}": p for i, p in enumerate(pool.pids)}})

            def observe() -> dict[str, Any]:
                time.sleep(0.3)  # let the encoder's statistics file catch up (written every 0.25 s)
                try:
                    sample = tmetrics.scrape(server.metrics_url)
                except OSError:
                    sample = {}
                return {"metrics": sample, "stats": read_stats(stats_dir), "cpu": meter.read(), "t": time.monotonic()}

            def finish(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
                views = {v.model: v.to_json() for v in tmetrics.view(before["metrics"], after["metrics"])}
                return {
                    "triton": views, "encoder": _delta(before["stats"], after["stats"]),
                    "cpu_cores": probes.CpuMeter.delta(before["cpu"], after["cpu"], after["t"] - before["t"]),
                }

            def drain(max_s: float) -> float:
                return wait_idle(lambda: pending_requests(server.metrics_url), max_s, 0.0)

            result = sweep(ctx, pool, deadline, "bundle", observe, finish, drain)
    finally:
        server.stop(timeout_s=20)
        if server.process is not None:
            _forget_pid(server.process.pid)
        os.environ.pop("TRITONBUNDLE_STATS_DIR", None)
    ref_step = result.best or (max(result.steps, key=lambda s: s.offered_rps) if result.steps else None)
    padding = st.tokens_ratio(ref_step.extra.get("encoder", {})) if ref_step else {}
    return {
        "status": "ok", "sweep": result.to_json(), "best_rps": result.best_rps, "load_processes": procs,
        "startup_s": round(startup_s, 1), "correctness": correctness, "protocol": "grpc (tritonbundle.clients.AsyncGrpcClient)",
        "precision": o.precision, "encoder_instances": info, "padding": padding,
        "computed_per_useful": padding.get("computed_per_useful"),
        "seq_padded_per_useful": padding.get("seq_padded_per_useful"),
        "breakdown": breakdown(model, ref_step, o) if ref_step else None,
    }


def breakdown(model: ModelDef, s: st.StepResult, options: BenchOptions) -> dict[str, Any]:
    """Where a request's time goes at one load level (the best passing one, else the highest tried)."""
    views = s.extra.get("triton", {})
    enc = s.extra.get("encoder", {})
    ens = views.get(model.name, {})
    out: dict[str, Any] = {
        "at_offered_rps": s.offered_rps, "achieved_rps": s.achieved_rps, "client_mean_ms": s.mean_ms,
        "client_p99_ms": s.p99_ms, "client_lag_mean_ms": s.extra.get("client_lag_mean_ms"),
        "ensemble_request_ms": ens.get("request_ms_per_request"),
    }
    if ens.get("request_ms_per_request") is not None and math.isfinite(s.mean_ms):
        out["client_grpc_ms"] = s.mean_ms - ens["request_ms_per_request"]
    for role, name in (("tokenizer", f"{model.name}_tokenizer"), ("encoder", f"{model.name}_encoder")):
        v = views.get(name)
        if v:
            out[role] = {k: v[k] for k in ("queue_ms_per_request", "compute_ms_per_request", "request_ms_per_request",
                                           "avg_batch_size", "executions")}
    executes = enc.get("executes", 0) or 0
    requests = enc.get("requests", 0) or 0
    if executes:
        phases = ("t_read_s", "t_plan_s", "t_fill_s", "t_launch_s", "t_wait_s", "t_respond_s", "t_execute_s", "gpu_s")
        out["encoder_execute_ms"] = {k.removeprefix("t_").removesuffix("_s"): 1000.0 * enc.get(k, 0.0) / executes for k in phases}
        out["encoder_rows_per_execute"] = enc.get("rows", 0) / executes
        out["encoder_launches_per_execute"] = enc.get("launches", 0) / executes
        if requests:
            out["encoder_execute_ms_per_request"] = 1000.0 * enc.get("t_execute_s", 0.0) / requests
    out["padding"] = st.tokens_ratio(enc)
    out["cpu_cores"] = s.extra.get("cpu_cores", {})
    out["gpu_util_mean"] = s.extra.get("gpu_util_mean")
    out["hints"] = hints(out, options)
    return out


def hints(b: dict[str, Any], options: BenchOptions) -> list[str]:
    """Plain-language reading of a breakdown."""
    out = []
    for role, cores in sorted((b.get("cpu_cores") or {}).items(), key=lambda kv: -kv[1]):
        if "stub[" in role and cores >= 0.85:
            out.append(f"{role.split(':', 1)[1]} used {cores:.0%} of one core: that single-threaded Python-backend "
                       "instance is saturated (a bottleneck; more instances or less Python per request would help)")
    loads = [c for r, c in (b.get("cpu_cores") or {}).items() if r.startswith("load")]
    if loads and max(loads) >= 0.9:
        out.append(f"a load generator process used {max(loads):.0%} of a core: the client side may limit the rate")
    lag = b.get("client_lag_mean_ms")
    if lag is not None and lag > 2.0:
        out.append(f"the load generators sent {lag:.1f} ms late on average: client-bound at this rate")
    gpu = b.get("gpu_util_mean")
    if gpu is not None and gpu < 50:
        out.append(f"GPU busy only {gpu:.0f}% of the time: the limit is on the CPU side (server, Python, client), not kernels")
    pad = (b.get("padding") or {}).get("computed_per_useful")
    seq = (b.get("padding") or {}).get("seq_padded_per_useful")
    if pad is not None and pad > 1.15:
        if seq is not None and pad > 1.01 * seq:
            out.append(f"computed/useful tokens {pad:.2f}, of which sequence padding {seq:.2f}: the rest is empty rows "
                       "padding batches up to their bucket and length groups merged into one launch (fewer launches)")
        else:
            out.append(f"computed/useful tokens {pad:.2f}: sequence padding to the plan's targets (more sequence "
                       "buckets would lower it)")
    enc = b.get("encoder") or {}
    if enc and enc.get("queue_ms_per_request", 0) > options.slo_ms / 2:
        out.append(f"requests wait {enc['queue_ms_per_request']:.1f} ms in the encoder's queue, more than half the SLO")
    elif enc and enc.get("queue_ms_per_request", 0) > enc.get("compute_ms_per_request", 0) > 0:
        out.append("requests wait longer in the encoder's queue than they compute: the encoder instance(s) are the "
                   "bottleneck at this rate")
    return out


def time_eager(engine: Any, batches: tuple[int, ...], targets: list[int], deadline: float) -> dict[tuple[int, int], float]:
    """Seconds per eager launch at each (batch, target), second of two runs (the first warms up)."""
    import numpy as np

    timings: dict[tuple[int, int], float] = {}
    for b in batches:
        for s in targets:
            if time.monotonic() > deadline:
                return timings
            ids = np.full((b, s), 1000, dtype=np.int64)
            rows, masks, lengths = list(ids), list(np.ones_like(ids)), np.full(b, s)
            engine.embed(rows, masks, lengths)
            start = time.perf_counter()
            engine.embed(rows, masks, lengths)  # returns host arrays: the device work is finished
            timings[(b, s)] = time.perf_counter() - start
    return timings


def run_ceiling(ctx: Context, built: Built, model: ModelDef, deadline: float) -> dict[str, Any]:
    from tritonbundle.triton_models.pytorch_encoder import Engine

    o = ctx.options
    targets = list(built.plan.padding_targets)
    lengths = ctx.sample.clipped(512).row_lengths()
    shares = st.bucket_shares(lengths, targets)
    mean_tokens = float(lengths.mean())
    t0 = time.monotonic()
    fixed: dict[tuple[int, int], float] = {}
    if o.device == "cuda":
        engine = Engine(built.version_dir, device="cuda", precision=o.precision, targets=targets,
                        batch_buckets=o.ceiling_batches, cuda_graphs=True).prepare()
        w0 = time.monotonic()
        if engine.use_graphs:
            timings = engine.time_shapes(reps=5)
            near = min(targets, key=lambda t: abs(t - 128))
            fixed_batch = max((b for b in o.ceiling_batches if b <= 128), default=0)
            if (fixed_batch, near) in engine.graphs:
                fixed = engine.time_shapes(reps=20, shapes=[(fixed_batch, near)])
        else:  # capture failed: an eager ceiling, labelled as such, rather than none
            LOG.warning("    ceiling: CUDA graph capture failed (%s); timing eager launches", engine.graph_error)
            timings = time_eager(engine, o.ceiling_batches, targets, deadline)
        w1 = time.monotonic()
    else:
        engine = Engine(built.version_dir, device="cpu", precision="fp32", targets=targets, cuda_graphs=False).prepare()
        w0 = time.monotonic()
        timings = time_eager(engine, o.ceiling_batches, targets, deadline)
        w1 = time.monotonic()
    result = st.ceiling(timings, shares, mean_tokens, o.slo_ms / 1000.0)
    gpu = ctx.gpu.window(w0, w1) if ctx.gpu is not None else {}
    describe = engine.describe()
    mode = "cuda graphs" if describe["cuda_graphs"] else ("eager (graph capture failed)" if describe["graph_error"] else "eager")
    del engine
    gc.collect()
    if o.device == "cuda":
        with contextlib.suppress(Exception):
            import torch

            torch.cuda.empty_cache()
    out = {
        "status": "ok", "best_rps": result["best_rps"], "best": result["best"], "per_batch": result["per_batch"],
        "mean_tokens": mean_tokens, "shares": {str(k): v for k, v in shares.items()},
        "timings_ms": {f"{b}x{s}": round(t * 1000.0, 4) for (b, s), t in sorted(timings.items())},
        "computed_per_useful": sum(share * s for s, share in shares.items()) / mean_tokens,
        "engine": describe, "mode": mode, "seconds": round(time.monotonic() - t0, 1), **gpu,
    }
    if fixed:
        (b, s), t = next(iter(fixed.items()))
        out["fixed_shape"] = {"batch": b, "length": s, "ms": t * 1000.0, "tokens_per_s": b * s / t}
    return out


PHASES: dict[str, Callable[[Context, Built, ModelDef, float], dict[str, Any]]] = {
    "naive": run_naive, "bundle": run_bundle, "ceiling": run_ceiling,
}


# -- the run ------------------------------------------------------------------------------------------------
def run_bench(options: BenchOptions) -> dict[str, Any]:
    from tritonbundle.bench import report

    clock = Clock(options.budget_s)
    prepare_process_env()
    if threading_main():
        # SIGTERM (a timeout, the device tool) ends the run through the finally blocks: servers stopped,
        # report written.
        signal.signal(signal.SIGTERM, _terminate)
    options.out.mkdir(parents=True, exist_ok=True)
    work = options.work or Path(tempfile.mkdtemp(prefix="tritonbundle-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    result: dict[str, Any] = {
        "command": "tritonbundle " + " ".join(sys.argv[1:]), "options": _options_json(options), "environment": probes.environment(options.device),
        "models": {}, "status": "running",
    }

    def save() -> None:
        """After every phase: what is known so far survives a run cut short."""
        result["elapsed_s"] = round(clock.elapsed(), 1)
        report.write_json(result, options.out / "bench.json")
        with contextlib.suppress(Exception):
            (options.out / "bench.md").write_text(report.markdown(result))

    gpu = probes.GpuSampler().start() if options.device == "cuda" else None
    if gpu is not None:
        result["environment"]["gpu_sampler"] = gpu.source
    try:
        step("traffic")
        if options.traffic:
            sample = traffic_mod.load(options.traffic)
        else:
            sample = traffic_mod.synthetic("chat", n=10_000, seed=options.seed)
        traffic_path = traffic_mod.dump(sample, work / "traffic.jsonl")
        result["traffic"] = {"source": sample.source, **sample.clipped(512).summary()}
        tokenizer = tokenizer_file()
        ctx = Context(options, clock, work, logs, traffic_path, sample, tokenizer, gpu, save)
        save()
        reserve = 15.0
        for index, key in enumerate(options.models):
            model = MODELS[key]
            entry: dict[str, Any] = {"description": model.description, "recipe": model.recipe,
                                     "random_weights": model.random_weights, "systems": {}}
            result["models"][model.name] = entry
            models_left = len(options.models) - index
            model_deadline = time.monotonic() + max(10.0, (clock.left() - reserve) / models_left)
            step(f"{model.name}: build the repository ({options.target}, pytorch, {options.precision})")
            try:
                t0 = time.monotonic()
                built = build_repository(model, options, work, traffic_path, tokenizer)
                if {"naive", "bundle"} & set(options.systems):
                    reference(ctx, built)  # the FP32 answers both servers are checked against
                entry["build"] = {
                    "status": "ok", "seconds": round(time.monotonic() - t0, 1), "repository": str(built.repository),
                    "padding_targets": list(built.plan.padding_targets),
                    "batch_buckets": [b.max for b in built.plan.batch_buckets],
                    "plan_computed_per_useful": built.plan.waste.bucketed if built.plan.waste else None,
                }
            except Exception as e:  # noqa: BLE001 - recorded; the other model still runs
                entry["build"] = _failure(e)
                for system in options.systems:
                    entry["systems"][system] = {"status": "failed", "error": "the repository could not be built"}
                save()
                continue
            save()
            shares = {s: options.shares[s] for s in options.systems}
            for position, system in enumerate(options.systems):
                left_share = sum(list(shares.values())[position:])
                phase_s = max(5.0, (model_deadline - time.monotonic()) * shares[system] / left_share)
                phase_deadline = min(time.monotonic() + phase_s, clock.deadline - 5.0)
                step(f"{model.name}: {system} ({phase_s:.0f} s)")
                if time.monotonic() + 5.0 > phase_deadline:
                    entry["systems"][system] = {"status": "skipped", "error": "out of time budget"}
                    continue
                t0 = time.monotonic()
                try:
                    entry["systems"][system] = PHASES[system](ctx, built, model, phase_deadline)
                except Exception as e:  # noqa: BLE001 - recorded as failed; the run goes on
                    LOG.warning("    %s %s failed: %s", model.name, system, e)
                    entry["systems"][system] = _failure(e)
                entry["systems"][system]["seconds"] = round(time.monotonic() - t0, 1)
                save()
            entry["ratios"] = ratios(entry)
            save()
        result["status"] = "done"
    except Exception as e:  # noqa: BLE001 - still write what was measured
        result["status"] = "failed"
        result["error"] = _failure(e)
    finally:
        if gpu is not None:
            gpu.stop()
        if result["status"] == "running":  # SIGTERM or Ctrl-C: what was measured is still written
            result["status"] = "interrupted"
        result["elapsed_s"] = round(clock.elapsed(), 1)
        try:
            report.write_all(result, options.out, work)
        finally:
            if not options.keep_work and options.work is None:
                shutil.rmtree(work, ignore_errors=True)
    return result


def threading_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _terminate(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def ratios(entry: dict[str, Any]) -> dict[str, Any]:
    systems = entry.get("systems", {})

    def best(name: str) -> float | None:
        s = systems.get(name, {})
        return s.get("best_rps") if s.get("status") == "ok" else None

    bundle = systems.get("bundle", {})
    out = {
        "bundle_over_naive": st.ratio(best("bundle"), best("naive")),
        "bundle_over_ceiling": st.ratio(best("bundle"), best("ceiling")),
        "computed_per_useful": bundle.get("computed_per_useful"),
        "seq_padded_per_useful": bundle.get("seq_padded_per_useful"),
    }
    out["targets"] = {
        "bundle_over_naive >= 8": None if out["bundle_over_naive"] is None else out["bundle_over_naive"] >= 8,
        "bundle_over_ceiling >= 0.75": None if out["bundle_over_ceiling"] is None else out["bundle_over_ceiling"] >= 0.75,
        "computed_per_useful <= 1.15": None if out["computed_per_useful"] is None else out["computed_per_useful"] <= 1.15,
    }
    return out


def _failure(e: BaseException) -> dict[str, Any]:
    return {"status": "failed", "error": f"{type(e).__name__}: {e}"[:2000],
            "traceback": "".join(traceback.format_exception(e))[-4000:]}


def _options_json(options: BenchOptions) -> dict[str, Any]:
    data = dataclasses.asdict(options)
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in data.items()}
