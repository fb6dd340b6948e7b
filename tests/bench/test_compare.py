"""The A/B summary (bench/compare.py) over committed H200 reports, and the device script that runs the
rounds (scripts/device_ab.sh) with its bench stood in for: the bench itself runs in test_bench_smoke.py
and on the GPU machine; here, which runs it starts, in which order, with which environment."""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest

from tritonbundle.bench.compare import Setting, markdown, summarize

ROOT = Path(__file__).resolve().parents[2]


def test_the_plain_text_ab_sums_up_as_the_docs_say() -> None:
    settings = {s.name: s for s in summarize(ROOT / "docs" / "benchmarks" / "h200-plain-text")}
    assert settings["bert-base-python"].rates == [13558.0, 13558.0, 14184.0]
    assert settings["bert-base-rust"].median == 9178.0
    assert round(settings["minilm-python"].median) == 14770 and round(settings["minilm-rust"].median) == 12558
    python = settings["bert-base-python"].runs
    assert 0.100 < min(r.read_per_row or 0 for r in python) and max(r.read_per_row or 1 for r in python) < 0.110
    assert all(r.tokenize_per_row is None and r.host_ms is None for r in python), "not counted apart before 2026-12-04"
    table = markdown([settings["bert-base-python"]])
    assert "| bert-base-python | 13,558 / 13,558 / 14,184 | **13,558** [13,558-14,184] | 0.101-0.109 | - |" in table
    # computed/useful, cores busy at the knee (no host capacity then), busiest thread (not recorded then),
    # requests per call at the knee (read again: the stubs counted, the cap from the instances' buckets),
    # the Python backend's hand-over per request, the GPU's busy time per row (read again at the knee; what
    # the launches take alone was not counted then), host stalls (not probed then), host workload, start-up
    assert table.rstrip().endswith(
        "| 1.10-1.11 | 9.1-9.4 | - | 57.5-60.1 of 64, every 35.6-36.3 ms, busy 64-65 % | 0.085-0.103 "
        "| 0.0665-0.0671 / - | - | - | 26-29 |"), table


def test_the_tenth_sessions_abs_sum_up_as_the_docs_say() -> None:
    """docs/benchmarks.md and the README quote these medians (the ceilings 20,646 and 79,639)."""
    docs = ROOT / "docs" / "benchmarks"
    buckets = {s.name: s for s in summarize(docs / "h200-buckets")}
    assert round(buckets["bert-base-fine"].median) == 15713 and round(buckets["bert-base-b64"].median) == 14740
    assert round(buckets["bert-base-fine"].median / 20646, 2) == 0.76
    assert max(r.computed_per_useful or 9 for r in buckets["minilm-fine"].runs) < 1.13
    words = {s.name: s for s in summarize(docs / "h200-word-cache")}
    assert round(words["minilm-words"].median) == 28300 and round(words["minilm-rust"].median) == 23117
    sender = {s.name: s for s in summarize(docs / "h200-sender")}
    assert round(sender["minilm-wire"].median) == 29056 and round(sender["minilm-client"].median) == 18024


def test_the_eleventh_sessions_runs_read_as_the_docs_say() -> None:
    """docs/tuning.md and docs/benchmarks.md quote these: the tune's winner from the bad start against the
    hand-picked settings (one call, three rounds), and the peer three times around one bundle run."""
    docs = ROOT / "docs" / "benchmarks"
    ab = {s.name: s for s in summarize(docs / "h200-tune-vs-handpicked-2")}
    assert [round(r) for r in ab["tuned"].rates] == [12781, 13519, 11489] and round(ab["tuned"].median) == 12781
    assert ab["handpicked"].rates == [13558.0, 13558.0, 13558.0]
    assert round(ab["tuned"].median / ab["handpicked"].median, 2) == 0.94
    # The busiest thread at the knee: no serial limit there (the tuned runs' tokenizer stubs at half a core)
    table = markdown([ab["handpicked"], ab["tuned"]])
    assert "| 0.31-0.34 (tritonserver) |" in table and "| 0.45-0.55 (stub[bert_base_tokenizer]) |" in table
    peers = sorted(_peer_same_call(f"peer-{i}", "peer") for i in (1, 2, 3))
    assert [round(p) for p in peers] == [257, 436, 836]
    assert round(_peer_same_call("bundle-1", "bundle")) == 16264
    assert round(_peer_same_call("bundle-1", "bundle") / peers[1]) == 37


def _peer_same_call(run: str, system: str) -> float:
    """A system's rate at the SLO in one run of the eleventh session's peer-around-the-bundle call."""
    report = json.loads((ROOT / "docs" / "benchmarks" / "h200-peer-same-call" / run / "bench.json").read_text())
    return float(report["models"]["bert_base"]["systems"][system]["best_rps"])


def _row(table: str, starts: str) -> str:
    (line,) = [x for x in table.splitlines() if x.startswith(starts)]
    return line


def _quoted(setting: Setting) -> str:
    rates = sorted(setting.rates)
    return f"{setting.median:,.0f} req/s [{rates[0]:,.0f}-{rates[-1]:,.0f}]"


def _ceiling_median(folder: Path, model: str = "minilm") -> float:
    """The median of the three ceiling runs under ``folder``/ceiling, from their bench.json."""
    return statistics.median(
        json.loads((folder / "ceiling" / f"run-{i}" / "bench.json").read_text())["models"][model]["systems"]["ceiling"]["best_rps"]
        for i in (1, 2, 3))


def _h100_minilm_ceiling() -> float:
    """The median of the three ceiling runs of the H100 MiniLM call (2026-12-06)."""
    return _ceiling_median(ROOT / "docs" / "benchmarks" / "h100-minilm-tokens-http")


def _ceiling_from_consoles(name: str) -> float:
    """The median of the three ceiling runs of the MiniLM call under docs/benchmarks/``name``, from their
    consoles (one run's bench.json came back from the device)."""
    folder = ROOT / "docs" / "benchmarks" / name / "ceiling"
    ceilings = [float(line.split()[2]) for i in (1, 2, 3)
                for line in (folder / f"run-{i}" / "console.log").read_text().splitlines()
                if line.startswith("minilm     ceiling")]
    assert len(ceilings) == 3
    return statistics.median(ceilings)


def _cpu_ms_per_request(setting: Setting) -> float:
    """All measured processes' CPU per answered request at the knee (cores busy / rate, medians), ms."""
    return statistics.median(r.cores_busy or 0 for r in setting.runs) / setting.median * 1000


def _minilm_call(name: str, ceiling_rps: float) -> tuple[str, dict[str, Setting]]:
    """docs/benchmarks.md and the settings of the MiniLM call under docs/benchmarks/``name``: the doc quotes
    the call's ceiling median, and the call's summary.md is the table its runs make."""
    docs = (ROOT / "docs" / "benchmarks.md").read_text()
    folder = ROOT / "docs" / "benchmarks" / name
    runs = {s.name: s for s in summarize(folder)}
    assert f"median **{ceiling_rps:,.0f}**" in docs and f"of the ceiling ({ceiling_rps:,.0f})" in docs
    assert (folder / "summary.md").read_text() == markdown(list(runs.values()))
    return docs, runs


