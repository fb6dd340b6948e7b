"""The bundle: the real ``tritonserver`` serving the repository the build stage writes (tokenizer +
encoder + ensemble, dynamic batching, padding targets, CUDA graphs), driven over gRPC from several load
generator processes with the requests ``AsyncGrpcClient`` builds (sent as bytes built once,
:mod:`tritonbundle.measure.wire`): texts to the ensemble, or with ``--input tokens`` token rows to the
encoder (what a client that tokenizes on its side sends; the tokenizer stage drops out)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from tritonbundle.bench.accounting import tokens_ratio
from tritonbundle.bench.answers import check_answers, check_answers_at_once, references
from tritonbundle.bench.breakdown import breakdown
from tritonbundle.bench.options import client_timeout_s, setup_timeout_s
from tritonbundle.bench.phase import Context, NoRate, sweep
from tritonbundle.bench.records import AnswersCheck, BundleResult, Restart
from tritonbundle.bench.workspace import SERVER_ARGS, Built, load_procs
from tritonbundle.errors import ServerError
from tritonbundle.measure.levels import SystemDown
from tritonbundle.measure.loadgen import LoadPool
from tritonbundle.recipes import Recipe
from tritonbundle.served import ServedRepository

#: The answers checks' deadline per request (before the levels: also bounded by the phase's time left):
#: long enough for a cold first batch.
FIRST_ANSWER_S = 60.0


def run_bundle(ctx: Context, built: Built, recipe: Recipe, deadline: float) -> BundleResult:
    o = ctx.options
    name = recipe.model_name
    procs = load_procs(o.load_procs)
    texts, expected = references(ctx, built)
    with ServedRepository(built.repository, ctx.work / name, extra_args=SERVER_ARGS,
                          log_path=ctx.logs / f"tritonserver-{name}.log") as served:
        startup_s = served.start(timeout_s=min(300.0, max(30.0, deadline - time.monotonic())))
        info = served.instances()
        correctness, at_once = first_answers(served, name, texts, expected, deadline)
        with LoadPool(procs, ctx.logs, f"bundle-{name}") as pool:
            served.connect(pool, model=name, traffic=ctx.traffic_path, seed=o.seed, timeout_s=client_timeout_s(o),
                           ready_timeout_s=setup_timeout_s(deadline),
                           requests="tokens" if o.input == "tokens" else "auto")
            down = False
            try:
                result, failed = sweep(ctx, pool, deadline, "bundle", served.probes()), None
            except (NoRate, SystemDown) as e:  # failed, but its levels, start-up and instances are still worth reporting
                result, failed, down = e.sweep, str(e), isinstance(e, SystemDown)
        from tritonbundle.clients import GrpcClient

        after = None
        if not down:  # a server gone for good has nothing to check, and its crash is the report's error
            with GrpcClient(served.grpc_url, model=name, timeout_s=FIRST_ANSWER_S) as client:  # after the levels: still right?
                after = check_answers_at_once("the bundle after the sweep", client.embed, texts, expected)
    correctness = dataclasses.replace(correctness, at_once=at_once, after_sweep=after)
    ref_step = result.best or (max(result.steps, key=lambda s: s.offered_rps) if result.steps else None)
    padding = tokens_ratio(ref_step.extra.get("encoder", {})) if ref_step else {}
    return BundleResult(
        status="failed" if failed else "ok", error=failed, sweep=result, best_rps=result.best_rps, load_processes=procs, startup_s=round(startup_s, 1),
        correctness=correctness, protocol=_protocol(), input=o.input,
        precision=o.precision, encoder_instances=info, padding=padding,
        computed_per_useful=padding.get("computed_per_useful"), seq_padded_per_useful=padding.get("seq_padded_per_useful"),
        breakdown=breakdown(recipe, ref_step, o, batch_caps(built.repository)) if ref_step else None,
        mps_servers=served.mps_servers,
        # Levels during which tritonserver went down (it was restarted; they count as failed).
        went_down=[Restart(s.offered_rps, s.extra["down"], s.extra.get("restart_s"))
                   for s in result.steps if s.extra.get("down")],
    )


def batch_caps(repository: Path) -> dict[str, int]:
    """Each model's ``max_batch_size`` in the served repository's ``config.pbtxt`` files."""
    from tritonbundle.modelconfig import read_config

    return {path.parent.name: int(read_config(path).max_batch_size) for path in sorted(repository.glob("*/config.pbtxt"))}


def _protocol() -> str:
    """What the load generators speak: gRPC, or HTTP (``TRITONBUNDLE_LOAD_SENDER=http``, measure/wire.py)."""
    from tritonbundle.measure.wire import sender

    return "http (tritonbundle.clients.AsyncHttpClient's requests)" if sender() == "http" else \
        "grpc (tritonbundle.clients.AsyncGrpcClient)"


def first_answers(served: ServedRepository, name: str, texts: list[str], expected: Any,
                  deadline: float) -> tuple[AnswersCheck, AnswersCheck]:
    """The bundle's answers, one request then many at once, against the reference, before any load. A
    request that gets no answer within the phase's time (at most :data:`FIRST_ANSWER_S`, at least 30 s)
    fails the phase with every Python stub's stacks in the server log, where the failed phase's console
    shows them (bench/run.py): on the H200 a model that never answered left only "Deadline Exceeded"."""
    from tritonbundle.clients import ClientError, GrpcClient

    timeout_s = min(FIRST_ANSWER_S, max(30.0, deadline - time.monotonic() - 10.0))
    try:
        with GrpcClient(served.grpc_url, model=name, timeout_s=timeout_s) as client:
            return (check_answers("the bundle", client.embed(texts), expected),
                    check_answers_at_once("the bundle", client.embed, texts, expected))
    except ClientError as e:
        raise ServerError(f"the bundle's first answers: {e} ({served.write_stacks()})") from e
