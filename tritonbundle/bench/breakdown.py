"""Where a request's time goes at one load level, and a plain-language reading of it."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from tritonbundle import contract
from tritonbundle.bench.accounting import tokens_ratio
from tritonbundle.bench.options import BenchOptions
from tritonbundle.bench.records import Breakdown, InstanceCycle
from tritonbundle.measure.latency import Slo, StepResult, client_lag_limit_ms
from tritonbundle.measure.levels import sending_s
from tritonbundle.measure.probes import CLOCK_KEYS
from tritonbundle.recipes import Recipe
from tritonbundle.runtimes.stats import HISTOGRAMS, quantile_ms


def encoder_model(name: str, *, tokenizer_served: bool) -> str:
    """The model that encodes for the served model ``name``: ``<name>_encoder`` behind a tokenizer model,
    else ``name`` itself (tokenize_in_encoder: one model tokenizes and encodes)."""
    return contract.encoder_name(name) if tokenizer_served else name


def call_quantiles(enc: dict[str, float]) -> dict[str, dict[str, float | None]]:
    """p50 and p99 of each per-call histogram of the encoder's statistics (:data:`HISTOGRAMS`: the call,
    its GPU time, each execute() phase), up to the bucket's edge; None where it counted nothing."""
    return {name: {f"p{round(100 * q)}": quantile_ms(enc, name, q) for q in (0.5, 0.99)} for name in HISTOGRAMS}


def breakdown(recipe: Recipe, s: StepResult, options: BenchOptions, batch_caps: dict[str, int] | None = None,
              ) -> Breakdown:
    """The bundle's breakdown at one load level (the best passing one, else the highest tried);
    ``batch_caps``: each served model's ``max_batch_size``."""
    views = s.extra.get("triton", {})
    enc = s.extra.get("encoder", {})
    name = recipe.model_name
    ens = views.get(name, {})
    ensemble_ms = ens.get("request_ms_per_request")
    encoder = encoder_model(name, tokenizer_served=contract.tokenizer_name(name) in views or name not in views)
    roles: dict[str, dict[str, Any]] = {}
    for role, model in (("tokenizer", contract.tokenizer_name(name)), ("encoder", encoder)):
        v = views.get(model)
        if v:
            roles[role] = {k: v[k] for k in ("queue_ms_per_request", "compute_ms_per_request", "request_ms_per_request",
                                             "compute_input_ms_per_request", "compute_output_ms_per_request",
                                             "avg_batch_size", "executions") if k in v}  # the compute parts: since 2026-12-05
    executes = enc.get("executes", 0) or 0
    requests = enc.get("requests", 0) or 0
    per_execute: dict[str, Any] = {}
    if executes:
        # tokenize: the encoder's own tokenizer calls (tokenize_in_encoder), apart from read since 2026-12-04
        phases = ("t_read_s", *(("t_tokenize_s",) if enc.get("t_tokenize_s") else ()), "t_plan_s", "t_fill_s",
                  "t_launch_s", "t_wait_s", "t_respond_s", "t_execute_s", "gpu_s")
        per_execute = {
            "encoder_execute_ms": {k.removeprefix("t_").removesuffix("_s"): 1000.0 * enc.get(k, 0.0) / executes
                                   for k in phases},
            "encoder_rows_per_execute": enc.get("rows", 0) / executes,
            "encoder_launches_per_execute": enc.get("launches", 0) / executes,
            "encoder_execute_ms_per_request": 1000.0 * enc.get("t_execute_s", 0.0) / requests if requests else None,
            "encoder_call_ms": call_quantiles(enc),
        }
    tok = s.extra.get("tokenizer", {})
    calls = tok.get("executes", 0) or 0
    if calls:
        per_execute.update(
            tokenizer_execute_ms={k.removeprefix("t_").removesuffix("_s"): 1000.0 * tok.get(k, 0.0) / calls
                                  for k in ("t_read_s", "t_tokenize_s", "t_respond_s", "t_execute_s")},
            tokenizer_texts_per_execute=tok.get("texts", 0) / calls,
            tokenizer_call_ms={"execute_ms": {f"p{round(100 * q)}": quantile_ms(tok, "execute_ms", q) for q in (0.5, 0.99)}},
            tokenizer_outside_ms=_outside_ms(roles.get("tokenizer"), tok),
        )
    busy, alone = gpu_per_row(enc, s.extra.get("gpu_util_mean"), sending_s(s))
    out = Breakdown(
        at_offered_rps=s.offered_rps, achieved_rps=s.achieved_rps, client_mean_ms=s.mean_ms, client_p99_ms=s.p99_ms,
        client_lag_mean_ms=s.extra.get("client_lag_mean_ms"), ensemble_request_ms=ensemble_ms,
        client_lag_p99_ms=s.extra.get("client_lag_p99_ms"), client_loop_lag_p99_ms=s.extra.get("client_loop_lag_p99_ms"),
        client_p99_from_send_ms=s.extra.get("p99_from_send_ms"),
        client_grpc_ms=s.mean_ms - ensemble_ms if ensemble_ms is not None and math.isfinite(s.mean_ms) else None,
        tokenizer=roles.get("tokenizer"), encoder=roles.get("encoder"), **per_execute, padding=tokens_ratio(enc),
        encoder_cycle=instance_cycle(roles.get("encoder"), (s.extra.get("cpu_processes") or {}).get(f"server:stub[{encoder}]"),
                                     (batch_caps or {}).get(encoder), wall_s=s.extra.get("step_wall_s")),
        cpu_cores=s.extra.get("cpu_cores", {}), cpu_processes=s.extra.get("cpu_processes", {}),
        cpu_threads=s.extra.get("cpu_threads"),
        gpu_util_mean=s.extra.get("gpu_util_mean"), gpu_clocks=_clocks(s.extra),
        gpu_busy_ms_per_row=busy, gpu_alone_ms_per_row=alone,
    )
    return dataclasses.replace(out, hints=hints(out, options))


