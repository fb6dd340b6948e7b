"""The load-test report from recorded requests, no server: rates over the sending window, the
per-second timeline, progress lines, the charts and the self-contained HTML page."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from tritonbundle.loadtests import charts, htmlreport, timeline
from tritonbundle.loadtests.recorder import Recorder
from tritonbundle.loadtests.report import evaluate_gates, finite, summarize, unanswered
from tritonbundle.loadtests.runner import describe, step_from
from tritonbundle.loadtests.settings import LoadSettings
from tritonbundle.measure.latency import Slo, percentile

T0 = 1_800_000_000.0


def _open_run() -> tuple[Recorder, LoadSettings]:
    """A 10 s open-model run at 3 requests/s: 30 answered in 58-60 ms, then 3 more sent in the last
    second that the server answers 7 s after the stop (the drain)."""
    recorder = Recorder()
    recorder.begin(T0)
    for i in range(30):
        recorder.add("http", "text", 60.0 - i % 3, True, sent_at=T0 + i / 3)
    for i in range(3):
        recorder.add("http", "text", (7.0 - i * 0.2) * 1000 + 500, True, sent_at=T0 + 9.5 + i * 0.1)
    recorder.end(T0 + 10.0)
    return recorder, LoadSettings(mode="open", rate=3.0, grpc_url=None, duration_s=10, slo=Slo(p99_ms=10_000))


def test_rates_are_over_the_sending_window_not_the_wall_time_with_the_drain() -> None:
    recorder, settings = _open_run()
    summary = summarize(recorder, settings)
    assert summary["duration_s"] == pytest.approx(10.0)
    assert summary["window"]["drain_s"] == pytest.approx(7.0, abs=0.01)
    assert summary["window"]["wall_s"] == pytest.approx(17.0, abs=0.01)
    rate = summary["rate"]
    assert rate["target_rps"] == 3.0 and rate["offered_over_s"] == rate["achieved_over_s"] == pytest.approx(10.0)
    assert rate["offered_rps"] == pytest.approx(3.3)  # 33 sent in the 10 s window
    # 30 answered within the window shifted by the median latency (59 ms); 3 answered late in the drain.
    assert summary["window"]["answer_delay_s"] == pytest.approx(0.059) and rate["achieved_rps"] == pytest.approx(3.0)
    assert summary["total"]["throughput_rps"] == rate["achieved_rps"]  # what step_from and describe read
    assert summary["total"]["requests"] == 33 and summary["hosts"] == {"http": "http://127.0.0.1:8000"}


def test_a_server_that_falls_behind_is_credited_with_its_own_rate_not_the_backlog() -> None:
    recorder = Recorder()
    recorder.begin(T0)
    for i in range(100):  # 10/s offered for 10 s; the server answers one every 0.2 s, in order
        recorder.add("grpc", "text", (i / 10 + 0.1) * 1000, True, sent_at=T0 + i / 10)
    recorder.end(T0 + 10.0)
    summary = summarize(recorder, LoadSettings(mode="open", rate=10.0, http_url=None))
    assert summary["rate"]["offered_rps"] == pytest.approx(10.0)
    assert summary["rate"]["achieved_rps"] == pytest.approx(5.0, abs=0.2)  # not 100 answers / 10 s
    assert summary["window"]["drain_s"] == pytest.approx(9.9, abs=0.01)


def test_requests_left_in_flight_when_the_users_stopped_fail_the_gate_and_the_level() -> None:
    """33 recorded, 36 sent: the 3 killed with their users in flight are neither answers nor failures in
    the recorder; the gate, the console and the rate search's level count them as failed."""
    recorder, settings = _open_run()
    summary = summarize(recorder, settings)
    summary["sent"] = 36
    summary["unanswered"] = unanswered(summary)
    summary["gates"] = gates = evaluate_gates(summary, settings.slo)
    assert summary["unanswered"] == 3 and not gates["passed"]
    assert gates["failures"] == ["3 request(s) unanswered: sent, but neither answered nor failed when the users "
                                 "were stopped after the drain (each counts as failed)"]
    assert "unanswered: 3 request(s) still in flight" in describe(summary)
    level = step_from(summary, offered_rps=3.0)
    assert (level.sent, level.failed, level.completed) == (36, 3, 33)
    summary["sent"] = 33  # every request sent was recorded: nothing to say
    assert unanswered(summary) == 0 and evaluate_gates(summary, settings.slo)["passed"]


