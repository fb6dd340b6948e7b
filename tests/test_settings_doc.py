"""The README's Settings table lists exactly the environment variables the code reads."""

from __future__ import annotations

import re
from pathlib import Path

from tritonbundle.cli.defaults import ENVIRONMENT

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_lists_every_environment_variable() -> None:
    readme = (ROOT / "README.md").read_text()
    table = readme.split("### Settings", 1)[1].split("\n## ", 1)[0]
    documented = dict(re.findall(r"^\| `([A-Z_]+)` \| (.+) \|$", table, re.M))
    assert set(documented) == set(ENVIRONMENT)
    for name, text in ENVIRONMENT.items():
        assert documented[name] == text, name


def test_every_environment_variable_the_code_reads_is_in_the_table() -> None:
    read: set[str] = set()
    for path in (ROOT / "tritonbundle").rglob("*.py"):
        source = path.read_text()
        read |= set(re.findall(r"\"((?:TRITON|TRITONBUNDLE)_[A-Z_]+)\"", source))
    read -= {"TRITONBUNDLE_DEVICE_RUN"}  # the device script's, never read by the package
    assert read <= set(ENVIRONMENT), sorted(read - set(ENVIRONMENT))