def test_the_h100_minilm_call_reads_as_the_docs_say() -> None:
    """docs/benchmarks.md, "H100: MiniLM at 0.49 of the ceiling with texts": the table read back from the
    runs, the token rows' rounds floors (the ladder stopped at --max-rate untried), and the table marks them."""
    ceiling_rps = _h100_minilm_ceiling()
    docs, runs = _minilm_call("h100-minilm-tokens-http", ceiling_rps)
    texts, tokens_http, tokens_8 = runs["texts"], runs["tokhttp10"], runs["tokhttp8"]
    assert f"| {' / '.join(f'{r:,.0f}' for r in texts.rates)} | **{texts.median:,.0f}** [" in docs
    assert f"| **{texts.median / ceiling_rps:.2f}** |" in docs
    assert f"| {' / '.join(f'{r:,.0f}+' for r in tokens_http.rates)} | **{tokens_http.median:,.0f}** or more |" in docs
    assert f"| **{tokens_http.median / ceiling_rps:.2f} or more** |" in docs
    assert f"| {tokens_8.median:,.0f} | {tokens_8.median:,.0f} | {tokens_8.median / ceiling_rps:.2f} |" in docs
    assert all(r.floor for r in tokens_http.runs) and not any(r.floor for r in texts.runs + tokens_8.runs)
    table = markdown(list(runs.values()))
    assert "| tokhttp10 | 40,527+ / 40,523+ / 40,513+ / 40,543+ |" in table and "\\+ a floor of the knee" in table


def _targets_by_host() -> str:
    """The table of docs/benchmarks.md, "The targets, host by host" (the README's table in full)."""
    docs = (ROOT / "docs" / "benchmarks.md").read_text()
    section = docs.split("## The targets, host by host", 1)[1]
    return section.split("**Where the project's targets stand**", 1)[1].split("\n\n", 2)[1]


def test_the_readmes_targets_table_quotes_only_figures_the_hosts_table_holds() -> None:
    """The README's short table: every figure in a cell is one the same cell of the host-by-host table
    states (which the test below reads back from the reports), as a whole number, besides the targets."""
    def rows(table: str) -> dict[str, list[str]]:
        cells = [line.strip("| ").split(" | ") for line in table.splitlines()
                 if line.startswith("| ") and not line.startswith("| target")]
        return {" ".join(c[0].split()[:3]): c[1:] for c in cells}

    readme = (ROOT / "README.md").read_text()
    short = rows(readme.split("**Where the project's targets stand**", 1)[1].split("\n\n", 2)[1])
    full = rows(_targets_by_host())
    assert len(short) == 3 and short.keys() == full.keys(), (short.keys(), full.keys())
    for target, cells in short.items():
        for model, (cell, source) in zip(("BERT-base", "MiniLM"), zip(cells, full[target], strict=True), strict=True):
            figures = re.findall(r"(?<![A-Za-z\d.,])\d+(?:,\d{3})*(?:\.\d+)?", cell)  # not the 200 of H200
            assert figures, (target, model)
            for figure in figures:
                whole = rf"(?<![\d.,]){re.escape(figure)}(?![\d]|[.,]\d)"
                assert re.search(whole, source), f"README's {target!r}, {model}: {figure} is not in the hosts table's cell"


def test_the_targets_by_host_say_what_the_committed_reports_say() -> None:
    """docs/benchmarks.md, "The targets, host by host": each cell read back from the runs it names."""
    table = _targets_by_host()
    docs = ROOT / "docs" / "benchmarks"
    buckets = {s.name: s for s in summarize(docs / "h200-buckets")}
    words = {s.name: s for s in summarize(docs / "h200-word-cache")}
    ceiling = _row(table, "| bundle / ceiling")
    bert, minilm = buckets["bert-base-fine"], words["minilm-words"]
    assert f"**{bert.median / 20646:.2f}**, met: {_quoted(bert)} against the ceiling's 20,646" in ceiling
    assert f"**{minilm.median / 79639:.2f}, not met** on the H200: {_quoted(minilm).replace(' req/s', '')} against 79,639" in ceiling
    h100, ceiling_rps = {s.name: s for s in summarize(docs / "h100-minilm-tokens-http")}, _h100_minilm_ceiling()
    texts, tokens_http = h100["texts"], h100["tokhttp10"]
    assert f"ceiling in the same call ({ceiling_rps:,.0f}, 2026-12-06)" in ceiling
    assert f"**{texts.median / ceiling_rps:.2f}** with texts ({_quoted(texts).replace(' req/s', '')}" in ceiling
    assert all(r.floor for r in tokens_http.runs) and len(tokens_http.runs) == 4
    assert (f"**{tokens_http.median / ceiling_rps:.2f} or more, met, with token rows over HTTP** "
            f"({tokens_http.median:,.0f} in all four rounds, each a floor") in ceiling
    slower, slower_ceiling = {s.name: s for s in summarize(docs / "h100-slower-host-minilm")}, _ceiling_from_consoles("h100-slower-host-minilm")
    assert (f"(ceiling {slower_ceiling:,.0f}): **{slower['texts'].median / slower_ceiling:.2f}** with texts, "
            f"**{slower['tokhttp10'].median / slower_ceiling:.2f}** with token rows over HTTP "
            f"({_quoted(slower['tokhttp10']).replace(' req/s', '')}, six rounds)") in ceiling
    third, third_ceiling = {s.name: s for s in summarize(docs / "h100-third-host-minilm")}, _ceiling_from_consoles(
        "h100-third-host-minilm")
    assert (f"(ceiling {third_ceiling:,.0f}): **{third['texts'].median / third_ceiling:.2f}, met, with texts** "
            f"({_quoted(third['texts']).replace(' req/s', '')}, three rounds), "
            f"**{third['tokhttp10'].median / third_ceiling:.2f} with token rows over HTTP** "
            f"({_quoted(third['tokhttp10']).replace(' req/s', '')})") in ceiling
    tokens = _row(table, "| computed / useful")
    low, high = (f(r.computed_per_useful or 0 for r in buckets["bert-base-fine"].runs) for f in (min, max))
    assert f"**{low:.2f}-{high:.2f}**, met (the same runs)" in tokens
    low, high = (f(r.computed_per_useful or 0 for r in buckets["minilm-fine"].runs) for f in (min, max))
    assert f"**{low:.2f}-{high:.2f}**, met" in tokens and _quoted(buckets["minilm-fine"]).replace(" req/s", "") in tokens
    ratios = json.loads((docs / "h200-launch-costs" / "minilm-bench.json").read_text())["models"]["minilm"]["ratios"]
    peer, (lo, hi) = ratios["bundle_over_peer"], ratios["ranges"]["bundle_over_peer"]
    assert f"**{peer:.1f}** [{lo:.1f}-{hi:.1f}], met" in _row(table, "| bundle / peer")
    bundle = _peer_same_call("bundle-1", "bundle")
    low, mid, high = sorted(_peer_same_call(f"peer-{i}", "peer") for i in (1, 2, 3))
    assert (f"**{bundle / mid:.0f}** [{bundle / high:.0f}-{bundle / low:.0f}], met ({bundle:,.0f} against the peer's "
            f"{mid:,.0f} [{low:,.0f}-{high:,.0f}]") in _row(table, "| bundle / peer")


