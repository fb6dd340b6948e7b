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


def _dist_key(name: str) -> str:
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def test_http_wheels_hold_what_geventhttpclient_needs() -> None:
    """``import tritonclient.http`` imports its gevent client first: the GPU machine, which has aiohttp but
    not geventhttpclient, failed every HTTP run until the ``http`` part carried these. The part must hold
    geventhttpclient's dependencies, as installed here, all the way down."""
    import importlib.metadata as md

    from packaging.requirements import Requirement

    packed = {_dist_key(n) for n in load_device_pack().HTTP_WHEELS}
    needed, todo = set(), ["geventhttpclient"]
    while todo:
        name = _dist_key(todo.pop())
        if name in needed:
            continue
        needed.add(name)
        for text in md.requires(name) or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    assert needed <= packed, f"the http part lacks {sorted(needed - packed)}"
