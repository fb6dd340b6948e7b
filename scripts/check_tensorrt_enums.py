"""Compare the enum values of typings/tensorrt11 with TensorRT's C++ headers (the values pybind11 exports).

    python scripts/check_tensorrt_enums.py INCLUDE_DIR    # e.g. a checkout of NVIDIA/TensorRT at v11.1: include/

Prints each enum member whose value differs and exits 1; exits 0 when every member the stub lists has
the header's value. tests/runtimes/tensorrt/test_enums.py runs the same comparison on a table taken from
the v11.1 headers, so the check needs no TensorRT checkout in CI.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

STUB = Path(__file__).resolve().parents[1] / "typings" / "tensorrt11" / "tensorrt" / "__init__.pyi"
HEADERS = ("NvInfer.h", "NvInferRuntime.h", "NvInferRuntimeBase.h")


def stub_enums(stub: Path = STUB) -> dict[str, dict[str, int]]:
    """Every top-level IntEnum of the stub: name -> member -> value."""
    out: dict[str, dict[str, int]] = {}
    for node in ast.parse(stub.read_text()).body:
        if isinstance(node, ast.ClassDef) and any(getattr(b, "id", "") == "IntEnum" for b in node.bases):
            out[node.name] = {
                s.targets[0].id: int(ast.literal_eval(s.value))
                for s in node.body if isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Name)
            }
    return out


def header_enums(text: str) -> dict[str, dict[str, int]]:
    """``enum class Name : int32_t { kMEMBER [TRT_DEPRECATED_ENUM] = value, ... }`` -> Name -> MEMBER -> value."""
    out: dict[str, dict[str, int]] = {}
    for match in re.finditer(r"enum class (\w+)\s*:\s*\w+\s*\{(.*?)\};", text, re.S):
        body = re.sub(r"//[^\n]*", "", match.group(2))
        members = re.findall(r"\bk(\w+)(?:\s+TRT_DEPRECATED_ENUM)?\s*=\s*(\d+)", body)
        out[match.group(1)] = {name: int(value) for name, value in members}
    return out


def differences(stub: dict[str, dict[str, int]], headers: dict[str, dict[str, int]]) -> list[str]:
    out = []
    for enum, members in stub.items():
        if enum not in headers:
            continue  # nested enums (ILogger.Severity) and enums the headers name differently
        for name, value in members.items():
            want = headers[enum].get(name)
            if want != value:
                out.append(f"{enum}.{name}: stub {value}, header {want}")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 64
    text = "\n".join((Path(argv[0]) / h).read_text() for h in HEADERS if (Path(argv[0]) / h).exists())
    problems = differences(stub_enums(), header_enums(text))
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