def gpu_per_row(enc: dict[str, float], util: float | None, sent_s: float) -> tuple[float | None, float | None]:
    """The GPU's busy time per row the encoder ran at one level (its utilisation over the ``sent_s``
    seconds the level sent the rows in: :func:`~tritonbundle.measure.levels.sending_s`), and the same
    launches' time alone (``gpu_alone_s``: each launch's shape timed at the engine's start-up), ms; None
    where the level lacks it."""
    rows = enc.get("rows") or 0
    busy = 1000.0 * util / 100.0 * sent_s / rows if rows and util is not None else None
    alone = 1000.0 * enc["gpu_alone_s"] / rows if rows and enc.get("gpu_alone_s") else None
    return busy, alone


def instance_cycle(view: dict[str, Any] | None, instances: int | None, batch_cap: int | None, *,
                   wall_s: float | None = None, achieved_rps: float | None = None) -> InstanceCycle | None:
    """How often each of a model's ``instances`` took a call at one level, from Triton's view of the model
    (its calls, average batch, request and queue times): its calls over the level's ``wall_s`` (the span
    Triton's counters cover), or without it the ``achieved_rps`` over its average batch. None when a
    figure is missing (a model served by a C++ backend has no stub processes to count)."""
    view = view or {}
    per_call = float(view.get("avg_batch_size") or 0.0)
    if wall_s and view.get("executions"):
        calls_per_s = float(view["executions"]) / wall_s
    elif achieved_rps and math.isfinite(achieved_rps) and per_call > 0:
        calls_per_s = achieved_rps / per_call
    else:
        return None
    if not instances or calls_per_s <= 0:
        return None
    request, queue = view.get("request_ms_per_request"), view.get("queue_ms_per_request")
    return InstanceCycle(instances=int(instances), requests_per_call=per_call, batch_cap=batch_cap,
                         cycle_ms=1000.0 * instances / calls_per_s,
                         busy_ms=float(request) - float(queue) if request is not None and queue is not None else None,
                         staging_ms=view.get("compute_input_ms_per_request"),
                         responding_ms=view.get("compute_output_ms_per_request"))


#: From these shares of the batch cap and of the cycle, the instances count as the limit.
FULL_CALLS, BUSY_INSTANCES = 0.85, 0.75
#: From this utilisation (%) the GPU counts as full; from this share of its busy time per row, the
#: launches' own cost (timed alone: the fastest replays, a floor) counts as all of it.
GPU_FULL, LAUNCHES_OWN = 85.0, 0.9


