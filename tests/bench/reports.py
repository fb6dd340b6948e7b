"""Reading committed bench reports and docs/benchmarks.md back in the tests that quote them."""

from __future__ import annotations

from pathlib import Path

from tritonbundle.bench.compare import Setting, summarize

ROOT = Path(__file__).resolve().parents[2]


def docs_said() -> str:
    """docs/benchmarks.md with its whitespace folded, so a quoted figure matches across line breaks."""
    return " ".join((ROOT / "docs" / "benchmarks.md").read_text().split())


def settings_in(runs: Path) -> dict[str, Setting]:
    """Each setting of a device_ab runs folder, by name."""
    return {s.name: s for s in summarize(runs)}
