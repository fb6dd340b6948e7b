"""The serving side of TensorRT plans: refuse plans another TensorRT built, and start Triton with what
version-compatible plans need.

A plan runs only on the TensorRT version that built it, build number included (NVIDIA: "engines are
not portable across TensorRT versions"; TensorRT refuses a plan of 9.2.0.5 on 9.2.0.4, "expecting
library version 9.2.0.4 got 9.2.0.5", triton-inference-server/tensorrtllm_backend#194); Triton's error
for one that does not (``tensorrt_backend`` ``src/loader.cc``: "unable to create TensorRT engine", then
TensorRT's "Serialization assertion stdVersionRead == kSERIALIZATION_VERSION failed") names neither
version. So before tritonserver starts, every ``*.plan.json`` the build wrote next to a plan is compared
with the TensorRT this server has (major.minor.patch.build), and a mismatch stops the start with both
versions named.

A version-compatible plan (``version_compatible: true``) may run on a later TensorRT of the same major
version; it embeds TensorRT's lean runtime, which Triton loads only with
``--backend-config=tensorrt,version-compatible=true`` (``src/tensorrt.cc``, ``src/loader.cc``:
setEngineHostCodeAllowed), which this adds when such a plan is there. Across a major version NVIDIA's
own pages disagree: the Support Matrix of 11.1 to 11.3 says "within the same major version", while
Engine Compatibility 11.1 ("engines built with TensorRT 10 work with TensorRT 11") and the Support Matrix
of 11.4 (10 -> 11 and 8 -> 10, "no other combination across major versions") allow two steps. Those two
are let through with a note that says so; any other major step is refused.

Standard library only: it runs in the NGC tritonserver image, where tritonbundle is not installed
(``docker/Dockerfile.server`` and the Helm chart carry this file as is)::

    python3 serving.py check REPOSITORY            exit 2 and name the problem when a plan does not fit
    python3 serving.py exec tritonserver ARGS...   check the --model-repository, then exec tritonserver
                                                   without $TRITONBUNDLE_API_KEY in its environment (the
                                                   chart passes the key in ARGS; its Python-backend stubs
                                                   would inherit the variable)

The TensorRT version of this server: ``$TRITONBUNDLE_TENSORRT_VERSION``, else what ``libnvinfer.so.X.Y.Z``
says of itself (``getInferLibMajorVersion`` .. ``getInferLibBuildVersion``, ``NvInferRuntime.h`` in 10.13
and 11.1, through ctypes), else the version in that file's name (no build number: the build number is
then not checked, and a note says so), else the ``tensorrt`` Python package's.
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import re
import sys
from pathlib import Path

VERSION_ENV = "TRITONBUNDLE_TENSORRT_VERSION"
BACKEND_FLAG = "--backend-config=tensorrt,version-compatible=true"
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/local/tensorrt/lib", "/usr/lib64",
                "/opt/tritonserver/backends/tensorrt")


def library_version(path: str) -> str | None:
    """major.minor.patch.build of the libnvinfer at ``path``, asked of the library itself (None if it cannot be loaded)."""
    try:
        lib = ctypes.CDLL(path)
        return ".".join(str(int(getattr(lib, f"getInferLib{part}Version")())) for part in ("Major", "Minor", "Patch", "Build"))
    except (OSError, AttributeError):
        return None


def installed_version() -> str | None:
    """This machine's TensorRT version (see the module docstring), or None when none is found."""
    explicit = os.environ.get(VERSION_ENV)
    if explicit:
        return explicit
    for folder in LIBRARY_DIRS:
        for path in sorted(glob.glob(os.path.join(folder, "libnvinfer.so.*.*.*"))):
            match = re.search(r"libnvinfer\.so\.(\d+\.\d+\.\d+)$", path)
            if match:
                return library_version(path) or match.group(1)
    try:
        import tensorrt  # noqa: PLC0415 - optional

        return str(tensorrt.__version__)
    except ImportError:
        return None


def _parts(version: str) -> tuple[int, ...]:
    """(major, minor, patch[, build]) of a version string."""
    return tuple(int(x) for x in re.findall(r"\d+", version)[:4])


#: Major steps a version-compatible plan may take: NVIDIA's Support Matrix 11.4 and Engine Compatibility 11.1.
CROSS_MAJOR = {(8, 10), (10, 11)}


def plans(repository: Path) -> list[tuple[Path, dict[str, object]]]:
    """(plan metadata file, its content) for every plan in the repository."""
    found = []
    for meta in sorted(Path(repository).glob("*/[0-9]*/*.plan.json")):
        try:
            found.append((meta, json.loads(meta.read_text())))
        except (OSError, ValueError):
            found.append((meta, {}))
    return found


