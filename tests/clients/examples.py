"""Run what clients/ shows: the README's Python snippets and the example scripts, against a test server."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ROOT / "clients"


def readme_snippets() -> list[str]:
    """The ```python blocks of clients/README.md."""
    return re.findall(r"```python\n(.*?)```", (CLIENTS / "README.md").read_text(), re.S)


def run_snippet(code: str, server: Any) -> dict[str, Any]:
    """Run a snippet as written, with the test server's addresses for the default ports; its names after."""
    code = code.replace("127.0.0.1:8000", server.http_url).replace("127.0.0.1:8001", server.grpc_url)
    names: dict[str, Any] = {"__name__": "readme"}
    exec(compile(code, str(CLIENTS / "README.md"), "exec"), names)  # noqa: S102 - our README
    return names


def run_example(name: str, *args: str) -> str:
    """Run clients/<name> with ``args``; its standard output (a non-zero exit fails the test)."""
    done = subprocess.run([sys.executable, str(CLIENTS / name), *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
