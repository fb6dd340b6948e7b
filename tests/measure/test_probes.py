"""The GPU sampler's summary of a level: utilisation, memory, SM clock, power and clock slowdowns
(the figures that say whether a slow level ran on a GPU that had slowed itself). This machine has no
GPU, so the samples are written in; the NVML reading itself runs on the device machine."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from pathlib import Path

import pytest

from tritonbundle.bench.records import Breakdown
from tritonbundle.bench.report import _clocks
from tritonbundle.measure.probes import GPU_KEYS, CpuMeter, GpuSample, GpuSampler, parse_stat, thread_times


def test_a_window_summarises_the_samples_inside_it() -> None:
    sampler = GpuSampler()
    sampler.samples = [GpuSample(0.5, 99, 9000, 1980, 700, True),  # before the window
                       GpuSample(1.0, 60, 1000, 1980, 500, False), GpuSample(1.1, 80, 1200, 1755, 600, True),
                       GpuSample(1.2, 70, 1100, None, None, None)]
    w = sampler.window(1.0, 2.0)
    assert set(w) == set(GPU_KEYS)
    assert w["gpu_util_mean"] == pytest.approx(70) and w["gpu_util_max"] == 80 and w["gpu_mem_max_mib"] == 1200
    assert w["gpu_samples"] == 3
    assert w["gpu_sm_mhz_mean"] == pytest.approx(1867.5) and w["gpu_sm_mhz_min"] == 1755
    assert w["gpu_power_w_mean"] == pytest.approx(550) and w["gpu_slowed_share"] == pytest.approx(0.5)


def test_an_empty_window_says_nothing_was_sampled() -> None:
    w = GpuSampler().window(0, 1)
    assert w["gpu_samples"] == 0 and all(w[k] is None for k in GPU_KEYS if k != "gpu_samples")


def test_nvidia_smi_lines_with_and_without_clocks(monkeypatch: pytest.MonkeyPatch) -> None:
    class Proc:
        stdout = iter(["55, 1024, 1980, 512.25\n", "40, 1000, [N/A], [N/A]\n", "garbage\n"])

    sampler = GpuSampler()
    sampler._proc = Proc()  # type: ignore[assignment]
    sampler._smi_loop()
    assert [(s.util, s.mem_mib, s.sm_mhz, s.power_w) for s in sampler.samples] == [
        (55, 1024, 1980, 512.25), (40, 1000, None, None)]


def test_the_report_names_the_clock_only_when_it_was_sampled() -> None:
    assert _clocks(None) == ""
    clocks = {"gpu_sm_mhz_mean": 1867.5, "gpu_sm_mhz_min": 1755.0, "gpu_power_w_mean": 550.0, "gpu_slowed_share": 0.5}
    assert _clocks(clocks) == "; SM clock 1,868 MHz (min 1,755), 550 W, clocks slowed by power or heat in 50 % of samples"
    old = Breakdown.from_json(Breakdown(at_offered_rps=1.0, achieved_rps=1.0, client_mean_ms=1.0, client_p99_ms=1.0,
                                        client_lag_mean_ms=None, ensemble_request_ms=None).to_json())
    assert old.gpu_clocks is None and "gpu_clocks" not in old.to_json()


def test_a_stat_line_gives_its_thread_name_and_cpu_ticks() -> None:
    # proc(5): pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
    line = "4242 (grpc (x) 1) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 37 0 0 20 0 40 0 1000 0 0"
    assert parse_stat(line) == ("grpc (x) 1", 287)


@pytest.mark.skipif(not os.path.isdir(f"/proc/{os.getpid()}/task"), reason="threads are read from Linux's /proc")
def test_the_busiest_thread_is_found_in_a_live_process() -> None:
    """This process's own threads, read from /proc while one of them spins for 0.2 s of its own CPU time
    (however busy the machine): it is the busiest."""
    native: list[int] = []
    started, spun = threading.Event(), threading.Event()

    def spin() -> None:
        native.append(threading.get_native_id())
        started.set()
        begin = time.thread_time()
        while time.thread_time() - begin < 0.2:
            pass
        spun.set()
        while not stop.is_set():
            time.sleep(0.001)

    stop = threading.Event()
    worker = threading.Thread(target=spin)
    worker.start()
    try:
        started.wait(5)
        before, t0 = thread_times(os.getpid()), time.monotonic()
        assert spun.wait(30)
        after, wall = thread_times(os.getpid()), time.monotonic() - t0
    finally:
        stop.set()
        worker.join()
    assert len(after) >= 2 and all(cpu >= 0 for _, cpu in after.values())
    busiest = max(after, key=lambda k: after[k][1] - before.get(k, ("", 0.0))[1])
    assert busiest == f"{os.getpid()}/{native[0]}"
    top = CpuMeter.busiest_threads({"me": before}, {"me": after}, wall, top=2)["me"]
    assert len(top) == 2 and top[0][1] > 0 and top[0][1] >= top[1][1]


def test_busiest_threads_rank_each_role_by_its_share_of_a_core() -> None:
    before = {"server:tritonserver": {"1/2": ("tritonserver", 10.0), "1/3": ("tritonserver", 10.0),
                                      "1/4": ("grpc_global_tim", 1.0), "1/6": ("reused", 5.0)}}
    after = {"server:tritonserver": {"1/2": ("tritonserver", 11.9), "1/3": ("tritonserver", 10.5),
                                     "1/4": ("grpc_global_tim", 1.1), "1/5": ("new", 0.2), "1/6": ("reused", 0.1)}}
    assert CpuMeter.busiest_threads(before, after, 2.0, top=3) == {
        "server:tritonserver": [("tritonserver", 0.95), ("tritonserver", 0.25), ("new", 0.1)]}
    assert CpuMeter.busiest_threads(before, after, 2.0, top=9)["server:tritonserver"][-1] == ("reused", 0.0)
    assert CpuMeter.busiest_threads(before, after, 0.0) == {}


def test_the_report_names_the_busiest_threads_and_a_saturated_server_thread() -> None:
    from tritonbundle.bench import options as bench_options
    from tritonbundle.bench.breakdown import hints
    from tritonbundle.bench.report import _threads

    b = Breakdown(at_offered_rps=1, achieved_rps=1, client_mean_ms=1, client_p99_ms=1, client_lag_mean_ms=None,
                  ensemble_request_ms=None,
                  cpu_threads={"server:tritonserver": [("tritonserver", 0.97), ("grpc_global_tim", 0.2), ("idle", 0.0)],
                               "server:stub[m]": [("triton_python_b", 0.004)],
                               "load0": [("python3", 0.55)], "load1": [("python3", 0.61)]})
    assert _threads(b.cpu_threads or {}) == "tritonserver 0.97 (tritonserver), 0.20 (grpc_global_tim); " \
        "load generators 0.61 (python3)"
    assert any("busiest thread (tritonserver) used 97% of a core" in h for h in hints(b, bench_options.BenchOptions(out=Path('.'))))
    assert Breakdown.from_json(json.loads(json.dumps(b.to_json()))) == b  # the pairs come back as pairs
    calm = dataclasses.replace(b, cpu_threads={"server:tritonserver": [("tritonserver", 0.6)]})
    assert not [h for h in hints(calm, bench_options.BenchOptions(out=Path('.'))) if "busiest thread" in h]
