"""docs/benchmarks.md, "An eighth H100" and "The targets, host by host": the committed reports of the
session-30 calls read back. The hand-picked BERT-base settings three times with the ceiling after each,
then three times more with the peer after each: 0.76 of the ceiling in every round, 22.7 over the peer,
and every knee where the GPU filled."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from tritonbundle.bench.compare import markdown, summarize

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "docs" / "benchmarks" / "h100-eighth-host"


def _said(name: str) -> str:
    return " ".join((ROOT / name).read_text().split())


def _bundle(call: str, run: str) -> dict:
    data = json.loads((FOLDER / call / "runs" / run / "bench.json").read_text())
    return data["models"]["bert_base"]["systems"]["bundle"]


def test_the_ceiling_call_reads_as_the_docs_say() -> None:
    settings = {s.name: s for s in summarize(FOLDER / "ceiling-call")}
    assert (FOLDER / "ceiling-call" / "summary.md").read_text() == markdown(list(settings.values()))
    b64, ceiling = settings["b64"], settings["ceiling"]
    assert ceiling.system == "ceiling" and len(b64.rates) == len(ceiling.rates) == 3
    ratios = [b.rps / c.rps for b, c in zip(b64.by_round, ceiling.by_round, strict=True)]
    assert all(round(r, 2) == 0.76 for r in ratios)
    assert statistics.median(ratios) >= 0.75, "the BERT-base target"
    docs = _said("docs/benchmarks.md")
    figure = (f"{b64.median:,.0f} [{min(b64.rates):,.0f}-{max(b64.rates):,.0f}] against "
              f"{ceiling.median:,.0f} [{min(ceiling.rates):,.0f}-{max(ceiling.rates):,.0f}]")
    assert f"**0.76, met** ({figure}, three rounds, 0.76 in each" in docs
    assert f"**{b64.median:,.0f}** [{min(b64.rates):,.0f}-{max(b64.rates):,.0f}], **0.76 of the ceiling**" in docs
    assert "CPU wait 4-10 / 7-10 %" in (FOLDER / "ceiling-call" / "summary.md").read_text()  # the probe's reading


def test_the_peer_call_reads_as_the_docs_say() -> None:
    settings = {s.name: s for s in summarize(FOLDER / "peer-call")}
    assert (FOLDER / "peer-call" / "summary.md").read_text() == markdown(list(settings.values()))
    b64, peer = settings["b64"], settings["peer"]
    assert peer.system == "peer" and len(peer.rates) == 2 and len(b64.rates) == 3  # the third peer run did not fit
    by_round = [b.rps / p.rps for b, p in zip(b64.by_round, peer.by_round) if p.rps]
    assert [round(r, 1) for r in by_round] == [25.8, 20.3]
    ratio = b64.median / peer.median
    assert round(ratio, 1) == 22.7 and ratio >= 10, "the bundle/peer target"
    assert (f"**22.7**, met ({b64.median:,.0f} [{min(b64.rates):,.0f}-{max(b64.rates):,.0f}] against "
            f"{peer.median:,.0f} [{min(peer.rates):,.0f}-{max(peer.rates):,.0f}], two peer rounds)") in _said("docs/benchmarks.md")


def test_every_knee_came_where_the_gpu_filled() -> None:
    """All six bundle runs: the knee at 94-95 % GPU, within 0.3 % of each other, the next rung missed
    with the GPU 98-99 % busy; computed/useful 1.08-1.09 (the target is 1.15)."""
    knees = []
    for call in ("ceiling-call", "peer-call"):
        for run in ("b64-1", "b64-2", "b64-3"):
            bundle = _bundle(call, run)
            steps = sorted(bundle["sweep"]["steps"], key=lambda s: s["offered_rps"])
            knee = bundle["sweep"]["best"]
            first_miss = next(s for s in steps if s["offered_rps"] > knee["offered_rps"])
            assert not first_miss["passed"] and round(first_miss["offered_rps"]) == 15717
            assert 94 <= knee["extra"]["gpu_util_mean"] < 96 and first_miss["extra"]["gpu_util_mean"] >= 98
            assert all(3.4 <= s["window_s"] <= 4.7 for s in steps)  # --budget 130: levels comparable with the sixth host's
            knees.append(bundle["best_rps"])
    assert round((max(knees) / min(knees) - 1) * 100, 1) == 0.3  # "within 0.3 % of each other"
    for call in ("ceiling-call", "peer-call"):
        for s in summarize(FOLDER / call):
            if s.system == "bundle":
                assert all(1.08 <= r.computed_per_useful <= 1.09 for r in s.runs)
