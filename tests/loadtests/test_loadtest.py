"""Load tests: shapes and gates as units, Locust users in-process (global event hooks reset after
each test), and bounded headless runs against the real CPU server."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tritonbundle.errors import ConfigError
from tritonbundle.loadtests.report import best_level, evaluate_gates
from tritonbundle.loadtests.settings import LoadSettings, shape_users
from tritonbundle.measure.latency import Slo


def test_step_shape_climbs_in_four_steps_and_ends() -> None:
    users = [shape_users("step", 8, 40, t) for t in (0, 9, 10, 25, 39)]
    assert users == [2, 2, 4, 6, 8]
    assert shape_users("step", 8, 40, 40) is None


def test_spike_shape_spikes_in_the_middle() -> None:
    assert [shape_users("spike", 20, 100, t) for t in (10, 45, 59, 61, 99)] == [5, 20, 20, 5, 5]


def test_settings_validate_and_pick_user_classes() -> None:
    assert LoadSettings(grpc_url=None).user_classes() == ["HttpUser"]
    assert LoadSettings(mode="open").user_classes() == ["OpenHttpUser", "OpenGrpcUser"]
    with pytest.raises(ConfigError, match="mode must be one of closed, open"):
        LoadSettings(mode="burst")
    with pytest.raises(ConfigError, match="at least one of --http-url and --grpc-url"):
        LoadSettings(http_url=None, grpc_url=None)


def _summary(p95: float, p99: float, failures: int = 0) -> dict[str, Any]:
    row = {"requests": 100, "failures": failures, "failure_ratio": failures / 100, "throughput_rps": 10.0,
           "p95_ms": p95, "p99_ms": p99}
    return {"by_protocol": {"http": row, "grpc": row}, "total": row}


def test_gates_name_every_broken_threshold() -> None:
    gates = evaluate_gates(_summary(120, 300, failures=2), Slo(p95_ms=100, p99_ms=250, max_failure_ratio=0.01))
    assert not gates["passed"]
    assert "http: p95 120.0 ms > SLO 100 ms" in gates["failures"]
    assert "grpc: p99 300.0 ms > SLO 250 ms" in gates["failures"]
    assert any("failure ratio 0.020 > 0.01" in f for f in gates["failures"])
    assert evaluate_gates(_summary(50, 90), Slo(p95_ms=100, p99_ms=250))["passed"]


def test_sweep_picks_the_highest_throughput_that_met_the_slo() -> None:
    results = [
        {"level": 1, "total": {"throughput_rps": 5.0}, "gates": {"passed": True}},
        {"level": 4, "total": {"throughput_rps": 18.0}, "gates": {"passed": True}},
        {"level": 16, "total": {"throughput_rps": 25.0}, "gates": {"passed": False}},
    ]
    assert best_level(results)["level"] == 4  # type: ignore[index]
    assert best_level(results[2:]) is None


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_users_fire_request_events_into_locust_stats(server: Any, fresh_locust_events: Any, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from locust.env import Environment

    from tritonbundle.loadtests import locustfile

    monkeypatch.setattr(locustfile, "SETTINGS", LoadSettings(http_url=server.http_url, grpc_url=server.grpc_url,
                                                            input="both", report_dir=str(tmp_path),
                                                            slo=Slo(p99_ms=60_000)))
    fresh_locust_events.request.add_listener(_sentinel)
    env = Environment(user_classes=[locustfile.HttpUser, locustfile.GrpcUser], events=fresh_locust_events)
    env.create_local_runner()  # hooks Locust's statistics to events.request
    for cls in (locustfile.HttpUser, locustfile.GrpcUser):
        user = cls(env)
        user.on_start()
        for _ in range(4):
            user.one_request()
        user.on_stop()
    env.runner.quit()  # type: ignore[union-attr]
    keys = set(env.stats.entries)
    assert keys == {("text", "http"), ("tokens", "http"), ("text", "grpc"), ("tokens", "grpc")}
    assert env.stats.total.num_requests == 8 and env.stats.total.num_failures == 0
    fresh_locust_events.quitting.fire(environment=env)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["gates"]["passed"] and env.process_exit_code == 0
    assert set(summary["by_protocol"]) == {"http", "grpc"}
    assert sum(row["requests"] for row in summary["timeline"]) == 8


def _sentinel(**_: Any) -> None:
    """A listener the test above adds to Locust's global hooks."""


