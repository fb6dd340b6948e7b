"""Served models carry the package modules they import: the build vendors exactly those next to
model.py, and the model imports them from there even where tritonbundle is not installed."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tritonbundle.runtimes import served

RUNTIMES = Path(served.__file__).parent
MODELS = {
    "tokenizer": ["tritonbundle.contract", "tritonbundle.runtimes.stacks", "tritonbundle.runtimes.stats",
                  "tritonbundle.runtimes.text", "tritonbundle.runtimes.wordpiece"],
    "onnxruntime": ["tritonbundle.contract", "tritonbundle.runtimes.stacks"],
    "pytorch": ["tritonbundle.contract", "tritonbundle.errors", "tritonbundle.recipes",
                "tritonbundle.runtimes.pytorch.engine", "tritonbundle.runtimes.pytorch.gpu_turn",
                "tritonbundle.runtimes.pytorch.launch", "tritonbundle.runtimes.stacks", "tritonbundle.runtimes.stats", "tritonbundle.runtimes.text", "tritonbundle.runtimes.wordpiece"],
}


@pytest.mark.parametrize("runtime", sorted(MODELS))
def test_the_closure_is_what_the_model_imports(runtime: str) -> None:
    assert served.closure(RUNTIMES / runtime / "model.py") == MODELS[runtime]


@pytest.mark.parametrize("runtime", sorted(MODELS))
def test_the_installed_model_imports_only_its_vendored_modules(runtime: str, tmp_path: Path) -> None:
    """Import model.py with site-packages on the path but no .pth processing, so the editable
    tritonbundle is invisible: only the vendored copy can satisfy its imports."""
    version = tmp_path / "1"
    written = served.install(RUNTIMES / runtime / "model.py", version)
    assert version / "model.py" in written
    code = f"""
import json, sys
sys.path.append({sysconfig.get_paths()["purelib"]!r})
sys.path.append({str(version)!r})
import model
mods = {{m: getattr(sys.modules[m], "__file__", "") for m in sys.modules if m.split(".")[0] == "tritonbundle"}}
print(json.dumps(mods))
"""
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    mods = json.loads(out.stdout.strip().splitlines()[-1])
    assert mods, "the model imported no project module"
    assert all(f.startswith(str(version)) for f in mods.values()), mods
    assert {m for m in mods if not (version / Path(*m.split("."))).is_dir()} == set(MODELS[runtime])
