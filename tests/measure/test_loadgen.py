"""The load generator against the real server: the requests it sends reach the models they should."""

from __future__ import annotations

from pathlib import Path

import pytest

from tritonbundle.measure import triton_metrics
from tritonbundle.measure.loadgen import LoadPool

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TRAFFIC = Path(__file__).resolve().parents[2] / "build" / "traffic" / "chat.jsonl"


def _requests(metrics_url: str) -> dict[str, float]:
    return {model: counters.get("nv_inference_request_success", 0.0)
            for model, counters in triton_metrics.scrape(metrics_url).items()}


@pytest.mark.parametrize("requests, sender, reached, skipped", [
    ("auto", "wire", {"minilm", "minilm_tokenizer", "minilm_encoder"}, set()),
    ("auto", "client", {"minilm", "minilm_tokenizer", "minilm_encoder"}, set()),
    ("tokens", "wire", {"minilm_encoder"}, {"minilm", "minilm_tokenizer"}),
    ("auto", "http", {"minilm", "minilm_tokenizer", "minilm_encoder"}, set()),
    ("tokens", "http", {"minilm_encoder"}, {"minilm", "minilm_tokenizer"}),
])
def test_token_requests_go_straight_to_the_encoder(server: object, tmp_path: Path, requests: str, sender: str,
                                                   reached: set[str], skipped: set[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITONBUNDLE_LOAD_SENDER", sender)
    metrics_url = server.metrics_url  # type: ignore[attr-defined]
    with LoadPool(1, tmp_path, f"loadgen-{requests}") as pool:
        pool.setup(kind="grpc", url=server.grpc_url, model="minilm", traffic=str(TRAFFIC),  # type: ignore[attr-defined]
                   seed=0, timeout_s=10.0, pool=50, requests=requests, http_url=server.http_url)  # type: ignore[attr-defined]
        before = _requests(metrics_url)
        step = pool.step(20.0, warmup_s=0.0, window_s=1.0, grace_s=5.0, seed=0)
        after = _requests(metrics_url)
    assert step.sent > 0 and step.failed == 0, step
    # The loop watcher ran over the window (a timer always wakes a little late: 0 means no reading) and
    # nothing held the loop for a second at 20 req/s.
    assert 0 < step.extra["client_loop_lag_p99_ms"] < 1000, step.extra
    assert 0 <= step.extra["client_lag_p99_ms"] < 1000, step.extra
    grew = {model for model in after if after[model] > before.get(model, 0.0)}
    assert reached <= grew, f"expected requests at {sorted(reached)}, saw them at {sorted(grew)}"
    assert not (skipped & grew), f"{sorted(skipped & grew)} saw requests the {requests} clients should not send there"
