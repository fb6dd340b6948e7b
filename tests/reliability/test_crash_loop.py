"""A crash loop: the same small request, sent again each time the server is back, crashes `tritonserver`
2.51 every time (a gzip body of JSON nested deeper than its stack allows; the edge in compose and Helm
refuses such bodies, a bare ``tritonbundle serve`` has no edge). With ``--restart --max-restarts 3``
the supervisor brings the server back after every crash, more than three times: only starts that
never come up count toward the limit. Figures: reports/reliability/crash_loop.json."""

from __future__ import annotations

import gzip
import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.reliability.test_canary import REPORT, answers, serve, stop

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]
CRASHES = 5


def poison(http: str) -> int | None:
    """About 1 KB on the wire: 1,000,000 '[' gzipped. Triton 2.51 inflates it and its JSON parser recurses
    past the 8 MB stack."""
    body = gzip.compress(b"[" * 1_000_000)
    request = urllib.request.Request(f"http://{http}/v2/models/minilm/infer", data=body,
                                     headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return None  # the server died with the request


def test_a_crash_loop_never_leaves_the_server_down(repository: Path, tmp_path: Path) -> None:
    process, http = serve(repository, tmp_path, "--restart", "--max-restarts", "3")
    windows = []
    try:
        for _ in range(CRASHES):
            t0 = time.monotonic()
            assert poison(http) is None, "Triton 2.51 dies on this body (fixed in NGC 26.05)"
            deadline = t0 + 90
            while not answers(http):
                assert process.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "not back within 90 s"
                time.sleep(0.1)
            windows.append(round(time.monotonic() - t0, 2))
        assert process.poll() is None, "serve gave up"
    finally:
        stop(process)
    figures = {"crashes": CRASHES, "max_restarts": 3, "answers_again_after_s": windows}
    REPORT.mkdir(parents=True, exist_ok=True)
    (REPORT / "crash_loop.json").write_text(json.dumps(figures, indent=2))
    print(f"\ncrash loop: {figures}")
    log = (tmp_path / "serve.log").read_text()
    # Every crash was a restart (a restart the next request crashed before the supervisor saw it ready
    # is logged as "came up and went down" instead of "ready again": it still is no failed start).
    assert log.count("restarting tritonserver") >= CRASHES, log[-3000:]
    assert "giving up" not in log and "failed to start" not in log