def _version_compatible(meta: dict[str, object]) -> bool:
    options = meta.get("options")
    return bool(isinstance(options, dict) and options.get("version_compatible"))


def problems(repository: Path, version: str | None, notes: list[str] | None = None) -> list[str]:
    """Why plans in ``repository`` cannot run on TensorRT ``version`` (empty: they can, or there are none).
    What is allowed but worth knowing is appended to ``notes``."""
    notes = [] if notes is None else notes
    found = plans(repository)
    if not found:
        return []
    if version is None:
        return [f"{len(found)} TensorRT plan(s) in {repository}, but no TensorRT was found here to check them "
                f"against (set ${VERSION_ENV})"]
    out = []
    have = _parts(version)
    for meta_path, meta in found:
        built = str(meta.get("tensorrt_version") or "")
        plan = meta_path.with_suffix("")
        where = f"{meta_path.parent.parent.name}/{meta_path.parent.name}/{plan.name}"
        if not built:
            out.append(f"{where}: no readable metadata ({meta_path.name}); rebuild it with `tritonbundle build`")
            continue
        want = _parts(built)
        if _version_compatible(meta):
            if have[:3] < want[:3]:
                out.append(f"{where}: version-compatible plan built with TensorRT {built} cannot run on the older "
                           f"TensorRT {version} of this server")
            elif have[0] != want[0] and (want[0], have[0]) not in CROSS_MAJOR:
                out.append(f"{where}: version-compatible plan built with TensorRT {built} cannot run on TensorRT "
                           f"{version}: NVIDIA supports only TensorRT 8 -> 10 and 10 -> 11 across major versions")
            elif have[0] != want[0]:
                notes.append(f"{where}: a version-compatible TensorRT {want[0]} plan on TensorRT {version}: NVIDIA's "
                             "Support Matrix 11.4 and Engine Compatibility 11.1 allow it, the Support Matrix 11.1-11.3 "
                             "says 'within the same major version'; if it fails to load, rebuild it on this release")
        elif have[:3] != want[:3] or (len(have) == 4 and len(want) == 4 and have != want):
            out.append(f"{where} was built with TensorRT {built}, this server has TensorRT {version}: plans are not "
                       "portable across TensorRT versions (build number included); rebuild the plans in the TensorRT "
                       "image of the same NGC release as the server (docker/versions.env), or build with "
                       "version_compatible: true")
        elif len(have) != len(want):
            notes.append(f"{where}: built with TensorRT {built}; this server's TensorRT reads {version}, without a "
                         f"build number, so only major.minor.patch was compared (set ${VERSION_ENV} to compare all four)")
    return out


def backend_args(repository: Path) -> list[str]:
    """The tritonserver arguments the plans need: version-compatible plans need host code allowed."""
    return [BACKEND_FLAG] if any(_version_compatible(meta) for _, meta in plans(repository)) else []


def _repository(args: list[str]) -> Path | None:
    for i, arg in enumerate(args):
        if arg.startswith("--model-repository="):
            value = arg.split("=", 1)[1]
        elif arg == "--model-repository" and i + 1 < len(args):
            value = args[i + 1]
        else:
            continue
        return Path(value) if "://" not in value else None  # object stores are not checked here
    return None


#: The variable that holds the restricted-API key (Kubernetes expands it into the arguments before this runs).
KEY_VARIABLES = ("TRITONBUNDLE_API_KEY",)


def main(argv: list[str]) -> int:
    notes: list[str] = []
    if len(argv) >= 2 and argv[0] == "check":
        lines = problems(Path(argv[1]), installed_version(), notes)
        for line in notes + lines:
            print(f"tensorrt-plans: {line}", file=sys.stderr)
        return 2 if lines else 0
    if len(argv) >= 2 and argv[0] == "exec":
        command = argv[1:]
        repository = _repository(command)
        if repository is not None:
            lines = problems(repository, installed_version(), notes)
            for line in notes:
                print(f"tensorrt-plans: note: {line}", file=sys.stderr)
            if lines:
                for line in lines:
                    print(f"tensorrt-plans: refusing to start: {line}", file=sys.stderr)
                return 2
            command += [a for a in backend_args(repository) if a not in command]
        # The key is already in the restricted-API arguments; tritonserver's environment is every
        # Python stub's environment, so it goes no further.
        env = {k: v for k, v in os.environ.items() if k not in KEY_VARIABLES}
        os.execvpe(command[0], command, env)
    print(__doc__, file=sys.stderr)
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