def test_global_hooks_were_restored_after_the_previous_test() -> None:
    import locust

    assert _sentinel not in locust.events.request._handlers


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_bounded_run_records_both_protocols_and_writes_the_report(server: Any, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from tritonbundle.loadtests import runner

    settings = LoadSettings(http_url=server.http_url, grpc_url=server.grpc_url, metrics_url=server.metrics_url,
                            users=4, duration_s=12, report_dir=str(tmp_path / "report"), input="both",
                            traffic=str(Path(__file__).resolve().parents[2] / "build" / "traffic" / "chat.jsonl"),
                            slo=Slo(max_failure_ratio=0.0))
    result = runner.run(settings)
    summary = result.summary
    assert result.exit_code == 0, summary["gates"]
    for protocol in ("http", "grpc"):
        assert summary["by_protocol"][protocol]["requests"] > 10
        assert summary["by_protocol"][protocol]["failures"] == 0
        for p in ("p50_ms", "p90_ms", "p95_ms", "p99_ms"):
            assert summary["by_protocol"][protocol][p] > 0
    names = {p.name for p in result.report_dir.iterdir()}
    assert {"locust_stats.csv", "locust_stats_history.csv", "report.html", "summary.json", "timeline.csv",
            "throughput.png", "latency.png", "server.png"} <= names
    encoder = next(v for v in summary["server"] if v["model"] == "minilm_encoder")
    assert encoder["requests"] == summary["total"]["requests"]
    assert encoder["avg_batch_size"] >= 1.0 and encoder["compute_ms_per_request"] > 0
    # The Python backend's hand-over around the stub's round trip, as Triton counts it: the tokenizer's
    # requests staged in shared memory (compute_input) and its responses sent (compute_output).
    tokenizer = next(v for v in summary["server"] if v["model"] == "minilm_tokenizer")
    assert tokenizer["compute_input_ms_per_request"] > 0 and tokenizer["compute_output_ms_per_request"] > 0

    # The charts' data: 1 s rows from the first request to the last answer, every request in one row.
    window, rows = summary["window"], summary["timeline"]
    assert window["sending_s"] == pytest.approx(12, abs=0.2) == summary["duration_s"]
    assert [r["t"] for r in rows] == [float(i) for i in range(len(rows))] and len(rows) >= 12
    assert rows[-1]["t"] + rows[-1]["dt"] == pytest.approx(window["wall_s"])
    assert sum(r["requests"] for r in rows) == summary["total"]["requests"]
    assert all(r["users"] == 4 for r in rows[1:12])
    assert all(r["p99_ms"] > 0 if r["requests"] else r["p99_ms"] is None for r in rows)  # none failed: finite
    page = (result.report_dir / "report.html").read_text()
    assert f"http://{server.http_url} (HTTP), grpc://{server.grpc_url} (gRPC)" in page

    # Progress while it ran: time, sent, failed, rate and the last window's p99, on the console.
    progress = [line for line in capsys.readouterr().err.splitlines() if re.match(r"loadtest: +\d+ s +sent", line)]
    assert len(progress) >= 4, progress
    assert re.search(r"sent \d+ +failed 0 +[\d.]+ req/s answered, [\d.]+ sent +p99 \d+ ms \(last 2 s\)", progress[-1])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_open_model_achieves_the_offered_rate_over_the_sending_window(server: Any, tmp_path: Path) -> None:
    from tritonbundle.loadtests import runner

    settings = LoadSettings(http_url=server.http_url, grpc_url=None, mode="open", rate=6.0, users=2, duration_s=10,
                            report_dir=str(tmp_path), slo=Slo(max_failure_ratio=0.0))
    summary = runner.run(settings).summary
    window, rate = summary["window"], summary["rate"]
    figures = {"window": window, "rate": rate, "failures": summary["total"]["failures"]}
    print(f"\nopen model: {figures}")
    assert summary["total"]["failures"] == 0, summary["errors"]
    # Rates are over the sending window (10 s), not over the wall time that includes the drain.
    assert window["sending_s"] == pytest.approx(10, abs=0.2) == rate["offered_over_s"] == rate["achieved_over_s"]
    assert window["wall_s"] == pytest.approx(window["sending_s"] + window["drain_s"])
    assert rate["offered_rps"] == pytest.approx(6.0, rel=0.4)  # ~60 Poisson arrivals
    assert rate["achieved_rps"] == pytest.approx(rate["offered_rps"], rel=0.05), figures
    assert summary["total"]["throughput_rps"] == rate["achieved_rps"] and summary["duration_s"] == window["sending_s"]
    assert sum(r["sent"] for r in summary["timeline"]) == summary["total"]["requests"]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_impossible_slo_exits_nonzero_and_a_loose_one_exits_zero(server: Any, tmp_path: Path) -> None:
    from tritonbundle.cli import main

    common = ["loadtest", "--protocol", "grpc", "--grpc-url", server.grpc_url, "--users", "2", "--duration-s", "5"]
    assert main([*common, "--slo-p99-ms", "1", "--out", str(tmp_path / "strict")]) == 1
    assert main([*common, "--slo-p99-ms", "60000", "--out", str(tmp_path / "loose")]) == 0
    strict = json.loads((tmp_path / "strict" / "summary.json").read_text())
    assert any("p99" in f and "> SLO 1 ms" in f for f in strict["gates"]["failures"])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_open_model_sweep_reports_the_best_level(server: Any, tmp_path: Path) -> None:
    from tritonbundle.cli import main

    code = main(["loadtest", "--protocol", "http", "--http-url", server.http_url, "--mode", "open", "--users", "1",
                 "--sweep", "2,6", "--duration-s", "5", "--slo-p99-ms", "60000", "--out", str(tmp_path)])
    assert code == 0
    sweep = json.loads((tmp_path / "sweep.json").read_text())
    assert [lvl["level"] for lvl in sweep["levels"]] == [2.0, 6.0]
    assert sweep["best"]["level"] == 6.0
    assert (tmp_path / "sweep.png").exists()


def test_fewer_users_than_protocols_is_refused_naming_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"1 user\(s\) cannot cover the 2 protocols \(http and grpc\).*--users 2"):
        LoadSettings(users=1)
    assert LoadSettings(users=1, grpc_url=None).protocols == ["http"]