def test_the_token_rows_and_http_estimate_reads_its_inputs_from_the_reports(tmp_path: Path) -> None:
    """docs/benchmarks.md, "what token rows from the client and HTTP could take off a call": every input
    of the arithmetic, read again from the committed reports."""
    from statistics import median

    from tritonbundle.bench.compare import read_run

    docs = ROOT / "docs" / "benchmarks"
    texts = read_run(docs / "h200-buckets" / "minilm-fine-3")
    assert texts.cycle is not None and round(texts.rps or 0) == 27344
    assert (round(texts.cycle.cycle_ms, 2), round(texts.cycle.requests_per_call, 1)) == (17.79, 58.2)
    (tokens_dir := tmp_path / "minilm-tokens-1").mkdir()
    shutil.copy(docs / "h200-minilm-block" / "minilm-tokens-bench.json", tokens_dir / "bench.json")
    tokens = read_run(tokens_dir)
    assert [round(x or 0, 4) for x in (texts.read_per_row, texts.tokenize_per_row, tokens.read_per_row)] == [
        0.0138, 0.0603, 0.0371]
    net = (texts.tokenize_per_row or 0) - ((tokens.read_per_row or 0) - (texts.read_per_row or 0))
    assert round(net * texts.cycle.requests_per_call, 2) == 2.16
    sender = {s.name: s for s in summarize(docs / "h100-grpc-http-minilm")}
    responses = {name: median(r.handover_parts[2] for r in sender[name].runs if r.handover_parts)
                 for name in ("grpc", "http")}
    assert (round(responses["grpc"], 4), round(responses["http"], 4)) == (0.0576, 0.0198)
    cycle = texts.cycle.cycle_ms - net * texts.cycle.requests_per_call - 2 / 3 * 58.2 * (responses["grpc"] - responses["http"])
    assert round(cycle, 1) == 14.2
    assert [round(1000 * n * rows / cycle, -2) for n, rows in ((8, 58.2), (8, 64), (10, 58.2))] == [32900, 36100, 41100]


FAKE_BENCH = """#!/usr/bin/env bash
# stands in for scripts/device_bench.sh: records its call, writes a report whose knee is the round's
echo "$1 ${OUT##*/} ${AB_KNOB:-unset} $*" >> "$CALLS"
echo "${OUT##*/} $(python3 -c 'import os; print(len(os.sched_getaffinity(0)))')" >> "$CALLS.cpus"
mkdir -p "$OUT"
python3 - "$TEMPLATE" "$OUT/bench.json" $(( ${OUT##*-} * 1000 + ${AB_KNOB:-0} )) "$*" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
report["models"]["bert_base"]["systems"]["bundle"]["best_rps"] = int(sys.argv[3])
for system, times in (("ceiling", 2), ("peer", 0.1)):  # a reference: twice a round's knee, a tenth of it
    if f"--systems {system}" in sys.argv[4]:
        report["models"]["bert_base"]["systems"] = {system: {"status": "ok", "best_rps": int(sys.argv[3]) * times}}
json.dump(report, open(sys.argv[2], "w"))
PY
"""


def _template(into: Path) -> Path:
    """A committed H200 report with the figures the summary reads set to round numbers."""
    report = json.loads((ROOT / "docs" / "benchmarks" / "h200-plain-text" / "bert-base-python-1" / "bench.json").read_text())
    report["environment"]["host_speed"] = {"python_ms_before": [41.5, 40.0], "parallel_before": {
        "procs": [1, 4, 8, 12, 16], "ms": [41.0, 41.5, 44.0, 55.0, 64.0], "cores": [1.0, 3.95, 7.45, 8.95, 10.25]}}
    report["models"]["bert_base"]["systems"]["bundle"]["breakdown"].update(
        encoder_execute_ms={"read": 1.0, "tokenize": 2.0}, encoder_rows_per_execute=10.0, achieved_rps=1000.0,
        cpu_cores={"server:stub[m]": 0.25, "load0:python3": 0.5},
        cpu_threads={"server:tritonserver": [["tritonserver", 0.62], ["tritonserver", 0.6]],
                     "load0:python3": [["python3", 0.45]]})
    path = into / "template.json"
    path.write_text(json.dumps(report))
    return path


