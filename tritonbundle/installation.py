"""Where a ``tritonserver`` is and what it needs to run.

Two installations are supported:

* the Triton 2.51 binary inside the ``nvidia-pytriton`` wheel (Python backend only; runs on CPU),
  prepared the way the README's "The CPU server" section describes: the wheel's bundled libraries on
  ``LD_LIBRARY_PATH``, the Python backend stub of this interpreter's version next to the backend, and
  this environment's ``bin/`` first on ``PATH`` so Python models import this environment's packages;
* any other install (the NGC image's ``/opt/tritonserver``), named by ``$TRITONSERVER`` or
  ``--tritonserver``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from tritonbundle.errors import ServerError
from tritonbundle.log import LOG


@dataclass(frozen=True)
class Installation:
    """Where a tritonserver binary, its backends and the environment it needs are."""

    binary: Path
    backend_dir: Path
    env: dict[str, str]
    description: str


def _pytriton_root() -> Path:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise ServerError(
            "no tritonserver found: install the CPU server with `pip install nvidia-pytriton==0.7.0` "
            "(make demo does), or point $TRITONSERVER at a tritonserver binary"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tritonbundle"


def wheel_installation() -> Installation:
    """Prepare the ``tritonserver`` inside the nvidia-pytriton wheel for this interpreter.

    The Python backend's stub must match the interpreter's minor version; the wheel ships one per
    version, and the backend looks for it in its own directory. Rather than writing into
    site-packages, a private backend directory is assembled in the user's cache.
    """
    root = _pytriton_root()
    server_dir = root / "tritonserver"
    binary = server_dir / "bin" / "tritonserver"
    libs = root.parent / "nvidia_pytriton.libs"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = server_dir / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not binary.exists() or not stub.exists():
        raise ServerError(f"the nvidia-pytriton wheel at {root} has no tritonserver or no stub for Python {version}")
    backends = _cache_dir() / f"backends-py{version}-{_file_tag(binary)}"
    python_backend = backends / "python"
    if not (python_backend / "triton_python_backend_stub").exists():
        tmp = backends.with_name(backends.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "python").mkdir(parents=True)
        for item in (server_dir / "backends" / "python").iterdir():
            if item.is_file():
                shutil.copy2(item, tmp / "python" / item.name)
        shutil.copy2(stub, tmp / "python" / "triton_python_backend_stub")
        with contextlib.suppress(OSError):
            tmp.rename(backends)  # another process may have won the race: fine
        shutil.rmtree(tmp, ignore_errors=True)
    _warn_about_numpy_2()
    env = {
        "LD_LIBRARY_PATH": os.pathsep.join(p for p in (str(libs), os.environ.get("LD_LIBRARY_PATH", "")) if p),
        # Python models run in the stub's embedded interpreter, which finds its prefix through
        # PATH: this environment's bin/ first makes them import this environment's packages.
        "PATH": os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", ""))),
    }
    return Installation(binary, backends, env, f"tritonserver 2.51 from nvidia-pytriton ({root})")


def _warn_about_numpy_2() -> None:
    """The wheel's Python-backend stubs misread numpy 2 arrays (inputs arrive corrupted; found on the
    GPU machine, see docs/benchmarks.md): say so before serving with such an environment."""
    try:
        from importlib.metadata import version

        major = int(version("numpy").split(".")[0])
    except Exception:  # noqa: BLE001 - no numpy: nothing to warn about
        return
    if major >= 2:
        LOG.warning("numpy %s is installed: the nvidia-pytriton 0.7.0 Python backend reads numpy 2 tensors "
                    "wrongly; use numpy<2 (requirements/constraints.txt pins 1.26)", version("numpy"))


def _file_tag(path: Path) -> str:
    st = path.stat()
    return f"{st.st_size:x}{int(st.st_mtime):x}"


def find_installation(tritonserver: str | None = None) -> Installation:
    """The installation named by the argument or ``$TRITONSERVER``, else the wheel's."""
    explicit = tritonserver or os.environ.get("TRITONSERVER")
    if explicit:
        binary = Path(explicit)
        if not binary.exists():
            raise ServerError(f"tritonserver binary {binary} does not exist")
        backend_dir = Path(os.environ.get("TRITON_BACKEND_DIR", binary.parent.parent / "backends"))
        return Installation(binary, backend_dir, {}, f"tritonserver at {binary}")
    return wheel_installation()
