"""The GPU machine's packing script (scripts/device_pack.py): dev tooling, tested here, not shipped."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_device_pack() -> ModuleType:
    spec = importlib.util.spec_from_file_location("device_pack", ROOT / "scripts" / "device_pack.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["device_pack"] = module
    spec.loader.exec_module(module)
    return module


def test_byte_planes_round_trip() -> None:
    pack = load_device_pack()
    data = bytes(range(256)) * 41 + b"\x01"
    even, odd = pack.split_planes(data[:-1])
    assert pack.join_planes(even, odd) == data[:-1]