def hints(b: Breakdown, options: BenchOptions) -> list[str]:
    """Plain-language reading of a breakdown."""
    out = []
    processes = b.cpu_processes or {}
    for role, cores in sorted(b.cpu_cores.items(), key=lambda kv: -kv[1]):
        count = max(1, int(processes.get(role, 1)))
        if "stub[" in role and cores / count >= 0.85:
            each = f"{count} instances used {cores:.2f} cores, {cores / count:.0%} of one core each" if count > 1 \
                else f"used {cores:.0%} of one core"
            out.append(f"{role.split(':', 1)[1]}: {each}: a single-threaded Python-backend instance near 100 % is "
                       "saturated (a bottleneck; more instances or less Python per request would help)")
    server = [(name, cores) for name, cores in (b.cpu_threads or {}).get("server:tritonserver", []) if cores >= 0.85]
    if server:
        out.append(f"tritonserver's busiest thread ({server[0][0]}) used {server[0][1]:.0%} of a core: a saturated "
                   "thread in the server; it may be one of the 2 threads on which Triton 2.51's gRPC frontend "
                   "handles every ModelInfer (src/grpc/grpc_server.cc; --grpc-infer-thread-count from 2.58 on), "
                   "or a model instance's own thread in the server")
    loads = [c for r, c in b.cpu_cores.items() if r.startswith("load")]
    if loads and max(loads) >= 0.9:
        out.append(f"a load generator process used {max(loads):.0%} of a core: the client side may limit the rate")
    loop_lag = b.client_loop_lag_p99_ms
    # An idle loop wakes ~0.5-0.9 ms late at p99 (epoll's millisecond timeouts): 2 ms is past that.
    if loop_lag is not None and math.isfinite(b.client_p99_ms) and loop_lag >= max(2.0, 0.1 * b.client_p99_ms):
        out.append(f"the load generators' event loops woke {loop_lag:.1f} ms late at p99, against a p99 latency of "
                   f"{b.client_p99_ms:.1f} ms: the client side is part of the measured tail (more --load-procs "
                   "spread it)")
    lag, limit = b.client_lag_mean_ms, client_lag_limit_ms(Slo(p99_ms=options.slo_ms))
    if lag is not None and lag > limit:  # the gate's own limit (measure.latency.judge)
        out.append(f"the load generators sent {lag:.1f} ms late on average (limit {limit:g} ms): client-bound at "
                   "this rate")
    gpu = b.gpu_util_mean
    if gpu is not None and gpu < 50:
        out.append(f"GPU busy only {gpu:.0f}% of the time: the limit is on the CPU side (server, Python, client), not kernels")
    busy, alone = b.gpu_busy_ms_per_row, b.gpu_alone_ms_per_row
    if gpu is not None and gpu >= GPU_FULL and busy and alone:
        if alone >= LAUNCHES_OWN * busy:  # under MPS the instances' kernels overlap: alone may exceed busy
            out.append(f"the GPU is {gpu:.0f} % busy and its {busy:.4f} ms per row is what the launches cost alone "
                       f"({alone:.4f}): the launch mix holds the rate (fuller launches, less padding), not the "
                       "instances sharing the GPU")
        else:
            out.append(f"the GPU is {gpu:.0f} % busy, {busy:.4f} ms per row, where the same launches take "
                       f"{alone:.4f} alone: {1 - alone / busy:.0%} of its time is the instances sharing it "
                       "(fewer processes, or MPS, would move the knee)")
    pad = b.padding.get("computed_per_useful")
    seq = b.padding.get("seq_padded_per_useful")
    if pad is not None and pad > 1.15:
        if seq is not None and pad < seq:
            out.append(f"computed/useful tokens {pad:.2f} with texts packed into shared rows ({seq:.2f} padding each "
                       "text to its target): the rest is packed rows left part empty and empty rows padding batches "
                       "up to their bucket (finer batch buckets would lower it)")
        elif seq is not None and pad > 1.01 * seq:
            out.append(f"computed/useful tokens {pad:.2f}, of which sequence padding {seq:.2f}: the rest is empty rows "
                       "padding batches up to their bucket, packed rows left part empty, and length groups merged "
                       "into one launch (fewer launches)")
        else:
            out.append(f"computed/useful tokens {pad:.2f}: sequence padding to the plan's targets (more sequence "
                       "buckets would lower it)")
    outside = b.tokenizer_outside_ms
    if outside is not None and b.tokenizer_execute_ms and outside > b.tokenizer_execute_ms["execute"]:
        out.append(f"Triton counts {outside:.2f} ms per tokenizer request around its execute() (a call takes "
                   f"{b.tokenizer_execute_ms['execute']:.2f}): the Python backend "
                   "stub's work around the call costs more than the call; token rows from the client (--input tokens) "
                   "skip it")
    c = b.encoder_cycle
    if c and c.fill is not None and c.fill >= FULL_CALLS and (c.busy_share or 0.0) >= BUSY_INSTANCES:
        out.append(f"the encoder's calls are full ({c.requests_per_call:.1f} requests of its batch cap of "
                   f"{c.batch_cap}) and each of its {c.instances} instances is busy {c.busy_share:.0%} of its "
                   f"{c.cycle_ms:.1f}-ms cycle (one call at a time: the Python backend's thread in tritonserver "
                   f"waits for the stub's answer): at most ~{c.bound_rps:,.0f} req/s at this cycle; more "
                   "instances (while the cores and the GPU have room), a larger batch cap or a shorter call move it")
    if c and (gathered := _gathered_in_the_delay(c, options.encoder_queue_delay_us)):
        out.append(f"the queue delay sends the encoder's calls, not its batch cap: {c.requests_per_call:.1f} requests "
                   f"a call of the cap's {c.batch_cap} is what arrives in its {options.encoder_queue_delay_us / 1000:g} ms "
                   f"({gathered:.1f}), and the instances are idle part of the time. Triton's batcher sends a batch short "
                   "of the cap (the largest preferred size) once its oldest request has waited max_queue_delay, so "
                   "a larger cap alone makes no bigger calls; a longer delay does, at the latency's cost")
    enc = b.encoder or {}
    if enc and enc.get("queue_ms_per_request", 0) > options.slo_ms / 2:
        out.append(f"requests wait {enc['queue_ms_per_request']:.1f} ms in the encoder's queue, more than half the SLO")
    elif enc and enc.get("queue_ms_per_request", 0) > enc.get("compute_ms_per_request", 0) > 0:
        out.append("requests wait longer in the encoder's queue than they compute: the encoder instance(s) are the "
                   "bottleneck at this rate")
    return out



