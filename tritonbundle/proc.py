"""The one wrapper through which every external command runs (trtexec, docker, helm, ...).

Each command is logged, a ``reproduce.sh`` is written next to its output so a user can run exactly
the same thing by hand, and a failure raises :class:`CommandError` quoting the command and the tail
of its output.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from tritonbundle.errors import CommandError
from tritonbundle.log import LOG


def quote(argv: Sequence[str | os.PathLike[str]]) -> str:
    return " ".join(shlex.quote(str(a)) for a in argv)


def write_reproduce_script(
    path: Path, argv: Sequence[str | os.PathLike[str]], *, env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Path:
    """Write an executable shell script that runs ``argv`` the same way."""
    lines = ["#!/usr/bin/env bash", "# Written by tritonbundle: re-runs the command that produced this folder.", "set -euo pipefail"]
    if cwd is not None:
        lines.append(f"cd {shlex.quote(str(cwd))}")
    for key, value in sorted((env or {}).items()):
        lines.append(f"export {key}={shlex.quote(value)}")
    lines.append(quote(argv))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o755)
    return path


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    log_path: Path | None = None,
    reproduce_dir: Path | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout_s: float | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run a command, capture its output (and copy it to ``log_path``), raise on failure."""
    command = quote(argv)
    LOG.debug("$ %s", command)
    if reproduce_dir is not None:
        write_reproduce_script(reproduce_dir / "reproduce.sh", argv, env=env, cwd=cwd)
    full_env = {**os.environ, **(env or {})}
    try:
        result = subprocess.run(
            [str(a) for a in argv], cwd=cwd, env=full_env, text=True, capture_output=True,
            timeout=timeout_s, check=False,
        )
    except FileNotFoundError as e:
        raise CommandError(f"command not found: {argv[0]} (while running: {command})") from e
    except subprocess.TimeoutExpired as e:
        raise CommandError(f"command timed out after {timeout_s:g} s: {command}") from e
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(f"$ {command}\n{result.stdout}{result.stderr}")
    if check and result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-15:]
        raise CommandError(
            f"command failed with exit code {result.returncode}: {command}\n" + "\n".join(tail)
        )
    return result
