"""Static checks of the Dockerfiles (no Docker engine needed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted((ROOT / "docker").glob("Dockerfile.*"))


def _run_instructions(path: Path) -> list[str]:
    """Every RUN instruction of ``path``, continuation lines joined, comments dropped."""
    lines = [line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]
    text = "\n".join(lines).replace("\\\n", " ")
    return [line for line in text.splitlines() if line.lstrip().startswith("RUN ")]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_pip_runs_only_through_the_virtual_environments_interpreter(dockerfile: Path) -> None:
    """docker/lib/python-env.sh may make the environment --without-pip (Ubuntu without python3-venv): a bare
    `pip` is then the system's, which installs into the system site-packages or is refused by PEP 668's
    EXTERNALLY-MANAGED marker (Ubuntu 24.04). `<venv>/bin/python -m pip` installs into the environment."""
    for run in _run_instructions(dockerfile):
        bare = re.findall(r"(?:^|[\s;&|(])(pip3?)\s", re.sub(r"-m pip\b", "", run))
        assert not bare, f"{dockerfile.name}: bare pip in: {run.strip()[:200]}"
        for call in re.findall(r"(\S+) -m pip\b", run):
            assert call == "/opt/tritonbundle/venv/bin/python", f"{dockerfile.name}: pip through {call}: {run.strip()[:200]}"