def _gathered_in_the_delay(c: InstanceCycle, delay_us: int) -> float | None:
    """The requests that reach the encoder in one queue delay, where its calls hold about that many and
    stay short of the cap while the instances have time to spare (the delay, not the cap or busy
    instances, sends them; with every instance busy a waiting batch grows past the delay); None otherwise."""
    if (not c.batch_cap or c.fill is None or c.fill >= FULL_CALLS or delay_us <= 0 or c.cycle_ms <= 0
            or c.requests_per_call <= 0 or c.busy_share is None or c.busy_share >= BUSY_INSTANCES):
        return None
    gathered = c.instances * c.requests_per_call / c.cycle_ms * delay_us / 1000
    return gathered if 0.8 <= c.requests_per_call / gathered <= 1.25 else None


def _clocks(extra: dict[str, Any]) -> dict[str, float | None] | None:
    """The level's SM clock, power and slowdown figures, when the sampler read any."""
    clocks = {k: extra.get(k) for k in CLOCK_KEYS}
    return clocks if any(v is not None for v in clocks.values()) else None


def _outside_ms(triton: dict[str, Any] | None, tok: dict[str, float]) -> float | None:
    """Triton's tokenizer compute per request beyond the model's own execute(): the stub's work around
    the call. The Python backend (python_be.cc, ``ProcessRequests``) starts a call's compute once the
    requests are in shared memory and ends it when the stub's answer arrives, so this is the stub
    turning the requests into Python objects, the responses into shared memory, and the messages both
    ways (the server's own copying is Triton's compute input / output, not counted here). Both
    figures count each call's time once per request it held, so their difference is exact, per request."""
    compute = (triton or {}).get("compute_ms_per_request")
    requests = tok.get("requests", 0)
    if compute is None or not requests or "t_execute_by_request_s" not in tok:
        return None
    return max(0.0, float(compute) - 1000.0 * tok["t_execute_by_request_s"] / requests)