def _device_ab(tmp_path: Path, *args: str, timeout: int = 60) -> subprocess.CompletedProcess[str]:
    """scripts/device_ab.sh copied beside the stand-in bench (FAKE_BENCH), run with ``args``; the stand-in
    appends each run it is asked for to ``tmp_path/calls.txt``, reports go to ``tmp_path/out``."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "device_ab.sh", tmp_path / "scripts" / "device_ab.sh")
    (tmp_path / "scripts" / "device_bench.sh").write_text(FAKE_BENCH)
    env = {**os.environ, "OUT": str(tmp_path / "out"), "CALLS": str(tmp_path / "calls.txt"), "PYTHONPATH": str(ROOT),
           "TEMPLATE": str(_template(tmp_path))}
    env.pop("TRITONBUNDLE_GPU_SHARING", None)
    return subprocess.run(["bash", str(tmp_path / "scripts" / "device_ab.sh"), *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("deadline", ["480", "-1"])
def test_the_device_script_interleaves_the_settings_and_sums_them_up(tmp_path: Path, deadline: str) -> None:
    calls, out = tmp_path / "calls.txt", tmp_path / "out"
    done = _device_ab(tmp_path, "--rounds", "2", "--deadline", deadline, "--budget", "90", "a=x.json",
                      "b=y.json+AB_KNOB=7+--load-procs=4", timeout=120)
    assert done.returncode == 0, done.stderr
    if deadline == "-1":
        assert not calls.exists() and "a-1: not started (deadline -1 s)" in done.stdout
        return
    lines = calls.read_text().splitlines()
    assert [line.split()[:3] for line in lines] == [
        ["run", "a-1", "unset"], ["run", "b-1", "7"], ["run", "a-2", "unset"], ["run", "b-2", "7"]]
    assert "--tuned x.json" in lines[0] and "--tuned y.json" in lines[1] and "--models bert-base" in lines[0]
    assert all("--budget-s 90" in line for line in lines)
    assert [line.endswith(" --load-procs=4") for line in lines] == [False, True, False, True]  # a flag, b's only
    assert "b-2: exit 0" in done.stdout and "ok 2007 req/s at the SLO" in done.stdout
    summary = (out / "summary.md").read_text()
    assert ("| b | 1,007 / 2,007 | **1,507** [1,007-2,007] | 0.100-0.100 | 0.200-0.200 | 0.250-0.250 | 0.500-0.500 "
            "| 1.11-1.11 | 0.8-0.8 (10.2-10.2) | 0.62-0.62 (tritonserver) | 57.7-57.7 of 64, every 36.3-36.3 ms, busy 65-65 % "
            "| - | 0.0666-0.0666 / - | - | 41.5-41.5 | 29-29 |") in summary
    assert json.loads((out / "runs" / "a-2" / "bench.json").read_text())["models"]["bert_base"]["systems"]["bundle"][
        "best_rps"] == 2000
    assert (out / "runs.tgz").stat().st_size > 0


def test_the_device_script_measures_the_references_each_round_and_puts_the_settings_over_them(tmp_path: Path) -> None:
    """``--reference ceiling --reference peer``: both after each round's settings, on the same host; the
    summary gives each setting's median over theirs and the ratio round by round (the targets' terms)."""
    done = _device_ab(tmp_path, "--rounds", "3", "--reference", "ceiling", "--reference", "peer", "a=x.json",
                      "b=x.json+AB_KNOB=500", timeout=180)
    assert done.returncode == 0, done.stderr
    calls = [line.split()[1] for line in (tmp_path / "calls.txt").read_text().splitlines()]
    assert calls == ["a-1", "b-1", "ceiling-1", "peer-1", "a-2", "b-2", "ceiling-2", "peer-2",
                     "a-3", "b-3", "ceiling-3", "peer-3"]
    lines = (tmp_path / "calls.txt").read_text().splitlines()
    assert "--systems ceiling --budget-s 60" in lines[2] and "--systems peer --budget-s 55" in lines[3]
    assert "ceiling-3: exit 0" in done.stdout and "ok 6000 req/s" in done.stdout
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| ceiling | 2,000 / 4,000 / 6,000 | **4,000** [2,000-6,000] |" in summary
    assert ("- ceiling (median of 3: 4,000 req/s): a 0.50 of the ceiling (by round: 0.50 / 0.50 / 0.50); "
            "b 0.62 of the ceiling (by round: 0.75 / 0.62 / 0.58)") in summary
    assert "- peer (median of 3: 200 req/s): a 10.00 over the peer (by round: 10.00 / 10.00 / 10.00); b 12.50" in summary
    # a reference run that answered nothing is left out of the reference's median, not counted as 0
    failed = json.loads((tmp_path / "out" / "runs" / "ceiling-3" / "bench.json").read_text())
    failed["models"]["bert_base"]["systems"]["ceiling"] = {"status": "failed", "error": "CUDA error"}
    (tmp_path / "out" / "runs" / "ceiling-3" / "bench.json").write_text(json.dumps(failed))
    assert "- ceiling (median of 2: 3,000 req/s): a 0.67 of the ceiling (by round: 0.50 / 0.50 / -)" in markdown(
        summarize(tmp_path / "out"))
    (tmp_path / "again").mkdir()
    assert _device_ab(tmp_path / "again", "--reference", "ceiling", "ceiling=x.json").returncode == 2


def test_the_device_script_refuses_a_setting_item_it_cannot_place(tmp_path: Path) -> None:
    done = _device_ab(tmp_path, "--rounds", "1", "a=x.json+--load-procs")
    assert done.returncode == 2 and "'--load-procs' is neither VAR=VALUE, --flag=VALUE nor taskset=CPUS" in done.stderr
    assert not (tmp_path / "calls.txt").exists()
    # refused before any run, also when a later setting holds it: no device time spent on the others
    (tmp_path / "again").mkdir()
    done = _device_ab(tmp_path / "again", "--rounds", "1", "a=x.json", "b=x.json+taskset=4096-4100")
    assert done.returncode == 2 and "b: taskset cannot run on CPUs '4096-4100' here" in done.stderr
    assert not (tmp_path / "again" / "calls.txt").exists()


def test_the_device_script_runs_a_setting_on_the_cpus_it_names(tmp_path: Path) -> None:
    """``+taskset=CPUS``: that setting's whole run (server, stubs, load generators, the host probe) on
    those CPUs only, the others' on all of them: the experiment that shows whether a knee moves with the
    cores. The run's own flags and environment are unchanged."""
    done = _device_ab(tmp_path, "--rounds", "1", "all=x.json", "one=x.json+taskset=0+AB_KNOB=3")
    assert done.returncode == 0, done.stderr
    cpus = dict(line.split() for line in (tmp_path / "calls.txt.cpus").read_text().splitlines())
    assert cpus == {"all-1": str(len(os.sched_getaffinity(0))), "one-1": "1"}
    lines = (tmp_path / "calls.txt").read_text().splitlines()
    assert lines[1].split()[:3] == ["run", "one-1", "3"] and "taskset" not in lines[1]


def test_the_device_script_refuses_a_first_round_past_the_last(tmp_path: Path) -> None:
    """``--first 4 --rounds 3`` ran no round and spent a device call (twenty-fourth session): refused, naming the fix."""
    done = _device_ab(tmp_path, "--first", "4", "--rounds", "3", "a=x.json")
    assert done.returncode == 2 and "--first 4 is past --rounds 3" in done.stderr and "give --rounds 6" in done.stderr
    assert not (tmp_path / "calls.txt").exists()


def test_minilms_knees_fell_at_about_ten_busy_cores_whatever_their_rate() -> None:
    """measure/host.py's reason for the host's capacity reading: every MiniLM A/B run on the H200 (the
    eighth and tenth sessions, 2026-12-04) reached its knee with 9.2-11.0 of the 16 CPUs busy, at
    10,800-34,800 req/s."""
    runs = [run for folder in ("h200-plain-text", "h200-word-cache", "h200-buckets", "h200-sender")
            for s in summarize(ROOT / "docs" / "benchmarks" / folder) if s.name.startswith("minilm") for run in s.runs]
    assert len(runs) == 22
    assert 9.15 <= min(r.cores_busy or 0 for r in runs) and max(r.cores_busy or 99 for r in runs) <= 11.05
    assert round(min(r.rps or 0 for r in runs), -2) == 10800 and round(max(r.rps or 0 for r in runs), -2) == 34800


def test_minilms_knees_fell_where_its_instances_calls_were_full_and_busy() -> None:
    """docs/benchmarks.md ("MiniLM's knee is its eight instances' calls"): in the 14 MiniLM runs with the
    word cache and the sender's bytes, each of the 8 instances was busy 78-88 % of its cycle at the knee,
    its calls 85-97 % of the cap of 64, and the knee 0-11 % under what full calls at that cycle allow;
    BERT-base's calls were fuller still while its instances idled over a third of their cycle (its GPU
    95-98 % busy there), and MiniLM's earlier settings knee'd with calls a quarter to half empty."""
    docs = ROOT / "docs" / "benchmarks"
    current = [("h200-word-cache", "minilm-words"), ("h200-word-cache", "minilm-rust"), ("h200-sender", "minilm-wire"),
               ("h200-buckets", "minilm-b64"), ("h200-buckets", "minilm-fine")]
    runs = [r for folder, name in current for s in summarize(docs / folder) if s.name == name for r in s.runs]
    cycles = [r.cycle for r in runs if r.cycle is not None]
    assert len(runs) == len(cycles) == 14 and all(c.instances == 8 and c.batch_cap == 64 for c in cycles)
    assert 0.84 <= min(c.fill or 0 for c in cycles) and max(c.fill or 1 for c in cycles) <= 0.98
    assert 0.77 <= min(c.busy_share or 0 for c in cycles) and max(c.busy_share or 1 for c in cycles) <= 0.89
    assert all(0.88 <= (r.rps or 0) / (r.cycle.bound_rps or 1) <= 1.01 for r in runs if r.cycle)
    bert = [r.cycle for s in summarize(docs / "h200-buckets") if s.name.startswith("bert-base") for r in s.runs]
    assert len(bert) == 6 and all(c is not None and (c.fill or 0) >= 0.98 and (c.busy_share or 1) <= 0.64 for c in bert)
    earlier = [r.cycle for folder, prefix in (("h200-plain-text", "minilm"), ("h200-sender", "minilm-client"))
               for s in summarize(docs / folder) if s.name.startswith(prefix) for r in s.runs]
    assert len(earlier) == 8 and all(c is not None and (c.fill or 1) <= 0.76 for c in earlier)


