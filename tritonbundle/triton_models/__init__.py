"""Python-backend models. Each file here is copied verbatim to ``<model>/<version>/model.py``.

They run inside Triton's Python backend stub (``triton_python_backend_utils`` exists only there),
take their settings from the config's ``parameters``, and answer bad input with an error response
for that request (INVALID_ARG), never by raising out of ``execute``.
"""

from pathlib import Path

HERE = Path(__file__).parent


def source(name: str) -> Path:
    """The model file ``name`` (e.g. ``"tokenizer"``), to be copied as ``model.py``."""
    path = HERE / f"{name}.py"
    if not path.exists():
        raise FileNotFoundError(path)
    return path
