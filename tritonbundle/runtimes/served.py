"""Install a served Python-backend model: its ``model.py`` plus the package modules it imports.

A served model is a module of this package (``runtimes/<name>/model.py``) that imports other modules
of it (:mod:`tritonbundle.contract` always). The server that runs it need not have tritonbundle
installed (the NGC image does not), so the build copies ``model.py`` into the version folder and,
next to it, ``tritonbundle/...``: exactly the modules ``model.py`` imports, found by reading their
``import`` statements (transitively), with empty ``__init__.py`` files for the packages on the way::

    minilm_tokenizer/1/model.py
    minilm_tokenizer/1/tritonbundle/__init__.py
    minilm_tokenizer/1/tritonbundle/contract.py

Triton 2.51's Python backend puts the version folder on ``sys.path`` (checked with the wheel's
server); ``model.py`` puts it first, so the model runs the code it was built with even where another
tritonbundle is installed.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

PACKAGE = "tritonbundle"
ROOT = Path(__file__).resolve().parent.parent
VENDORED_INIT = '"""Vendored by `tritonbundle build`: the package modules the model next to this folder imports."""\n'


def module_file(module: str) -> Path | None:
    """The source file of ``tritonbundle.x.y`` (a module or a package's ``__init__``), if it exists."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    base = ROOT.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(path: Path) -> set[str]:
    """Project modules a file imports, anywhere in it (lazy imports inside functions included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == PACKAGE)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != PACKAGE:
                continue
            found.add(node.module)
            # ``from tritonbundle.x import y`` may name a module y.
            found.update(f"{node.module}.{a.name}" for a in node.names if module_file(f"{node.module}.{a.name}"))
    return {m for m in found if module_file(m) is not None}


def closure(model_py: Path) -> list[str]:
    """Every project module ``model_py`` needs, transitively, sorted (packages' ``__init__`` excluded)."""
    todo = list(_imports(model_py))
    seen: set[str] = set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = module_file(module)
        assert path is not None
        todo.extend(_imports(path) - seen)
    return sorted(m for m in seen if module_file(m).name != "__init__.py")  # type: ignore[union-attr]


def install(model_py: Path, version_dir: Path) -> list[Path]:
    """Copy ``model_py`` to ``version_dir/model.py`` and vendor its modules; return the files written."""
    version_dir.mkdir(parents=True, exist_ok=True)
    written = [version_dir / "model.py"]
    shutil.copy2(model_py, written[0])
    for module in closure(model_py):
        source = module_file(module)
        assert source is not None
        relative = source.relative_to(ROOT.parent)
        target = version_dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
        written.append(target)
        folder = target.parent
        while folder != version_dir:
            init = folder / "__init__.py"
            if not init.exists():
                init.write_text(VENDORED_INIT)
                written.append(init)
            folder = folder.parent
    return written