def _steps(run: Path) -> list[dict]:
    """The bundle's levels in the one-model report ``run/bench.json``."""
    return next(iter(json.loads((run / "bench.json").read_text())["models"].values()))["systems"]["bundle"]["sweep"]["steps"]


def _levels(run: Path) -> dict[int, dict]:
    return {round(s["offered_rps"]): s for s in _steps(run)}


def test_twelve_minilm_instances_answered_more_and_knee_d_lower_as_the_docs_say() -> None:
    """docs/benchmarks.md ("H100: twelve MiniLM instances answer more, but not within the SLO"): 8 against
    12 instances on an H100. The twelve kept up with 27,000 req/s offered where the eight saturated near
    25,000, yet their p99 at 8,000 was higher in every run and their knee's median lower."""
    folder = ROOT / "docs" / "benchmarks" / "h100-instances"
    settings = {s.name: s for s in summarize(folder)}
    assert settings["i8"].rates == [23177.0, 24098.0] and settings["i8"].median == 23637.5
    assert settings["i12"].rates == [20986.0, 18880.0, 24098.0] and settings["i12"].median == 20986.0
    cycles = {name: [r.cycle for r in s.runs] for name, s in settings.items()}
    assert all(c is not None and c.instances == 8 and 19.5 <= c.cycle_ms <= 19.8 for c in cycles["i8"])
    assert all(c is not None and c.instances == 12 and 27.5 <= c.cycle_ms <= 32.1 for c in cycles["i12"])
    runs = {path.name: _levels(path) for path in sorted(folder.glob("i*-*"))}
    eight, twelve = [v for k, v in runs.items() if k.startswith("i8-")], [v for k, v in runs.items() if k.startswith("i12-")]
    assert max(r[27000]["achieved_rps"] for r in eight) < 25000 <= 27000 * 0.99 < min(r[27000]["achieved_rps"] for r in twelve)
    assert max(r[8000]["p99_ms"] for r in eight) < min(r[8000]["p99_ms"] for r in twelve)


def test_the_python_backends_hand_over_costs_a_tenth_of_a_ms_per_request_as_the_docs_say() -> None:
    """docs/benchmarks.md ("H100: twelve MiniLM instances ..."): Triton's time for a call out of the queue
    less the stub's execute(), per request, at each knee: 0.058-0.084 ms in the eleven H200 MiniLM runs with the
    current settings (18 buckets, the bytes sender, the word cache), 0.103-0.142 on the H100."""
    docs = ROOT / "docs" / "benchmarks"
    def handover(folder: str, prefix: str) -> list[float]:
        return [r.handover_ms_per_request or 0.0 for s in summarize(docs / folder) if s.name.startswith(prefix)
                for r in s.runs]
    h200 = handover("h200-buckets", "minilm") + handover("h200-sender", "minilm-wire") + handover("h200-word-cache", "minilm-words")
    h100 = handover("h100-instances", "i")
    assert len(h200) == 11 and 0.057 <= min(h200) and max(h200) <= 0.085
    assert len(h100) == 5 and 0.102 <= min(h100) and max(h100) <= 0.143


def test_the_hand_over_splits_into_triton_s_staging_the_stub_s_side_and_the_responses(tmp_path: Path) -> None:
    """A report that records Triton's compute_input and compute_output at the knee (from 2026-12-05 on):
    the hand-over per request splits into the three, and they add up to it; reports before print no split."""
    data = json.loads((ROOT / "docs/benchmarks/h100-instances/i8-1/bench.json").read_text())
    cycle = data["models"]["minilm"]["systems"]["bundle"]["breakdown"]["encoder_cycle"]
    cycle.update(staging_ms=1.5, responding_ms=2.5)
    (tmp_path / "split-1").mkdir()
    (tmp_path / "split-1" / "bench.json").write_text(json.dumps(data))
    shutil.copytree(ROOT / "docs/benchmarks/h100-instances/i8-1", tmp_path / "before-1")

    runs = {s.name: s.runs[0] for s in summarize(tmp_path)}
    split, before = runs["split"], runs["before"]
    assert split.handover_ms_per_request == before.handover_ms_per_request
    assert before.handover_parts is None and split.handover_parts is not None
    staging, stub_side, responses = split.handover_parts
    per_call = cycle["requests_per_call"]
    assert staging == pytest.approx(1.5 / per_call) and responses == pytest.approx(2.5 / per_call)
    assert staging + stub_side + responses == pytest.approx(split.handover_ms_per_request)
    rows = {line.split(" | ")[0].strip("| "): line for line in markdown(summarize(tmp_path)).splitlines()[2:]}
    assert f"(staging {staging:.3f}-{staging:.3f}, the stub's side" in rows["split"]
    assert "staging" not in rows["before"]


def test_two_batches_in_flight_and_a_cap_of_128_lost_on_the_h100_as_the_docs_say() -> None:
    """docs/benchmarks.md ("H100: two batches in flight and a batch cap of 128 lose"): medians 25,631 /
    18,108 / 18,108, lower in every round; the hand-over splits at base's knees into staging 0.012-0.015,
    the stub's side 0.030-0.041 and responses 0.036-0.044 ms a request; with lanes there is none."""
    settings = {s.name: s for s in summarize(ROOT / "docs" / "benchmarks" / "h100-lanes-b128")}
    base, lanes2, b128 = settings["base"], settings["lanes2"], settings["b128"]
    assert [round(s.median) for s in (base, lanes2, b128)] == [25631, 18108, 18108]
    assert all(max(other.rates[i] for other in (lanes2, b128)) < base.rates[i] for i in range(3))
    parts = [r.handover_parts for r in base.runs]
    assert all(p is not None for p in parts)
    staging, stub_side, responses = ([p[i] for p in parts if p is not None] for i in range(3))
    assert 0.012 <= min(staging) and max(staging) <= 0.0155
    assert 0.0295 <= min(stub_side) and max(stub_side) <= 0.0415
    assert 0.036 <= min(responses) and max(responses) <= 0.0445
    assert all(r.handover_ms_per_request is None and r.handover_parts is None for r in lanes2.runs)
    assert [round(c.batch_cap or 0) for c in (r.cycle for r in b128.runs) if c] == [128] * 3
    assert max(r.cycle.requests_per_call for r in b128.runs if r.cycle) < 50.1


