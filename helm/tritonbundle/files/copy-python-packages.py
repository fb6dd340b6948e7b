"""Init container: copy importable Python packages from this (build) image into a shared folder.

The Python-backend models import packages that the stock tritonserver image lacks (the tokenizer model
imports `tokenizers`). This copies each named package (its directory, or its single module file) into
DEST, which the server container mounts read-only and puts on PYTHONPATH. Packages must be pure Python
or abi3 builds, because the server's Python may be another minor version than this image's.

usage: python3 copy-python-packages.py DEST PACKAGE [PACKAGE ...]
"""

import importlib.util
import shutil
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    dest = Path(argv[0])
    for name in argv[1:]:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            print(f"copy-python-packages: error: '{name}' is not importable in this image", file=sys.stderr)
            return 1
        origin = Path(spec.origin)
        if spec.submodule_search_locations:
            source = origin.parent
            shutil.copytree(source, dest / source.name, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            source = origin
            shutil.copy2(source, dest / source.name)
        print(f"copy-python-packages: {name}: {source} -> {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
