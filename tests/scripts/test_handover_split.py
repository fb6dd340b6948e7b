"""scripts/handover_split.py against the real tritonserver: one short run per sender, each printing
Triton's three parts of a call. What the parts cost is the script's output, not asserted here (speed is
read from benchmarks, docs/benchmarks.md); that each is counted, for both frontends, is."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_each_sender_run_counts_staging_the_stub_and_responses() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "handover_split.py"), "--rate", "400",
                          "--sleep-ms", "10", "--seconds", "3", "--rounds", "1"],
                         capture_output=True, text=True, timeout=280, cwd=ROOT, check=True).stdout
    runs = re.findall(r"^(wire|http)\s*: .* 0 failed, +([0-9.]+) requests a call; per call \(ms\): staging ([0-9.]+), "
                      r"the stub's side (-?[0-9.]+), responses ([0-9.]+)", out, re.M)
    assert [r[0] for r in runs] == ["wire", "http"], out
    for _, per_call, staging, stub, responses in runs:
        assert float(per_call) > 1.5  # the sleep lets calls fill: a hand-over shared by several requests
        assert float(staging) > 0 and float(stub) > 0 and float(responses) > 0
    assert re.search(r"^http: per request \(us\), median \[range\] over 1 runs: staging", out, re.M)
