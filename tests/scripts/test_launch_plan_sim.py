"""scripts/launch_plan_sim.py, the offline estimate docs/benchmarks.md quotes: the served engine's own
launch costs read from a bundle's report, batch sizes above its largest scaled from a ceiling's, and the
serving planner run on calls of chat rows (the real planner; its figures are estimates, not timings)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIFTH = ROOT / "docs" / "benchmarks" / "h100-fifth-host" / "bert-base"
sys.path.insert(0, str(ROOT / "scripts"))

import launch_plan_sim  # noqa: E402


def test_a_bundle_report_gives_its_engines_table_and_a_ceiling_scales_it_up() -> None:
    targets, timed, measured = launch_plan_sim.costs(str(FIFTH / "texts-1" / "bench.json"))
    assert len(targets) == 16 and measured[-1] == 64 and len(measured) == 18  # the served 18 buckets
    assert timed[(64, 22)] == pytest.approx(1.3551e-3)  # the packed graph, as the instance timed it
    _, ceiling, _ = launch_plan_sim.costs(str(FIFTH / "ceiling" / "run-1" / "bench.json"))
    launch_plan_sim.scale_up(timed, str(FIFTH / "ceiling" / "run-1" / "bench.json"))
    ratio = timed[(64, 22)] / ceiling[(64, 22)]
    assert timed[(128, 22)] == pytest.approx(ceiling[(128, 22)] * ratio)
    assert (256, 512) in timed and timed[(64, 22)] == pytest.approx(1.3551e-3)  # the engine's own left as timed


def test_bigger_calls_cost_less_gpu_per_row_in_the_estimate() -> None:
    buckets = "1,2,3,4,6,8,10,12,14,16,20,24,28,32,40,48,56,64"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "launch_plan_sim.py"), "--report", str(FIFTH / "texts-1" / "bench.json"),
         "--scale-from", str(FIFTH / "ceiling" / "run-1" / "bench.json"), "--rows", "62,120", "--max-rows", "128",
         "--calls", "300", "--buckets", buckets], capture_output=True, text=True, timeout=120, check=False, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    per_row = [float(m) for m in re.findall(r"GPU ([0-9.]+) ms per row", proc.stdout)]
    assert len(per_row) == 2 and per_row[1] < 0.97 * per_row[0], proc.stdout
