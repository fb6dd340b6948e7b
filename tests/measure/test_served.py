"""The measured system on the real server: a tritonserver that crashes during a load level is restarted
on the same ports, the level fails naming the crash, and the search goes on (bench and tune alike)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tritonbundle.measure.latency import Slo
from tritonbundle.measure.levels import Ladder, Timing
from tritonbundle.measure.loadgen import LoadPool
from tritonbundle.served import ServedRepository

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

TRAFFIC = Path(__file__).resolve().parents[2] / "build" / "traffic" / "chat.jsonl"


def test_a_server_that_crashes_during_a_level_is_restarted_and_measured_again(repository: Path, tmp_path: Path) -> None:
    with ServedRepository(repository, tmp_path / "served") as served, LoadPool(1, tmp_path, "crash") as pool:
        served.start(timeout_s=180)
        served.connect(pool, model="minilm", traffic=TRAFFIC, seed=0, timeout_s=5.0, ready_timeout_s=120)
        assert served.server.process is not None
        first = served.server.process.pid
        ports = (served.server.options.grpc_port, served.server.options.metrics_port)
        # SIGSEGV as Triton 2.51's gRPC frontend gets it under cancellations: its handler logs
        # "Signal (11) received." and the process exits.
        killer = threading.Timer(1.5, os.kill, (first, signal.SIGSEGV))
        killer.start()
        try:
            result = served.measure(system="bundle", slo=Slo(p99_ms=2000.0, max_failure_ratio=0.5),
                                    timing=Timing(warmup_s=0.5, window_s=2.0, grace_s=2.0),
                                    ladder=Ladder(start=4.0, factor=2.0, refine=0, max_rate=8.0),
                                    deadline=time.monotonic() + 300, seed=0)
        finally:
            killer.cancel()
        assert served.server.process is not None
        second = served.server.process.pid
    crashed = result.steps[0]
    assert not crashed.passed and "went down" in crashed.reason and "-11" in crashed.reason, crashed.reason
    assert crashed.extra["restart_s"] > 0
    assert second != first and (served.server.options.grpc_port, served.server.options.metrics_port) == ports
    later = result.steps[1:]
    assert later and all(s.extra.get("down") is None for s in later)
    assert any(s.passed and s.completed > 0 for s in later), [(s.offered_rps, s.reason) for s in later]
    # the restarted server's CPU is metered (the probes read the new process, not the dead one's pid)
    # (at 4 req/s tritonserver's own share rounds to 0.0: its process tree, stubs included, is what is read)
    assert all(any(k.startswith("server:stub[") for k in s.extra["cpu_cores"]) for s in later), \
        [s.extra["cpu_cores"] for s in later]


STALLING_MODEL = '''
import threading
import numpy as np
import triton_python_backend_utils as pb_utils

from tritonbundle.runtimes.stacks import dump_stacks_on_signal


class TritonPythonModel:
    def initialize(self, args):
        dump_stacks_on_signal()

    def execute(self, requests):
        texts = [pb_utils.get_input_tensor_by_name(r, "TEXT").as_numpy() for r in requests]
        if any(b"stall" in t.reshape(-1) for t in texts):
            threading.Event().wait()  # never returns: the instance is stuck, the server still up
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUT", np.ones(t.shape, np.float32))])
                for t in texts]
'''


@pytest.mark.parametrize("queue", ["unbounded", "full"])
def test_a_server_whose_model_stops_answering_is_down_with_every_stubs_stack(tmp_path: Path, queue: str) -> None:
    """Up (process alive, metrics answering) but its model stuck: the level's probe calls it down, and
    the stub's threads' stacks are in the server log, the stuck ``execute`` among them. With a bounded
    queue that the stuck model leaves full, the probe's request is refused at once, not timed out."""
    import sys

    import numpy as np

    from tritonbundle.clients import ClientError, connect
    from tritonbundle.modelconfig import (
        DynamicBatching,
        InstanceGroup,
        ModelConfig,
        QueuePolicy,
        TensorSpec,
        write_config,
    )

    repo = tmp_path / "repo"
    version = repo / "stall" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(STALLING_MODEL)
    (version / "tritonbundle" / "runtimes").mkdir(parents=True)  # vendored as the build does
    for package in (version / "tritonbundle", version / "tritonbundle" / "runtimes"):
        (package / "__init__.py").write_text("")
    source = Path(sys.modules["tritonbundle"].__file__ or "").parent / "runtimes" / "stacks.py"
    (version / "tritonbundle" / "runtimes" / "stacks.py").write_text(source.read_text())
    batched = queue == "full"
    write_config(ModelConfig(name="stall", backend="python", max_batch_size=4 if batched else 0,
                             inputs=(TensorSpec("TEXT", "STRING", (1,)),), outputs=(TensorSpec("OUT", "FP32", (1,)),),
                             instance_groups=(InstanceGroup(1, "KIND_CPU"),),
                             dynamic_batching=DynamicBatching(queue_policy=QueuePolicy(max_queue_size=1)) if batched else None),
                 repo / "stall")

    def call(text: bytes, client: Any) -> None:
        with contextlib.suppress(ClientError):
            client.infer({"TEXT": np.array([[text]] if batched else [text], dtype=object)}, model="stall", timeout_s=20)

    with ServedRepository(repo, tmp_path / "served") as served:
        served.start(timeout_s=120)
        served.model, served.stall_s = "stall", 3.0
        with connect(served.grpc_url, protocol="grpc", model="stall", timeout_s=20) as client:
            call(b"ok", client)
            assert served.down_reason() == ""
            threading.Thread(target=call, args=(b"stall", client), daemon=True).start()
            time.sleep(1.0)
            if batched:  # one more waits behind the stuck one: the queue is full
                threading.Thread(target=call, args=(b"ok", client), daemon=True).start()
                time.sleep(0.5)
            why = served.down_reason()
        log = served.server.start_log() or ""
    assert "hung" in why and "1 Python stub(s) wrote every thread's stack" in why, why
    assert ("(the model is stuck)" in why) == batched, why  # a full queue refuses at once: no timeout
    assert "most recent call first" in log and "in execute" in log, log[-2000:]
    assert re.search(r"== the stacks of Python stub \d+ \(stall_0_0\):\n.*most recent call first", log, re.S), log[-2000:]


def test_the_launch_times_tune_reads_are_each_shapes_fastest_over_the_instances() -> None:
    """Four instances' figures as an H200 server reported them when they timed at once (64 x 512: one
    undisturbed, the others stretched by each other's kernels): tune must see the GPU's 21 ms, not 90."""
    from tritonbundle.served import fastest_launch_ms

    instances = [{"timings_ms": {"1x22": 0.65, "64x512": 56.1}}, {"timings_ms": {"1x22": 1.01, "64x512": 21.4}},
                 {"timings_ms": {"1x22": 2.53, "64x512": 89.7}}, {"timings_ms": {}}, {"model": "no timings"}]
    assert fastest_launch_ms(instances) == {"1x22": 0.65, "64x512": 21.4}
    assert fastest_launch_ms([{"timings_ms": {}}]) is None and fastest_launch_ms([]) is None
