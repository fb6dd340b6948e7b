"""docs/benchmarks.md, "An eleventh H100: MiniLM's knee moves with the cores below ten": the committed
reports of the session-35 calls read back. The same token-row setting on 6, 10 and 16 CPUs (taskset),
interleaved: the knee falls with the cores where the bundle's CPU does not fit, and on all 16 the GPU
fills at the launches' own cost per row; fourteen instances reach that limit."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from tests.bench.reports import docs_said, settings_in
from tritonbundle.bench.compare import Setting, markdown

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "docs" / "benchmarks" / "h100-eleventh-host-minilm-cores"


def _rates(s: Setting) -> list[float]:
    return [r.rps or 0.0 for r in s.by_round]


def test_the_calls_read_as_the_docs_say() -> None:
    settings = settings_in(FOLDER / "runs")
    assert (FOLDER / "summary.md").read_text() == markdown(list(settings.values()))
    docs = docs_said()
    for name, label in (("cores6", "| 6 (5) |"), ("cores10", "| 10 (3; rounds 3-5) |"), ("cores16", "| 16 (8) |"),
                        ("inst14", "| 16, fourteen instances (3; rounds 6-8) |")):
        s = settings[name]
        assert not any(r.floor for r in s.runs)
        rates = _rates(s)
        assert (f"{label} {' / '.join(f'{r:,.0f}' for r in rates)} | **{s.median:,.0f}** "
                f"[{min(rates):,.0f}-{max(rates):,.0f}]") in docs, name
    ceiling = settings["ceiling"]
    assert round(settings["cores16"].median / ceiling.median, 2) == 0.55 >= 0.5
    assert round(settings["inst14"].median / ceiling.median, 2) == 0.59


def test_each_setting_ran_on_the_cpus_its_name_says() -> None:
    """The report's environment records the CPUs the run could use (sched_getaffinity under taskset)."""
    for run in sorted((FOLDER / "runs").iterdir()):
        allowed = json.loads((run / "bench.json").read_text())["environment"]["cpus_allowed"]
        name = run.name.rsplit("-", 1)[0]
        assert allowed == {"cores6": 6, "cores10": 10}.get(name, 16), run.name


def test_the_knee_falls_with_the_cores_and_the_gpu_fills_on_all_of_them() -> None:
    settings = settings_in(FOLDER / "runs")
    full = {r.round: r.rps or 0.0 for r in settings["cores16"].by_round}
    six = [(r.rps or 0.0) / full[r.round] for r in settings["cores6"].by_round]
    ten = [(r.rps or 0.0) / full[r.round] for r in settings["cores10"].by_round]
    assert max(six) < 0.65 and max(ten) < 0.91 and max(six) < min(ten), (six, ten)
    docs = docs_said()
    assert f"| {' / '.join(f'{x:.2f}' for x in six)} |" in docs and f"| {' / '.join(f'{x:.2f}' for x in ten)} |" in docs
    assert f"(median {statistics.median(six):.2f})" in docs
    # on 6 CPUs the GPU idles half the time; on 16 it is busy at what the launches cost alone
    gpu_six = [(r.rps or 0.0) * (r.gpu_busy_per_row or 0.0) / 1000 for r in settings["cores6"].runs]
    gpu_full = [(r.rps or 0.0) * (r.gpu_busy_per_row or 0.0) / 1000 for r in settings["cores16"].runs]
    assert max(gpu_six) < 0.7 and min(gpu_full) > 0.8, (gpu_six, gpu_full)
    assert all((r.gpu_alone_per_row or 0.0) >= (r.gpu_busy_per_row or 1.0) for r in settings["cores16"].runs)
    idle = [(r.host_capacity or 0.0) - (r.cores_busy or 0.0) for r in settings["cores16"].runs]
    assert f"The knees left {min(idle):.1f}-{max(idle):.1f} cores' worth" in docs


def test_fourteen_instances_come_close_to_what_the_gpu_answers_at_these_launches() -> None:
    settings = settings_in(FOLDER / "runs")
    ten = {r.round: r.rps or 0.0 for r in settings["cores16"].by_round}
    fourteen = settings["inst14"].by_round
    assert all((r.rps or 0.0) >= ten[r.round] - 20 for r in fourteen)  # one ladder level apart at most
    busy = statistics.median(r.gpu_busy_per_row or 0.0 for r in settings["inst14"].runs)
    limit = 1000 / busy
    assert round(busy, 4) == 0.0215 and f"~{round(limit, -2):,.0f} (1 / {busy:.4f} ms" in docs_said()
    assert all(0.95 * limit < (r.rps or 0.0) < limit for r in fourteen), limit
