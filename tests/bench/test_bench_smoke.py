"""`tritonbundle bench gpu --device cpu`: the whole orchestration on the CPU (MiniLM only, a short
budget): the four systems measured, report files written, every process it started gone afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

ROOT = Path(__file__).resolve().parents[2]


def _our_processes(marker: str) -> list[str]:
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info.get("cmdline") or [])
        if marker in cmd and p.pid != os.getpid():
            found.append(f"{p.pid}: {cmd[:160]}")
    return found


#: What the load generators' command lines hold (measure/loadgen.py starts them with ``-m``; the work
#: folder is not on them, so a leftover one is found as a process that was not there before the run).
LOADGEN = "tritonbundle.measure.loadgen"


def test_bench_on_the_cpu_measures_four_systems_and_cleans_up(tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    argv = [
        sys.executable, "-m", "tritonbundle", "bench", "gpu", "--device", "cpu", "--models", "minilm",
        "--budget-s", "130", "--slo-p99-ms", "10000", "--start-rate", "2", "--rate-factor", "3", "--refine", "1",
        "--sequence-buckets", "4", "--batch-buckets", "1,4", "--ceiling-batches", "1,4", "--load-procs", "1",
        "--instances", "1", "--shares", "naive=0.2,peer=0.25,bundle=0.45,ceiling=0.1", "--out", str(out), "--work", str(work),
    ]
    start = time.monotonic()
    loadgens_before = set(_our_processes(LOADGEN))
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=330, check=False)
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert elapsed < 300
    lines = proc.stdout.strip().splitlines()
    assert "bundle/naive" in lines[-2] and "bundle/ceiling" in lines[-2]  # the ratios come last, then the paths
    files = sorted(p.name for p in out.iterdir())
    assert files == ["bench.json", "bench.md", "bench.png", "logs.tar.gz"]
    assert all((out / f).stat().st_size < 16 << 20 for f in files)
    result = json.loads((out / "bench.json").read_text())
    assert result["status"] == "done"
    systems = result["models"]["minilm"]["systems"]
    assert set(systems) == {"naive", "peer", "bundle", "ceiling"}
    for name, system in systems.items():
        assert system["status"] == "ok", (name, system.get("error"))
    assert systems["naive"]["sweep"]["steps"], "the naive server was measured at least once"
    assert systems["peer"]["sweep"]["steps"] and systems["peer"]["correctness"]["min_cosine"] > 0.99
    assert systems["bundle"]["sweep"]["steps"], "the bundle was measured at least once"
    correctness = systems["bundle"]["correctness"]  # one text per request, 16 callers at once, before and after
    assert correctness["at_once"]["texts"] == correctness["after_sweep"]["texts"] == 8 * correctness["texts"]
    assert min(correctness["at_once"]["min_cosine"], correctness["after_sweep"]["min_cosine"]) > 0.99
    assert systems["ceiling"]["best_rps"] > 0
    bundle_step = systems["bundle"]["sweep"]["steps"][0]
    assert bundle_step["extra"]["encoder"]["useful_tokens"] > 0  # the encoder's own statistics arrived
    tokenizer = bundle_step["extra"]["tokenizer"]  # and the tokenizer model's, kept apart from the encoder's
    assert tokenizer["texts"] >= tokenizer["requests"] > 0 and tokenizer["t_tokenize_s"] > 0
    assert tokenizer["t_execute_by_request_s"] >= tokenizer["t_execute_s"] > 0
    assert "rows" not in tokenizer and "texts" not in bundle_step["extra"]["encoder"]
    assert "minilm_encoder" in bundle_step["extra"]["triton"]  # and Triton's metrics
    threads = bundle_step["extra"]["cpu_threads"]  # and each role's busiest threads, from /proc
    assert threads["server:tritonserver"] and all(0 <= cores <= 1.05 for _, cores in threads["server:tritonserver"])
    assert result["environment"]["versions"]["torch"] != "-"
    md = (out / "bench.md").read_text()
    assert "Throughput at the SLO" in md and "Where the bundle's time goes" in md
    assert "- tokenizer execute() per call (ms): read " in md and "Triton's compute beyond execute()" in md
    assert "- busiest threads, share of one core (thread name): stub[minilm_encoder]" in md
    time.sleep(1.0)
    assert _our_processes(str(work)) == [], "a server or stub outlived the benchmark"
    assert set(_our_processes(LOADGEN)) - loadgens_before == set(), "a load generator outlived the benchmark"


def test_bench_reports_a_failed_phase_and_still_writes_the_report(tmp_path: Path) -> None:
    """A phase that cannot run (here: the MiniLM weights folder named by the environment is empty, so
    the repository cannot be built) is recorded as failed; the run still ends with its files."""
    out = tmp_path / "out"
    env = {**os.environ, "TRITONBUNDLE_MINILM_DIR": str(tmp_path / "empty")}
    (tmp_path / "empty").mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "tritonbundle", "bench", "gpu", "--device", "cpu", "--models", "minilm",
         "--budget-s", "30", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False, env=env,
    )
    assert proc.returncode == 1
    result = json.loads((out / "bench.json").read_text())
    entry = result["models"]["minilm"]
    assert entry["build"]["status"] == "failed" and "TRITONBUNDLE_MINILM_DIR" in entry["build"]["error"]
    assert all(s["status"] == "failed" for s in entry["systems"].values())
    assert (out / "bench.md").exists() and (out / "logs.tar.gz").exists()
    assert "bundle/naive = -" in proc.stdout


def test_sigterm_stops_the_servers_and_still_writes_the_report(tmp_path: Path) -> None:
    """A run cut short (the device tool's time limit sends SIGTERM) leaves no server behind."""
    import signal

    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    loadgens_before = set(_our_processes(LOADGEN))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tritonbundle", "bench", "gpu", "--device", "cpu", "--models", "minilm",
         "--systems", "bundle", "--budget-s", "120", "--slo-p99-ms", "10000", "--start-rate", "1",
         "--sequence-buckets", "4", "--batch-buckets", "1,4", "--load-procs", "1", "--instances", "1",
         "--out", str(out), "--work", str(work)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "levels of" in line:  # the server is up and the load is on
                break
        assert _our_processes(str(work)), "the server is running"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    time.sleep(1.0)
    assert _our_processes(str(work)) == []
    assert set(_our_processes(LOADGEN)) - loadgens_before == set(), "a load generator outlived the benchmark"
    assert json.loads((out / "bench.json").read_text())["status"] == "interrupted"
    assert (out / "logs.tar.gz").exists()
