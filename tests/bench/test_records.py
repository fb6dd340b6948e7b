"""The bench's typed records read the committed H200 reports back: written again, each is the same JSON,
key for key and in the same order, and the report written from it is the committed ``bench.md``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tritonbundle.bench import report
from tritonbundle.bench.records import BundleResult, CeilingResult, PeerResult
from tritonbundle.bench.result import BenchResult

DOCS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
#: Reports in today's shape (rounds, the bundle's input and restarts), each beside the bench.md it wrote.
CURRENT = [*sorted(DOCS.glob("h200-lanes-fix/*-bench.json")), *sorted(DOCS.glob("h200-gpu-wait/run1-*-bench.json")),
           *sorted(DOCS.glob("h200-batch-cap/*-bench.json")),  # per-system start rates, a failed peer
           *sorted(DOCS.glob("h200-tokenizer-split/*-bench.json")),  # the tokenizer counters
           *sorted(DOCS.glob("h200-threads/*/bench.json")), *sorted(DOCS.glob("h200-tuned-vs-handpicked/*/bench.json")),
           *sorted(DOCS.glob("h200-tune-threads/*/bench.json")), *sorted(DOCS.glob("h200-plain-text/*/bench.json")),
           *sorted(DOCS.glob("h200-buckets/*/bench.json")), *sorted(DOCS.glob("h200-word-cache/*/bench.json")),
           *sorted(DOCS.glob("h200-sender/*/bench.json")), *sorted(DOCS.glob("h200-peer-same-call/*/bench.json")),
           *sorted(DOCS.glob("h200-tune-vs-handpicked-2/*/bench.json"))]
#: Older shapes: three rounds without the bundle's restarts; one round with all four systems.
OLDER = [DOCS / "h200-repeat" / "bert-base.json", DOCS / "h200-bert-base.json"]


@pytest.mark.parametrize("path", CURRENT + OLDER, ids=lambda p: str(p.relative_to(DOCS)))
def test_a_committed_report_reads_back_and_writes_the_same_json(path: Path) -> None:
    text = path.read_text()
    data = json.loads(text)
    assert json.dumps(BenchResult.from_json(data).to_json(), indent=2) == json.dumps(data, indent=2)


@pytest.mark.parametrize("path", CURRENT, ids=lambda p: str(p.relative_to(DOCS)))
def test_the_markdown_from_a_committed_report_is_the_committed_one(path: Path) -> None:
    result = BenchResult.from_json(json.loads(path.read_text()))
    assert report.markdown(result) == path.with_suffix(".md").read_text()


def test_each_system_reads_back_as_its_own_record() -> None:
    result = BenchResult.from_json(json.loads(OLDER[1].read_text()))
    systems = result.models["bert_base"].systems
    assert isinstance(systems["bundle"], BundleResult) and systems["bundle"].breakdown is not None
    assert isinstance(systems["peer"], PeerResult) and systems["peer"].settings
    ceiling = systems["ceiling"]
    assert isinstance(ceiling, CeilingResult) and ceiling.best is not None and ceiling.best.feasible
    assert systems["bundle"].sweep.best_rps == systems["bundle"].best_rps


def test_a_failed_system_and_build_keep_their_error(tmp_path: Path) -> None:
    data = {"command": "c", "options": {}, "environment": {}, "status": "done", "models": {"m": {
        "description": "d", "recipe": "r", "random_weights": True,
        "systems": {"bundle": {"status": "failed", "error": "the repository could not be built"}},
        "build": {"status": "failed", "error": "ConfigError: no weights", "traceback": "..."}}}}
    result = BenchResult.from_json(data)
    assert result.to_json() == data
    assert "- build failed: ConfigError: no weights" in report.markdown(result)


@pytest.mark.parametrize(("servers", "line"), [
    ([1046], "GPU sharing: mps, MPS server process(es) [1046]"),
    ([], "GPU sharing: mps was asked for, but the instances reached no MPS server: they time-sliced the GPU"),
])
def test_the_report_says_whether_the_bundle_reached_an_mps_server(servers: list[int], line: str) -> None:
    """The H200 run through TRITONBUNDLE_GPU_SHARING=mps (before the bench kept the server ids): with
    them it says which; a client that reaches no MPS server runs without it silently, and the report says so."""
    import dataclasses

    result = BenchResult.from_json(json.loads((DOCS / "h200-mps" / "mps-tokens-bench.json").read_text()))
    model = result.models["bert_base"]
    bundle = model.systems["bundle"]
    assert isinstance(bundle, BundleResult) and bundle.mps_servers is None
    model.systems["bundle"] = dataclasses.replace(bundle, mps_servers=servers)
    text = report.markdown(result)
    assert f"\n{line}\n" in text and "- GPU sharing (the bundle's instances): mps" in text
    assert BenchResult.from_json(result.to_json()).models["bert_base"].systems["bundle"] == model.systems["bundle"]
