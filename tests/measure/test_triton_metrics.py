"""Triton's view of a level from two scrapes of its Prometheus text (measure/triton_metrics.py); the real
server's counters are read in tests/loadtests/test_loadtest.py."""

from __future__ import annotations

import pytest

from tritonbundle.measure.triton_metrics import parse, view


def _scrape(success: int, execs: int, request_us: int, queue_us: int, compute_input_us: int, infer_us: int,
            output_us: int) -> str:
    labels = '{model="minilm_encoder",version="1"}'
    return "\n".join([
        "# HELP nv_inference_request_success Number of successful inference requests",
        f"nv_inference_request_success{labels} {success}",
        f"nv_inference_request_failure{labels} 0",
        f"nv_inference_count{labels} {success}",
        f"nv_inference_exec_count{labels} {execs}",
        f"nv_inference_request_duration_us{labels} {request_us}",
        f"nv_inference_queue_duration_us{labels} {queue_us}",
        f"nv_inference_compute_input_duration_us{labels} {compute_input_us}",
        f"nv_inference_compute_infer_duration_us{labels} {infer_us}",
        f"nv_inference_compute_output_duration_us{labels} {output_us}",
        'nv_gpu_utilization{gpu_uuid="GPU-1"} 0.5',
    ]) + "\n"


def test_a_level_gives_each_part_of_a_call_per_request() -> None:
    """Each request counts its whole call's parts: 600 requests in 10 calls, compute_input 1.2 ms a call."""
    first = parse(_scrape(100, 2, 1_000, 100, 240, 2_000, 360))
    last = parse(_scrape(700, 12, 10_000_000, 4_000_000, 720_240, 3_602_000, 1_080_360))
    (v,) = view(first, last)
    assert v.model == "minilm_encoder" and v.requests == 600 and v.avg_batch_size == 60
    assert v.queue_ms_per_request == pytest.approx(6.6665)
    assert v.compute_input_ms_per_request == pytest.approx(1.2)
    assert v.compute_ms_per_request == pytest.approx(6.0)
    assert v.compute_output_ms_per_request == pytest.approx(1.8)
    assert v.request_ms_per_request == pytest.approx(16.665, abs=1e-3)


def test_a_model_without_requests_between_the_scrapes_is_left_out() -> None:
    same = parse(_scrape(100, 2, 1_000, 100, 240, 2_000, 360))
    assert view(same, same) == []