def test_http_sender_halves_the_responses_on_the_second_h100_as_the_docs_say() -> None:
    """docs/benchmarks.md ("H100: the HTTP sender..."): four interleaved rounds on one host, MiniLM; the
    knees spread 2x within a setting, the per-request costs do not: the load generators' CPU 0.20-0.31
    (gRPC) against 0.07-0.11 ms (HTTP), Triton's responses 0.040-0.065 against 0.018-0.027 ms."""
    settings = {s.name: s for s in summarize(ROOT / "docs" / "benchmarks" / "h100-grpc-http-minilm")}
    grpc, http = settings["grpc"], settings["http"]
    assert [round(r) for r in grpc.rates] == [10822, 6884, 6884, 14804]
    assert [round(r) for r in http.rates] == [27373, 11256, 11256, 11261]
    assert [round(s.median) for s in (grpc, http)] == [8853, 11259]
    load = {name: [r.load_ms_per_request or 0.0 for r in s.runs] for name, s in settings.items()}
    assert min(load["grpc"]) > 0.19 and max(load["http"]) < 0.11
    responses = {name: [r.handover_parts[2] for r in s.runs if r.handover_parts] for name, s in settings.items()}
    assert len(responses["grpc"]) == len(responses["http"]) == 4
    assert min(responses["grpc"]) > 0.039 and max(responses["http"]) < 0.028


def test_the_tunes_h100_winner_fell_short_of_the_hand_picked_settings_on_another_h100() -> None:
    """docs/tuning.md ("The winner on another H100"): the bad-start tune's winner (8 instances folded,
    2.5 ms delay) against the hand-picked bert-base settings (5 ms delay), three interleaved rounds:
    5,080 against 8,992; the winner's calls held 14-17 requests, the hand-picked ones' 24-48."""
    settings = {s.name: s for s in summarize(ROOT / "docs" / "benchmarks" / "h100-tuned-vs-handpicked")}
    tuned, handpicked = settings["tuned"], settings["handpicked"]
    assert [round(s.median) for s in (tuned, handpicked)] == [5080, 8992]
    assert max(r.cycle.requests_per_call for r in tuned.runs if r.cycle) < 17
    assert min(r.cycle.requests_per_call for r in handpicked.runs if r.cycle) > 23.9


def test_the_third_h100s_tail_is_the_servers_not_the_sends_as_the_docs_say() -> None:
    """docs/benchmarks.md ("One run with that reading..."): at every level the p99 from each send is the p99
    from the schedule less at most 2 ms, no load generator's collector paused 2 ms, and the levels whose
    p99 is over 40 ms hold 8-16 encoder calls over 15 ms against 0-1 at those under 16 ms."""
    from tritonbundle.runtimes.stats import HISTOGRAM_EDGES_MS

    steps = _steps(ROOT / "docs/benchmarks/h100-from-send-bert-base/handpicked-1")
    over_15 = HISTOGRAM_EDGES_MS.index(15.0) + 1  # buckets past 15 ms
    rows = [(round(s["offered_rps"]), s["p99_ms"], s["extra"]["p99_from_send_ms"], s["extra"]["client_gc_max_ms"],
             sum(s["extra"]["encoder"].get(f"h_execute_ms_{i}", 0) for i in range(over_15, len(HISTOGRAM_EDGES_MS) + 1)))
            for s in steps]
    assert [r[0] for r in rows] == [6000, 4000, 4899, 5422, 5703]
    assert all(0 <= p99 - send <= 2.0 and gc < 2.0 for _, p99, send, gc, _ in rows), rows
    assert [r[4] for r in rows] == [16, 8, 1, 0, 8]
    assert [s["passed"] for s in steps] == [False, True, True, True, True]


def test_on_another_h100_no_host_phase_of_a_call_took_15_ms_as_the_docs_say() -> None:
    """docs/benchmarks.md ("H100: which phase the slow calls spend it in"): host D, the hand-picked settings,
    two rounds, 14,201 and 13,518 req/s. Of every encoder call at every level, none spent over 15 ms in a
    host phase (one launch, in run 2 at 14,202 offered); the calls over 15 ms past the knee spent it in
    the GPU's time and the wait for it, with the GPU 98 % busy."""
    import json

    from tritonbundle.runtimes.stats import HISTOGRAM_EDGES_MS

    host = ("read", "tokenize", "plan", "fill", "launch", "respond")
    over_15 = HISTOGRAM_EDGES_MS.index(15.0) + 1
    found: dict[tuple[str, int], dict[str, int]] = {}
    for run in ("handpicked-1", "handpicked-2"):
        data = json.loads((ROOT / f"docs/benchmarks/h100-phases-bert-base/{run}/bench.json").read_text())
        bundle = next(iter(data["models"].values()))["systems"]["bundle"]
        for s in bundle["sweep"]["steps"]:
            enc = s["extra"]["encoder"]
            found[(run, round(s["offered_rps"]))] = {
                phase: int(sum(enc.get(f"h_{phase}_ms_{i}", 0) for i in range(over_15, len(HISTOGRAM_EDGES_MS) + 1)))
                for phase in ("execute", "gpu", "wait", *host)}
    assert sum(c[p] for c in found.values() for p in host) == 1
    assert found[("handpicked-2", 14202)]["launch"] == 1
    assert [found[(r, 6000)]["execute"] for r in ("handpicked-1", "handpicked-2")] == [4, 5]
    assert [found[(r, 13500)]["execute"] for r in ("handpicked-1", "handpicked-2")] == [146, 258]
    assert [found[(r, 13500)]["gpu"] for r in ("handpicked-1", "handpicked-2")] == [4, 24]
    assert [found[(r, 16534)]["gpu"] for r in ("handpicked-1", "handpicked-2")] == [454, 610]


def test_the_slower_h100_minilm_call_reads_as_the_docs_say() -> None:
    """docs/benchmarks.md, "A second H100, slower per request": the table read back from the runs (the token
    rows' knee found, no floors), the ceiling from the three runs' consoles, and CPU per request against
    the twenty-first session's H100 (the knee at the same ~10 busy cores, 1.5 x the CPU per request)."""
    ceiling_rps = _ceiling_from_consoles("h100-slower-host-minilm")
    docs, runs = _minilm_call("h100-slower-host-minilm", ceiling_rps)
    texts, tokens, b128 = runs["texts"], runs["tokhttp10"], runs["tokb128"]
    assert not any(r.floor for s in (texts, tokens, b128) for r in s.runs)
    assert len(texts.runs) == 4 and len(tokens.runs) == 6 and len(b128.runs) == 2
    for setting, bold in ((texts, True), (tokens, True), (b128, False)):
        rates = sorted(setting.rates)
        median, ratio = f"{setting.median:,.0f}", f"{setting.median / ceiling_rps:.2f}"
        (row,) = [line for line in docs.splitlines() if f"| {' / '.join(f'{r:,.0f}' for r in setting.rates)} |" in line]
        assert (f"| {f'**{median}**' if bold else median} [{rates[0]:,.0f}-{rates[-1]:,.0f}] | "
                f"{f'**{ratio}**' if bold else ratio} |") in row
    assert max(texts.median, tokens.median) / ceiling_rps < 0.5  # the target missed here
    before = {s.name: s for s in summarize(ROOT / "docs" / "benchmarks" / "h100-minilm-tokens-http")}["texts"]

    cpu_before, cpu_texts = _cpu_ms_per_request(before), _cpu_ms_per_request(texts)
    assert f"| {before.median:,.0f} | {texts.median:,.0f} | {texts.median / before.median:.2f} |" in docs
    assert f"| {cpu_before:.3f} ms | {cpu_texts:.3f} ms | {cpu_texts / cpu_before:.2f} |" in docs
    assert f"(0.290 ms of CPU per request against texts' {cpu_texts:.3f})" in docs
    assert round(_cpu_ms_per_request(tokens), 3) == 0.290


