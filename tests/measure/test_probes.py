"""The GPU sampler's summary of a level: utilisation, memory, SM clock, power and clock slowdowns
(the figures that say whether a slow level ran on a GPU that had slowed itself). This machine has no
GPU, so the samples are written in; the NVML reading itself runs on the device machine."""

from __future__ import annotations

import pytest

from tritonbundle.bench.records import Breakdown
from tritonbundle.bench.report import _clocks
from tritonbundle.measure.probes import GPU_KEYS, GpuSample, GpuSampler


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
