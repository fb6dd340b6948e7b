"""Served models' statistics (runtimes/stats.py): what a level's p50 and p99 read; each kind read apart."""

from __future__ import annotations

import json
import math
from pathlib import Path

from tritonbundle.runtimes.stats import (
    HISTOGRAM_EDGES_MS,
    StatsWriter,
    new_stats,
    observe,
    quantile_ms,
    read_stats,
    read_stats_info,
)


def test_quantiles_are_the_upper_edges_of_the_buckets_that_hold_them() -> None:
    stats = new_stats()
    assert quantile_ms(stats, "execute_ms", 0.5) is None  # nothing counted yet
    for ms in [4.0] * 98 + [12.0, 600.0]:
        observe(stats, "execute_ms", ms)
    assert quantile_ms(stats, "execute_ms", 0.5) == 5.0  # 4 ms falls in the (3, 5] bucket
    assert quantile_ms(stats, "execute_ms", 0.99) == 15.0
    assert quantile_ms(stats, "execute_ms", 1.0) == math.inf  # past the last edge
    assert quantile_ms(stats, "gpu_ms", 0.5) is None  # the other histogram is untouched


def test_a_levels_histogram_is_the_difference_of_two_readings() -> None:
    before = new_stats()
    for _ in range(50):
        observe(before, "gpu_ms", 1.0)
    after = dict(before)
    for _ in range(10):
        observe(after, "gpu_ms", 40.0)
    level = {k: after[k] - before[k] for k in after}
    assert quantile_ms(level, "gpu_ms", 0.5) == 50.0
    assert HISTOGRAM_EDGES_MS == tuple(sorted(HISTOGRAM_EDGES_MS))


def test_the_tokenizer_and_encoder_files_are_summed_apart(tmp_path: Path) -> None:
    encoder, tokenizer = new_stats(), new_stats("tokenizer")
    assert "texts" in tokenizer and "texts" not in encoder and "rows" not in tokenizer
    encoder["executes"], tokenizer["executes"], tokenizer["texts"] = 3, 5, 20
    for pid in (1, 2):
        StatsWriter(tmp_path / f"m_encoder.{pid}.json", encoder, {"instance": f"e{pid}"}).write()
        StatsWriter(tmp_path / f"m_tokenizer.{pid}.json", tokenizer, {"instance": f"t{pid}"}, kind="tokenizer").write()
    # A file from before kinds were written is an encoder's.
    (tmp_path / "old.3.json").write_text(json.dumps({"info": {"instance": "old"}, "stats": {"executes": 1}}))
    assert read_stats(tmp_path)["executes"] == 7 and "texts" not in read_stats(tmp_path)
    assert read_stats(tmp_path, "tokenizer") == {**{k: 2.0 * v for k, v in tokenizer.items()}}
    assert [i["instance"] for i in read_stats_info(tmp_path)] == ["e1", "e2", "old"]
    assert [i["instance"] for i in read_stats_info(tmp_path, "tokenizer")] == ["t1", "t2"]
