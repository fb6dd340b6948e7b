from __future__ import annotations

import subprocess
import sys

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
    from tritonbundle.server import free_port

    port = free_port()
    code = main(["infer", "--url", f"127.0.0.1:{port}", "--timeout-s", "1", "hello"])
    err = capsys.readouterr().err
    assert code == 1
    assert f"127.0.0.1:{port}" in err or "cannot reach" in err or "not ready" in err
    assert "Traceback" not in err
