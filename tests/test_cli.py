from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from tritonbundle.cli import main


def test_help_lists_every_stage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for command in ("export", "plan", "repo", "build", "serve", "infer", "health", "models", "demo"):
        assert command in out


def test_help_does_not_import_torch_or_tensorrt() -> None:
    code = "import sys; from tritonbundle.cli import main\ntry: main(['build', '--help'])\nexcept SystemExit: pass\nprint(sorted(m for m in ('torch', 'tensorrt', 'locust') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("[]")


def test_user_error_prints_one_line_without_traceback(capsys: pytest.CaptureFixture[str], tmp_path: object) -> None:
    code = main(["plan", "--manifest", "does/not/exist.yaml"])
    err = capsys.readouterr().err
    assert code == 2
    assert "tritonbundle plan: error: manifest does/not/exist.yaml does not exist" in err
    assert "Traceback" not in err


def test_unreachable_server_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    from tritonbundle.proc import free_port

    port = free_port()
    code = main(["infer", "--url", f"127.0.0.1:{port}", "--timeout-s", "1", "hello"])
    err = capsys.readouterr().err
    assert code == 1
    assert f"127.0.0.1:{port}" in err or "cannot reach" in err or "not ready" in err
    assert "Traceback" not in err


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command's parser, by its command line (``bench gpu`` included)."""
    from tritonbundle.cli import parser

    out: dict[str, argparse.ArgumentParser] = {}

    def walk(p: argparse.ArgumentParser, prefix: str) -> None:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    out[f"{prefix} {name}".strip()] = child
                    walk(child, f"{prefix} {name}")

    walk(parser(), "")
    return out


#: One flag per concept (tritonbundle/cli/args.py): the argument's destination -> its one visible spelling.
CONCEPTS = {"slo_p99_ms": "--slo-p99-ms", "slo_p95_ms": "--slo-p95-ms", "max_failure_ratio": "--max-failure-ratio",
            "start_rate": "--start-rate", "rate_factor": "--rate-factor", "window_s": "--window-s",
            "traffic_shape": "--traffic-shape", "traffic": "--traffic", "url": "--url", "api_key_env": "--api-key-env"}
OLD_SPELLINGS = {"--slo-ms", "--ladder-start", "--ladder-factor", "--duration-s", "--synthetic"}


def test_every_command_spells_a_concept_the_same_way_and_shows_its_defaults() -> None:
    parsers = _parsers()
    assert {"loadtest", "tune", "bench gpu", "traffic", "infer", "health", "models", "serve", "init"} <= set(parsers)
    budgets = {}
    for command, p in parsers.items():
        text = p.format_help()
        for action in p._actions:
            visible = action.help != argparse.SUPPRESS
            if visible and action.dest in CONCEPTS and action.option_strings:
                assert action.option_strings == [CONCEPTS[action.dest]], (command, action.option_strings)
            if not visible:
                continue
            assert not OLD_SPELLINGS & set(action.option_strings), (command, action.option_strings)
            if action.dest == "max_failure_ratio":
                budgets[command] = action.default
            shown = action.option_strings and action.default not in (None, False, [], (), argparse.SUPPRESS)
            if shown and action.help:  # this action's own help line, as --help prints it
                assert "default" in p._get_formatter()._get_help_string(action) % {
                    **vars(action), "prog": p.prog, "default": action.default}, (command, action.dest)
        if command == "loadtest":  # step/spike is the load's shape, not the traffic's
            assert "--load-shape" in text and "--traffic-shape" in text
    assert set(budgets.values()) == {0.01}, budgets  # one failure budget by default: loadtest, tune, bench gpu


def test_earlier_spellings_still_work_as_hidden_aliases() -> None:
    from tritonbundle.cli import parser

    old = parser().parse_args(["loadtest", "--duration-s", "7", "--synthetic", "bimodal", "--shape", "spike",
                               "--slo-ms", "30", "--search", "5"])
    assert (old.window_s, old.traffic_shape, old.load_shape, old.slo_p99_ms, old.search) == (7.0, "bimodal", "spike",
                                                                                             30.0, 5.0)
    bench = parser().parse_args(["bench", "gpu", "--slo-ms", "40", "--ladder-start", "3", "--ladder-factor", "2"])
    from tritonbundle.cli.bench import _start_rates

    assert (bench.slo_p99_ms, _start_rates(bench.start_rate), bench.rate_factor) == (40.0, (3.0, {}), 2.0)


def test_bench_starts_each_named_system_at_its_own_rate(tmp_path: Path) -> None:
    from tritonbundle.bench.options import BenchOptions
    from tritonbundle.cli.bench import _start_rates
    from tritonbundle.errors import ConfigError

    assert _start_rates("6400,peer=200") == (6400.0, {"peer": 200.0})
    assert _start_rates("peer=200") == (50.0, {"peer": 200.0})
    options = BenchOptions(out=tmp_path, ladder_start=6400, start_rates={"peer": 200}, max_rate=25600, ladder_factor=2)
    assert (options.start_rate("peer"), options.start_rate("bundle")) == (200.0, 6400.0)
    for bad in ({"perr": 200.0}, {"peer": 0.0}):
        with pytest.raises(ConfigError, match="--start-rate"):
            BenchOptions(out=tmp_path, start_rates=bad)