def test_a_targeted_protocol_that_sent_nothing_fails_the_gate() -> None:
    summary = _summary(50, 90)
    summary["hosts"] = {"http": "http://127.0.0.1:8000", "grpc": "grpc://127.0.0.1:8001"}
    del summary["by_protocol"]["http"]  # one user, and it spoke gRPC
    gates = evaluate_gates(summary, Slo(p99_ms=250))
    assert not gates["passed"] and gates["failures"] == ["http: no requests were sent"]


def test_load_shapes_keep_one_user_per_protocol_and_scale_the_open_models_rate() -> None:
    assert [shape_users("step", 2, 40, t, minimum=2) for t in (0, 39)] == [2, 2]
    both = LoadSettings(users=4, shape="spike", duration_s=100, mode="open", rate=60)
    assert [both.users_at(t) for t in (10, 50)] == [2, 4]  # a quarter of 4 is 1: one per protocol instead
    spike = LoadSettings(users=20, shape="spike", duration_s=100, mode="open", rate=60)
    assert [spike.rate_at(t) for t in (10, 50, 70)] == [15.0, 60.0, 15.0]  # the rate follows the users
    step = LoadSettings(users=8, shape="step", duration_s=40, mode="open", rate=40)
    assert [step.rate_at(t) for t in (0, 10, 20, 30)] == [10.0, 20.0, 30.0, 40.0]
    assert LoadSettings(mode="open", rate=40, shape="soak").rate_at(5) == 40.0


@pytest.mark.parametrize(("flags", "message"), [
    (["--search", "abc"], "argument --search: 'abc' is not a number"),
    (["--sweep", "1,x"], "argument --sweep: 'x' is not a number"),
    (["--sweep", ","], "argument --sweep: ',' names no level"),
    (["--rate", "0"], "argument --rate: 0 must be more than 0"),
    (["--users", "0"], "argument --users: 0 must be more than 0"),
])
def test_bad_flag_values_are_one_line_usage_errors(flags: list[str], message: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from tritonbundle.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["loadtest", *flags])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and "Traceback" not in err


@pytest.mark.parametrize(("flags", "message"), [
    (["--sweep", "1,4"], "sweep level 1: 1 user(s) cannot cover the 2 protocols"),
    (["--sweep", "2.5"], "closed-model sweep levels are users, whole numbers: 2.5 is not"),
    (["--search", "5"], "a rate search needs the open model (--mode open)"),
])
def test_settings_a_sweep_or_search_cannot_run_are_refused_before_any_run(
        flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tritonbundle.cli import main
    from tritonbundle.loadtests import runner

    monkeypatch.setattr(runner, "preflight", lambda settings: pytest.fail("checked the server first"))
    assert main(["loadtest", *flags, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_load_shape_leaves_the_end_to_the_window_and_every_request_sent_is_reported(server: Any,
                                                                                     tmp_path: Path) -> None:
    from tritonbundle.loadtests import runner

    settings = LoadSettings(http_url=server.http_url, grpc_url=None, mode="open", rate=20.0, users=2, duration_s=5,
                            shape="soak", report_dir=str(tmp_path), slo=Slo(max_failure_ratio=0.0))
    summary = runner.run(settings).summary
    assert summary["total"]["failures"] == 0, summary["errors"]
    assert summary["window"]["sending_s"] == pytest.approx(5, abs=0.3)  # the window's, not Locust's clock
    assert summary["sent"] == summary["total"]["requests"] > 0, "requests in flight at the end were reported"
