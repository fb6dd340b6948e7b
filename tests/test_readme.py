"""The README's two commands: `make demo` runs the main job, `make test` passes (CI runs it)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _quickstart_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Quick start.*?```(?:bash|sh)?\n(.*?)```", text, re.S)
    assert block, "README.md needs a '## Quick start' section with a code block"
    return [line.strip() for line in block.group(1).splitlines() if line.strip() and not line.startswith("#")]


def test_readme_quick_start_is_make_demo_then_make_test() -> None:
    assert _quickstart_commands() == ["make demo", "make test"]


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^exec make test$", ci, re.M)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_make_demo_runs_the_main_job_as_written() -> None:
    committed = _repository_files()
    result = subprocess.run(["make", "demo"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    # The demo writes model_repository/ again: had it changed a committed file, that file was stale (and
    # tests/test_repository.py, run after this, would compare the build with its own output).
    changed = sorted(rel for rel, text in _repository_files().items() if committed.get(rel, text) != text)
    assert not changed, f"make demo rewrote {changed}: run `tritonbundle repo` and commit model_repository/"
    output = result.stdout + result.stderr
    assert "HTTP and gRPC agree" in output
    assert re.search(r"A man is playing a guitar\.\s+->\s+Someone strums an acoustic guitar on stage\.\s+0\.\d+", output)
    assert "stopped cleanly" in output


def _repository_files() -> dict[str, str]:
    """model_repository/'s configs and Python modules (what the build stage writes there), by path."""
    folder = ROOT / "model_repository"
    return {str(p.relative_to(folder)): p.read_text() for pattern in ("*/config.pbtxt", "*/1/**/*.py")
            for p in folder.glob(pattern) if "__pycache__" not in p.parts}