def test_health_against_a_closed_port_answers_at_once_naming_the_address(capsys: pytest.CaptureFixture[str]) -> None:
    import time

    from tritonbundle.proc import free_port

    port = free_port()
    start = time.monotonic()
    code = main(["health", "--url", f"127.0.0.1:{port}"])
    took = time.monotonic() - start
    err = capsys.readouterr().err
    assert code == 1 and took < 1.0, took
    assert f"127.0.0.1:{port}" in err and "tritonbundle serve" in err
    start = time.monotonic()
    assert main(["models", "--url", f"127.0.0.1:{port}"]) == 1
    assert time.monotonic() - start < 3.0
    err = capsys.readouterr().err
    assert f"cannot reach a server at 127.0.0.1:{port}" in err and "Traceback" not in err


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_models_works_against_a_fresh_serve_that_made_up_its_key(repository: object, tmp_path: object) -> None:
    """`serve` without $TRITONBUNDLE_API_KEY locks the repository API with a random key and writes it where
    the client commands look (readable by the user only): `models` then works with nothing set."""
    import json
    import os
    import signal
    import stat
    import time
    from pathlib import Path

    from tritonbundle.proc import free_ports

    tmp = Path(str(tmp_path))
    env = {k: v for k, v in os.environ.items() if k != "TRITONBUNDLE_API_KEY"} | {"XDG_STATE_HOME": str(tmp / "state")}
    http, grpc, metrics = free_ports(3)
    ready = tmp / "ready.json"
    serve = subprocess.Popen(
        [sys.executable, "-m", "tritonbundle", "serve", "--repository", str(repository), "--http-port", str(http),
         "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--log-file", str(tmp / "tritonserver.log"),
         "--ready-file", str(ready), "--canary-interval-s", "0"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while not ready.exists() and serve.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert ready.exists(), "serve did not become ready"
        key = tmp / "state" / "tritonbundle" / "keys" / f"127.0.0.1_{http}.key"
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
        for protocol, port in (("http", http), ("grpc", grpc)):
            listed = subprocess.run([sys.executable, "-m", "tritonbundle", "models", "--json", "--protocol", protocol,
                                     "--url", f"127.0.0.1:{port}"], env=env, capture_output=True, text=True, timeout=60)
            assert listed.returncode == 0, listed.stderr
            assert "minilm" in {m["name"] for m in json.loads(listed.stdout)}
        other = {**env, "XDG_STATE_HOME": str(tmp / "elsewhere")}  # a user without the file: told what to do
        refused = subprocess.run([sys.executable, "-m", "tritonbundle", "models", "--url", f"127.0.0.1:{http}"],
                                 env=other, capture_output=True, text=True, timeout=60)
        assert refused.returncode != 0 and "$TRITONBUNDLE_API_KEY" in refused.stderr and "api_key=" not in refused.stderr
    finally:
        serve.send_signal(signal.SIGTERM)
        out, _ = serve.communicate(timeout=60)
    assert "random key, written (readable by you only)" in out
    assert not key.exists(), "the key file goes with the server"


def test_bench_and_tune_flags_default_to_their_options_defaults(tmp_path: Path) -> None:
    """Each default has one home, the options object: the command line without flags asks for exactly it."""
    import dataclasses

    from tritonbundle.bench.options import BenchOptions
    from tritonbundle.cli import defaults, parser
    from tritonbundle.cli.bench import options_from
    from tritonbundle.tune.options import TuneOptions

    assert options_from(parser().parse_args(["bench", "gpu"])) == BenchOptions(out=defaults.BENCH_REPORT)
    tune = parser().parse_args(["tune"])
    expected = TuneOptions(out=defaults.TUNE_REPORT, manifest=defaults.MANIFEST, artifacts=defaults.ARTIFACTS)
    flags = {"slo_ms": "slo_p99_ms"}
    for field in dataclasses.fields(TuneOptions):
        name = flags.get(field.name, field.name)
        if hasattr(tune, name) and field.name not in ("load_procs", "start", "work"):  # 0/None there mean "derive it"
            assert getattr(tune, name) == getattr(expected, field.name), field.name


@pytest.mark.parametrize("argv, words", [
    (["tune", "--window-s", "0"], "argument --window-s: 0 must be more than 0"),
    (["tune", "--load-procs", "-3"], "argument --load-procs: -3 must be at least 0"),
    (["tune", "--rate-factor", "1"], "argument --rate-factor: 1 must be more than 1"),
    (["tune", "--refine", "x"], "argument --refine: 'x' is not a whole number"),
    (["tune", "--start", "instances=abc"], "argument --start: instances: 'abc' is not of type 'integer'"),
    (["tune", "--start", "batch_buckets=[0]"], "argument --start: batch_buckets: 0 is less than the minimum of 1"),
    (["loadtest", "--slo-p99-ms", "-5"], "argument --slo-p99-ms: -5 must be more than 0"),
    (["tune", "--model", "a", "--model", "b"], "--model given twice: it takes one value"),  # b alone was tuned
])
def test_a_number_out_of_range_is_a_usage_error_naming_the_flag(argv: list[str], words: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """`tune --window-s 0` ran a whole point and blamed the server ("no configuration met the SLO"),
    `--load-procs -3` and `--rate-factor 1` ended in tracebacks, `--start instances=abc` in a TypeError
    from the runtime: every such value is refused by argparse, before anything starts."""
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_a_versus_file_that_is_missing_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["tune", "--versus", str(tmp_path / "none.json"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code != 0 and "none.json: not a readable tune result" in err and "Traceback" not in err
