"""External processes, two kinds:

* commands that run to completion (nvidia-smi, trtexec, docker, helm) go through :func:`run`: each is
  logged, a ``reproduce.sh`` can be written next to its output so a user can run exactly the same
  thing by hand, and a failure raises :class:`CommandError` quoting the command and the tail of its
  output;
* long-lived processes (tritonserver, the benchmark's servers and load generators) are started in
  their own process group with :func:`start_group` and ended with :func:`stop_group` (SIGTERM to the
  whole group, SIGKILL after a grace period), so no child outlives its owner.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from tritonbundle.errors import CommandError
from tritonbundle.log import LOG


def usable_cpus() -> set[int]:
    """The CPUs this process may run on: its affinity, which ``taskset`` and a container's cpuset narrow
    and ``os.cpu_count()`` does not see (all of them where the platform cannot tell)."""
    try:
        return os.sched_getaffinity(0)
    except AttributeError:  # pragma: no cover - not Linux
        return set(range(os.cpu_count() or 1))


def python_child_env() -> dict[str, str]:
    """The environment of a Python child process that imports this checkout of tritonbundle (``-m
    tritonbundle...`` from any working directory), its output unbuffered."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def stop_reader(process: subprocess.Popen[str] | None, thread: threading.Thread | None) -> None:
    """Stop a sampling child (terminate, wait up to 5 s) and join the thread that reads its output."""
    if process is not None and process.poll() is None:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)
    if thread is not None:
        thread.join(timeout=2)


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


# -- process groups -----------------------------------------------------------------------------------
def start_group(
    argv: Sequence[str | os.PathLike[str]], *, log: Path | IO[bytes] | None = None, env: Mapping[str, str] | None = None,
    inherit_env: bool = True, die_with_parent: bool = False,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` as the leader of a new session (its own process group), output to ``log``;
    its environment is this one plus ``env`` (``inherit_env=False``: ``env`` alone). With
    ``die_with_parent`` (Linux) the kernel SIGKILLs it when this process dies, even by SIGKILL, which no
    handler here can see (``prctl(PR_SET_PDEATHSIG)``): no orphaned server keeps the ports. The
    kernel's "parent" is the calling *thread*: ask for it only from a thread that lives as long as the child.
    Not logged here: the command may carry a secret (tritonserver's API key); callers log it redacted."""
    out: Any = subprocess.DEVNULL
    if isinstance(log, Path):
        log.parent.mkdir(parents=True, exist_ok=True)
        out = open(log, "ab")  # noqa: SIM115 - the child holds it; closed here after Popen
    elif log is not None:
        out = log
    child_env = None if env is None else {**os.environ, **env} if inherit_env else dict(env)
    try:
        return subprocess.Popen(  # noqa: S603
            [str(a) for a in argv], stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=child_env,
            preexec_fn=_die_with_parent if die_with_parent and sys.platform == "linux" else None,
        )
    finally:
        if isinstance(log, Path):
            out.close()


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL me when my parent dies (PR_SET_PDEATHSIG = 1)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


def stop_group(proc: subprocess.Popen[Any], *, grace_s: float = 10.0) -> int | None:
    """SIGTERM the process's group, wait ``grace_s``, then SIGKILL it; reap leftovers of a dead leader."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            LOG.warning("process %d did not stop within %.0f s; killing its group", proc.pid, grace_s)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    # The leader is gone; children it started (Python backend stubs, a web server's worker still in its
    # own graceful shutdown: the bench's peer's lingered 30 s into the next phase) may not be.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on ``host``."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` different TCP ports, free right now on ``host``. Each socket stays bound until all are
    chosen: ports asked for one at a time can come back the same (a clean-clone CI run got HTTP and
    gRPC on one port, and tritonserver refused to start)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for s in sockets:
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in sockets]


def port_free(address: str, port: int) -> bool:
    """True when ``address:port`` can be bound (nobody listens there)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: TIME_WAIT is not "taken"
        try:
            s.bind((address, port))
        except OSError:
            return False
    return True


def port_holder(port: int) -> str:
    """Who listens on TCP ``port``: "pid 123 (tritonserver --model-repository=...)", read from /proc;
    "an unknown process" when that cannot be read (another user's, or not Linux)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(fields[9])
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (entry / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                    return f"pid {entry.name} ({cmd[:120]})"
    return "an unknown process"


def http_ok(url: str, *, timeout_s: float = 2.0) -> bool:
    """True when ``url`` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:  # noqa: S310 - our own servers
            return bool(r.status == 200)
    except OSError:
        return False


def wait_until(ready: Callable[[], bool], *, timeout_s: float, proc: subprocess.Popen[Any] | None = None,
               what: str = "the process", interval_s: float = 0.25) -> None:
    """Poll ``ready()`` until it holds; raise :class:`CommandError` if ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None and proc.poll() is not None:
            raise CommandError(f"{what} exited with code {proc.returncode} before becoming ready")
        if ready():
            return
        if time.monotonic() > deadline:
            raise CommandError(f"{what} was not ready after {timeout_s:g} s")
        time.sleep(interval_s)


def tail(path: Path, lines: int = 15) -> str:
    """The last lines of a log file ('(no log)' when there is none)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def descendants(pid: int, name: str) -> list[int]:
    """Every descendant of ``pid`` whose executable is called ``name`` (Linux /proc), oldest first."""
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        head, _, rest = text.rpartition(")")  # "pid (comm) state ppid ...": comm may hold spaces
        child = int(head.split(" (", 1)[0])
        names[child] = head.split(" (", 1)[1] if " (" in head else ""
        children.setdefault(int(rest.split()[1]), []).append(child)
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        todo += children.get(child, [])
        if names.get(child, "") == name[:15]:  # the kernel keeps 15 characters of a process's name
            found.append(child)
    return sorted(found)