def _rows_read_back(docs: str, settings: tuple[Setting, ...], ceiling_rps: float, rounds: int) -> None:
    """Each setting measured ``rounds`` times with no floors, and its row in ``docs`` (found by its rates, in
    round order) giving its median, range and share of the ceiling."""
    assert all(len(s.runs) == rounds and not any(r.floor for r in s.runs) for s in settings)
    for setting in settings:
        rates = sorted(setting.rates)
        (row,) = [line for line in docs.splitlines() if f"| {' / '.join(f'{r:,.0f}' for r in setting.rates)} |" in line]
        assert (f"| **{setting.median:,.0f}** [{rates[0]:,.0f}-{rates[-1]:,.0f}] | "
                f"**{setting.median / ceiling_rps:.2f}** |") in row


def test_the_third_h100_minilm_call_reads_as_the_docs_say() -> None:
    """docs/benchmarks.md, "A third H100, a quiet host": the table read back from the runs (no floors), the
    target met with texts, and the knee as ~10 cores over the host's CPU per request on three hosts."""
    ceiling_rps = _ceiling_from_consoles("h100-third-host-minilm")
    docs, runs = _minilm_call("h100-third-host-minilm", ceiling_rps)
    texts, tokens = runs["texts"], runs["tokhttp10"]
    _rows_read_back(docs, (texts, tokens), ceiling_rps, rounds=3)
    assert texts.median / ceiling_rps >= 0.5  # the target met here
    hosts = [{s.name: s for s in summarize(ROOT / "docs" / "benchmarks" / name)}["texts"]
             for name in ("h100-third-host-minilm", "h100-minilm-tokens-http", "h100-slower-host-minilm")]
    said = " ".join(docs.split())
    assert ("request (cores busy / rate, medians) for texts: **{:.3f} ms** here, {:.3f} on the twenty-first's H100, "
            "{:.3f} on the twenty-second's; the knees {:,.0f}, {:,.0f} and {:,.0f}").format(
        *map(_cpu_ms_per_request, hosts), *(h.median for h in hosts)) in said
    assert f"The token rows take {_cpu_ms_per_request(tokens):.3f} ms of CPU per request" in said


def test_the_third_h100_tune_winner_against_the_hand_picked_in_the_bench() -> None:
    """docs/tuning.md, "A third H100, a quiet host": the tune's winner at 0.96 of the hand-picked settings
    in three interleaved rounds, no floors, and the calls' fill that tells them apart."""
    folder = ROOT / "docs" / "benchmarks" / "h100-tune-vs-handpicked-3"
    runs = {s.name: s for s in summarize(folder)}
    assert (folder / "summary.md").read_text() == markdown(list(runs.values()))
    tuned, handpicked = runs["tuned"], runs["handpicked"]
    assert not any(r.floor for s in (tuned, handpicked) for r in s.runs) and len(tuned.runs) == len(handpicked.runs) == 3
    docs = " ".join((ROOT / "docs" / "tuning.md").read_text().split())
    by_round = [" / ".join(f"{r.rps:,.0f}" for r in s.by_round) for s in (tuned, handpicked)]
    assert (f"the winner {by_round[0]}, the hand-picked {by_round[1]}: "
            f"**{tuned.median / handpicked.median:.2f}**, no floors") in docs
    assert round(tuned.median / handpicked.median, 2) == 0.96


def test_the_fourth_h100s_texts_over_http_read_as_the_docs_say() -> None:
    """docs/benchmarks.md, "A fourth H100": six interleaved rounds, no floors; HTTP higher in five, its knee
    at fewer busy cores than the gRPC texts' ~10."""
    ceiling_rps = _ceiling_from_consoles("h100-fourth-host-minilm-http")
    docs, runs = _minilm_call("h100-fourth-host-minilm-http", ceiling_rps)
    texts, http = runs["texts"], runs["texthttp"]
    _rows_read_back(docs, (texts, http), ceiling_rps, rounds=6)
    wins = sum(h.rps > t.rps for h, t in zip(http.by_round, texts.by_round, strict=True))
    said = " ".join(docs.split())
    assert wins == 5 and f"higher in five rounds of six, by {100 * (http.median / texts.median - 1):.0f} % (medians)" in said
    assert f"for texts: **{_cpu_ms_per_request(texts):.3f} ms**, at" in said
    assert f"With HTTP, **{_cpu_ms_per_request(http):.3f} ms**, and the knee came at" in said
    assert max(r.cores_busy or 0 for r in http.runs) < min(r.cores_busy or 0 for r in texts.runs)


def test_no_tritonserver_thread_was_saturated_at_the_fourth_h100s_failing_rungs() -> None:
    """docs/benchmarks.md, "A fourth H100": the busiest tritonserver thread at every failing level of the
    twelve runs, from each level's per-thread CPU in bench.json."""
    busiest = []
    for path in sorted((ROOT / "docs" / "benchmarks" / "h100-fourth-host-minilm-http").glob("text*/bench.json")):
        steps = _steps(path.parent)
        busiest += [max(c for _, c in s["extra"]["cpu_threads"]["server:tritonserver"]) for s in steps if not s["passed"]]
    assert len(busiest) >= 12
    said = " ".join((ROOT / "docs" / "benchmarks.md").read_text().split())
    assert f"busiest tritonserver thread read {min(busiest):.2f}-{max(busiest):.2f} of a core at every level that failed" in said


def _knee_and_next(run: Path) -> tuple[dict, dict]:
    """A run's knee (its highest passed level) and the lowest level above it, from its bench.json."""
    steps = _steps(run)
    knee = max((s for s in steps if s["passed"]), key=lambda s: s["achieved_rps"])
    return knee, min((s for s in steps if s["offered_rps"] > knee["offered_rps"]), key=lambda s: s["offered_rps"])


