"""Make tensorrt-stubs==10.13.0.35.1 parseable by mypy.

The generated stubs contain two kinds of invalid Python, which stop mypy before it checks
anything: parameters named ``in`` (a keyword) and one parameter without a default after
parameters with defaults (``add_scale_nd``). This renames ``in`` to ``in_`` and gives the
parameter a default. Usage: python scripts/patch_tensorrt_stubs.py .tools/stubs
"""

from __future__ import annotations

import re
import sys
from pathlib import Path


def patch(text: str) -> str:
    text = re.sub(r"([(,] ?)in: ", r"\1in_: ", text)
    return text.replace("power: Weights = None, channel_axis: int)", "power: Weights = None, channel_axis: int = ...)")


def main(root: str) -> int:
    path = Path(root) / "tensorrt_bindings" / "tensorrt.pyi"
    if not path.exists():
        print(f"error: {path} not found; install tensorrt-stubs into {root} first", file=sys.stderr)
        return 1
    path.write_text(patch(path.read_text()))
    print(f"patched {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else ".tools/stubs"))
