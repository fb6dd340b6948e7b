"""Metering: the Prometheus counters, the usage log and ``tritonbundle usage`` agree on every record."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tritonbundle.cli import main
from tritonbundle.cli.gateway import when
from tritonbundle.errors import ConfigError
from tritonbundle.gateway.metering import Meter, Usage, read, report


def _sample(meter: Meter, name: str, **labels: str) -> float:
    value = meter.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_records_reach_prometheus_the_log_and_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "usage.jsonl"
    meter = Meter(log)
    t = time.time()
    records = [
        Usage(t - 7200, "search", "minilm", "ok", 200, texts=2, tokens=30, latency_ms=12.0),  # outside --since 1h
        Usage(t - 10, "search", "minilm", "ok", 200, texts=3, tokens=40, latency_ms=10.0),
        Usage(t - 9, "search", "minilm", "ok", 200, texts=1, tokens=7, latency_ms=20.0),
        Usage(t - 8, "search", "minilm", "refused", 429, reason="rate"),
        Usage(t - 7, "ads", "minilm", "refused", 429, reason="tokens"),
        Usage(t - 6, "(unauthenticated)", "-", "refused", 401, reason="unauthenticated"),
        Usage(t - 5, "ads", "minilm", "invalid", 400),
        Usage(t - 4, "ads", "minilm", "error", 503),
    ]
    for r in records:
        meter.record(r)
    meter.close()
    assert _sample(meter, "tritonbundle_gateway_tokens_total", tenant="search", model="minilm") == 77
    assert _sample(meter, "tritonbundle_gateway_texts_total", tenant="search", model="minilm") == 6
    assert _sample(meter, "tritonbundle_gateway_requests_total", tenant="search", model="minilm", outcome="ok") == 3
    assert _sample(meter, "tritonbundle_gateway_refusals_total", tenant="ads", model="minilm", reason="tokens") == 1
    assert _sample(meter, "tritonbundle_gateway_request_seconds_count", tenant="search", model="minilm") == 3
    assert _sample(meter, "tritonbundle_gateway_refusals_total", tenant="(unauthenticated)", model="-",
                   reason="unauthenticated") == 1
    with open(log, "a") as f:
        f.write('{"time": 1, "tenant": "torn')  # a line cut by a crash is skipped
    assert list(read(log)) == [r for r in records if r.tenant != "(unauthenticated)"]  # anyone can send those
    rows = {(r["tenant"], r["model"]): r for r in report(read(log, since=t - 3600))}
    search = rows[("search", "minilm")]
    assert (search["requests"], search["ok"], search["refused"], search["texts"], search["tokens"]) == (3, 2, 1, 4, 47)
    assert search["refusals"] == {"rate": 1} and search["p50_ms"] == 15.0
    assert (rows[("ads", "minilm")]["invalid"], rows[("ads", "minilm")]["error"]) == (1, 1)
    assert main(["usage", "--log", str(log), "--since", "1h"]) == 0
    table = capsys.readouterr().out
    assert "search" in table and " 47 " in table and "rate 1" in table and "unauthenticated" not in table
    assert main(["usage", "--log", str(log), "--json"]) == 0
    assert sum(r["tokens"] for r in json.loads(capsys.readouterr().out)) == 77


def test_the_usage_log_is_moved_aside_at_its_size_and_read_whole(tmp_path: Path) -> None:
    """A line per request with no bound filled the chart's 1 GiB emptyDir (and got the pod evicted): past
    its size the log goes to <log>.1, replacing the one before, and both are read, the older first."""
    log = tmp_path / "usage.jsonl"
    meter = Meter(log, max_bytes=1000)
    records = [Usage(1_000_000.0 + i, "search", "minilm", "ok", 200, texts=1, tokens=i) for i in range(40)]
    for r in records:
        meter.record(r)
    meter.close()
    aside = log.with_name("usage.jsonl.1")
    assert aside.exists() and aside.stat().st_size < 1200 and log.stat().st_size < 1000
    kept = list(read(log))
    assert len(kept) >= 8 and kept == records[-len(kept):], "the newest lines, in order, the older file first"


def test_the_log_size_flag_takes_whole_megabytes_above_zero(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["gateway", "--usage-log-max-mb", "0"])
    assert "argument --usage-log-max-mb: 0 must be more than 0" in capsys.readouterr().err


def test_usage_windows_read_durations_and_iso_times() -> None:
    assert abs(when("2h") - (time.time() - 7200)) < 5
    assert when("2026-12-01T00:00:00") == when("2026-12-01T00:00:00+00:00") == 1796083200.0
    with pytest.raises(ConfigError, match="neither a duration"):
        when("yesterday")


def test_a_usage_log_that_cannot_be_written_is_counted_and_the_request_still_answered(tmp_path: Path) -> None:
    """A full disk (ENOSPC) made every /v1 request a 500 after Triton had answered it."""
    import errno

    meter = Meter(tmp_path / "usage.jsonl")

    class Full:
        def write(self, line: str) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        def tell(self) -> int:
            return 0

    meter._log = Full()  # type: ignore[assignment]
    for _ in range(3):
        meter.record(Usage(0.0, "alpha", "minilm", "ok", 200, 1, 3, 5.0))
    errors = sum(s.value for m in meter.log_errors.collect() for s in m.samples if s.name.endswith("_total"))
    requests = sum(s.value for m in meter.requests.collect() for s in m.samples if s.name.endswith("_total"))
    assert errors == 3 and requests == 3


def test_a_rotation_that_cannot_move_the_log_keeps_it_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """_rotate closed the log, then os.replace failed (a read-only remount): every later write raised
    ValueError on the closed file, which no handler caught, and every request was a 500."""
    import errno
    import os

    from tritonbundle.gateway import metering

    def refused(*args: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    meter = Meter(tmp_path / "usage.jsonl", max_bytes=10)
    monkeypatch.setattr(metering.os, "replace", refused)
    for _ in range(3):
        meter.record(Usage(0.0, "alpha", "minilm", "ok", 200, 1, 3, 5.0))
    monkeypatch.setattr(metering.os, "replace", os.replace)
    errors = sum(s.value for m in meter.log_errors.collect() for s in m.samples if s.name.endswith("_total"))
    assert errors == 3 and len((tmp_path / "usage.jsonl").read_text().splitlines()) == 3, "each line was written"