def test_the_fifth_h100_measures_every_target_on_one_host() -> None:
    """docs/benchmarks.md, "A fifth H100", and its targets by host: both models' rows, ceilings and
    peers read back from the runs; BERT-base's knees with the GPU busy and its next rungs missed on p99."""
    folder = ROOT / "docs" / "benchmarks" / "h100-fifth-host"
    docs = (ROOT / "docs" / "benchmarks.md").read_text()
    said, by_host = " ".join(docs.split()), " ".join(_targets_by_host().split())
    ratios = {}
    for model, key, rounds in (("bert-base", "bert_base", 3), ("minilm", "minilm", 5)):
        ceiling_rps = _ceiling_median(folder / model, key)
        runs = {s.name: s for s in summarize(folder / model)}
        assert (folder / model / "summary.md").read_text() == markdown(list(runs.values()))
        _rows_read_back(docs, (runs["texts"], runs["texthttp"]), ceiling_rps, rounds)
        low, peer, high = sorted(
            json.loads((folder / "peer" / f"{model}-{i}" / "bench.json").read_text())["models"][key]["systems"]["peer"]["best_rps"]
            for i in (1, 2, 3))
        assert f"median **{ceiling_rps:,.0f}**" in said and f"median **{peer:,.0f}**" in said
        texts = runs["texts"].median
        ratios[model] = (texts / ceiling_rps, texts / peer, texts / high, texts / low)
    (bert, bert_peer, bert_lo, bert_hi), (mini, mini_peer, mini_lo, mini_hi) = ratios["bert-base"], ratios["minilm"]
    assert bert < 0.75 and bert_peer < 10 and mini >= 0.5 and mini_peer >= 10
    assert f"| **{bert:.2f}, not met** (0.77 of" in said and f"| **{mini:.2f}, met** (texts over gRPC) |" in said
    assert f"| **{bert_peer:.1f}, not met** [{bert_lo:.1f}-{bert_hi:.1f}] |" in said
    assert f"| **{mini_peer:.1f}** [{mini_lo:.1f}-{mini_hi:.1f}], met but for the same-run condition |" in said
    assert f"**{bert:.2f}, not met** (14,135 [14,128-14,786], three rounds" in by_host
    assert f"**{bert_peer:.1f}, not met** (14,135 against 1,602 [1,128-1,602]" in by_host
    assert f"**{mini_peer:.1f}** on the fifth H100 (40,464 against 2,222 [1,328-2,725], the peer in its own runs)" in by_host
    per_batch = [json.loads((folder / "bert-base" / "ceiling" / f"run-{i}" / "bench.json").read_text())
                 ["models"]["bert_base"]["systems"]["ceiling"]["per_batch"] for i in (1, 2, 3)]
    at_64 = statistics.median(b["requests_per_s"] for runs in per_batch for b in runs if b["batch"] == 64)
    assert f"at the bundle's batch cap of 64: {at_64:,.0f})" in said and round(14_135 / at_64, 2) == 0.77
    knees = [_knee_and_next(folder / "bert-base" / f"texts-{i}") for i in (1, 2, 3)]
    busy = sorted(round(knee["extra"]["gpu_util_mean"]) for knee, _ in knees)
    assert f"At every knee the GPU read {busy[0]}-{busy[-1]} % busy (gRPC;" in said
    assert all(nxt["failed"] == 0 and nxt["p99_ms"] > 50 for _, nxt in knees)


def test_the_host_stalls_at_the_knee_and_past_it_are_read_where_the_probe_watched(tmp_path: Path) -> None:
    """Reports from 2026-12-06 on record the host-stall probe per level: the column gives the wake-ups 5+ ms
    late at the knee and at the first missed level past it; older reports print "-"."""
    data = json.loads((ROOT / "docs/benchmarks/h100-instances/i8-1/bench.json").read_text())
    sweep = data["models"]["minilm"]["systems"]["bundle"]["sweep"]
    best = sweep["best"]["offered_rps"]
    past = min(s["offered_rps"] for s in sweep["steps"] if not s["passed"] and s["offered_rps"] > best)
    for step in [*sweep["steps"], sweep["best"]]:
        long_n = 2 if step["offered_rps"] == best else 7 if step["offered_rps"] == past else 0
        step["extra"].update(host_stalls=long_n + 1, host_long_stalls=long_n, host_stall_max_ms=3.0 + 4 * long_n,
                             host_stalled_ms=10.0, host_probe_s=4.0)
    (tmp_path / "probed-1").mkdir()
    (tmp_path / "probed-1" / "bench.json").write_text(json.dumps(data))
    shutil.copytree(ROOT / "docs/benchmarks/h100-instances/i8-1", tmp_path / "before-1")
    runs = {s.name: s.runs[0] for s in summarize(tmp_path)}
    assert runs["probed"].stalls_at_knee == (2, 11.0, None) and runs["probed"].stalls_past_it == (7, 31.0, None)
    assert runs["before"].stalls_at_knee is None and runs["before"].stalls_past_it is None
    rows = {line.split(" | ")[0].strip("| "): line for line in markdown(summarize(tmp_path)).splitlines()[2:]}
    assert "| 2-2 / 7-7 (longest 31 ms) |" in rows["probed"]
    # with the kernel's CPU pressure (reports from 2026-12-07 on): its share at the knee / past it
    for step in [*sweep["steps"], sweep["best"]]:
        step["extra"]["host_cpu_wait"] = 0.02 if step["offered_rps"] <= best else 0.35
    (tmp_path / "probed-1" / "bench.json").write_text(json.dumps(data))
    assert {s.name: s.runs[0] for s in summarize(tmp_path)}["probed"].stalls_past_it == (7, 31.0, 35.0)
    rows = {line.split(" | ")[0].strip("| "): line for line in markdown(summarize(tmp_path)).splitlines()[2:]}
    assert "| 2-2 / 7-7 (longest 31 ms); CPU wait 2-2 / 35-35 % |" in rows["probed"]
    assert rows["before"].count("| - |") >= 1 and "longest" not in rows["before"]


def test_the_ninth_h100s_minilm_call_reads_as_the_docs_say() -> None:
    """docs/benchmarks.md, "A ninth H100, a contended host": four rounds of token rows over HTTP and the
    ceiling after each, read back from the committed runs; every missed level waited for a CPU 30 %+."""
    folder = ROOT / "docs" / "benchmarks" / "h100-ninth-host-minilm"
    runs = {s.name: s for s in summarize(folder / "runs")}
    assert (folder / "summary.md").read_text() == markdown(list(runs.values()))
    tokens, ceiling = runs["tokhttp10"], runs["ceiling"]
    docs = (ROOT / "docs" / "benchmarks.md").read_text()
    assert f"| ceiling (req/s) | {' | '.join(f'{r:,.0f}' for r in ceiling.rates)} | {ceiling.median:,.0f} [" in docs
    assert f"**{tokens.median:,.0f}** [27,337-38,492], **{tokens.median / ceiling.median:.2f} of the ceiling**" in docs
    assert tokens.median / ceiling.median < 0.5 and len(tokens.runs) == 4 and not any(r.floor for r in tokens.runs)
    waits = []
    for i in range(1, 5):
        bundle = json.loads((folder / "runs" / f"tokhttp10-{i}" / "bench.json").read_text())["models"]["minilm"]["systems"]["bundle"]
        waits += [s["extra"]["host_cpu_wait"] for s in bundle["sweep"]["steps"] if not s["passed"]]
    assert len(waits) == 9 and 0.30 <= min(waits) and max(waits) <= 0.41