def test_timeline_spans_the_run_in_one_second_rows_with_exact_percentiles() -> None:
    recorder, settings = _open_run()
    rows = summarize(recorder, settings)["timeline"]
    assert [r["t"] for r in rows] == [float(i) for i in range(17)]
    assert all(r["dt"] == 1.0 for r in rows[:-1]) and rows[-1]["t"] + rows[-1]["dt"] == pytest.approx(17.0, abs=0.01)
    assert sum(r["sent"] for r in rows) == sum(r["requests"] for r in rows) == 33
    assert [r["sent"] for r in rows[:10]] == [3, 3, 3, 3, 3, 3, 3, 3, 3, 6]
    assert rows[1]["p99_ms"] == pytest.approx(percentile([58.0, 59.0, 60.0], 99))  # exact, not bucketed
    assert rows[12]["requests"] == 0 and rows[12]["p99_ms"] is None and rows[12]["offered_rps"] == 0


def test_a_window_with_over_1_percent_failures_has_an_infinite_p99() -> None:
    recorder = Recorder()
    recorder.begin(T0)
    for i in range(10):
        recorder.add("grpc", "text", 20.0, i != 3, sent_at=T0 + 0.05 * i)
    recorder.end(T0 + 1.0)
    row = timeline.of(recorder)[0]
    assert row["requests"] == 10 and row["failures"] == 1 and row["achieved_rps"] == 9.0
    assert row["p50_ms"] == 20.0 and math.isinf(row["p99_ms"])
    assert finite(row)["p99_ms"] is None  # JSON: None in a row with requests means infinite


def test_a_stop_a_few_ms_past_a_whole_second_joins_the_last_row() -> None:
    recorder = Recorder()
    recorder.begin(T0)
    recorder.add("http", "text", 10.0, True, sent_at=T0 + 2.5)
    recorder.end(T0 + 3.004)
    rows = timeline.of(recorder)
    assert [r["t"] for r in rows] == [0.0, 1.0, 2.0] and rows[-1]["dt"] == pytest.approx(1.004)


def test_progress_line_says_time_sent_failed_rate_and_the_last_windows_p99() -> None:
    line = timeline.progress_line(10.2, 120, 1, 2.0, 25, [40.0] * 23 + [math.inf], users=8)
    assert line.startswith("loadtest:")  # the runner echoes these to the console
    assert re.search(r"10 s\s+sent 120\s+failed 1\s+11\.5 req/s answered, 12\.5 sent\s+p99 inf \(failures\) "
                     r"\(last 2 s\)\s+users 8", line), line
    assert "p99 40 ms" in timeline.progress_line(4, 10, 0, 2.0, 10, [40.0] * 10)
    assert timeline.progress_every_s(10) == 2.0 and timeline.progress_every_s(60) == 5.0


def _summary() -> dict[str, Any]:
    recorder, settings = _open_run()
    summary = summarize(recorder, settings, [{"method": "http", "name": "text", "error": "<boom> & bust",
                                              "occurrences": 2}])
    summary["gates"] = evaluate_gates(summary, settings.slo)
    return dict(json.loads(json.dumps(finite(summary))))  # as the runner reads it back


def test_html_report_names_the_host_and_draws_the_summary_offline() -> None:
    summary = _summary()
    page = htmlreport.render(summary)
    assert "Target host</dt><dd>http://127.0.0.1:8000 (HTTP)" in page
    assert "3.30 requests/s sent vs 3.00 answered/s, both over the 10.0 s sending window (target 3/s)" in page
    assert page.count("<svg") == 1 and "&lt;boom&gt; &amp; bust" in page
    # Self-contained: nothing is fetched (no scripts, styles, images or fonts from elsewhere; the SVG's
    # own references are to fragments of the page: url(#id), href="#id").
    assert not re.search(r"""(src|href)\s*=\s*["'](?!#)|@import|url\((?!#)|<link|<iframe""", page, re.IGNORECASE)
    embedded = re.search(r'<script type="application/json" id="summary">(.*?)</script>', page, re.DOTALL)
    assert embedded and json.loads(embedded.group(1).replace("<\\/", "</")) == summary


def test_charts_are_written_from_the_summary(tmp_path: Path) -> None:
    summary = _summary()
    summary["timeline"][12]["failures"], summary["timeline"][12]["requests"] = 1, 1  # an infinite p99 window
    written = charts.write_pngs(tmp_path, summary)
    assert [p.name for p in written] == ["latency.png", "throughput.png"]
    assert all(p.stat().st_size > 10_000 for p in written)
