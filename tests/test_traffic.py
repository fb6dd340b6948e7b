from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tritonbundle import traffic
from tritonbundle.errors import ConfigError


def test_round_trip_through_json_lines(tmp_path: Path) -> None:
    sample = traffic.synthetic("chat", n=200, seed=1, batch_max=4, rate_per_s=50)
    loaded = traffic.load(traffic.dump(sample, tmp_path / "s.jsonl"))
    assert [(r.tokens, r.batch) for r in loaded.requests] == [(r.tokens, r.batch) for r in sample.requests]
    assert all(r.t is not None for r in loaded.requests)


def test_chat_sample_has_the_documented_shape() -> None:
    s = traffic.synthetic("chat", n=20000, seed=0).summary()
    assert 55 <= s["p50_tokens"] <= 65
    assert 75 <= s["mean_tokens"] <= 90
    assert 200 <= s["p95_tokens"] <= 250
    assert s["max_tokens"] <= 512


def test_bimodal_sample_has_two_modes() -> None:
    lengths = traffic.synthetic("bimodal", n=20000, seed=0).lengths
    docs = np.mean((lengths > 250) & (lengths < 500))
    assert 0.15 <= docs <= 0.25


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "not JSON"),
        ('{"batch": 2}', "with a 'tokens' or a 'shape' key"),
        ('{"shape": {"height": 0}}', "shape.height must be an integer >= 1"),
        ('{"shape": {"sequence": 5}}', "give the sequence length as 'tokens'"),
        ('{"shape": [480, 640]}', "'shape' must be an object of axis sizes"),
        ('{"tokens": 0}', "'tokens' must be an integer >= 1"),
        ('{"tokens": 5, "batch": -1}', "'batch' must be an integer >= 1"),
        ('{"tokens": 5, "len": 3}', "unknown keys"),
        ('{"tokens": 5, "t": -2}', "'t' must be a number"),
    ],
)
def test_bad_lines_are_named_by_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"tokens": 3}\n' + line + "\n")
    with pytest.raises(ConfigError, match=rf"bad.jsonl:2: .*{message}"):
        traffic.load(path)


def test_empty_sample_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("# only a comment\n\n")
    with pytest.raises(ConfigError, match="the traffic sample is empty"):
        traffic.load(path)


def test_clipping_truncates_like_the_tokenizer() -> None:
    s = traffic.TrafficSample((traffic.Request(600, 2), traffic.Request(10)))
    assert s.clipped(512).row_lengths().tolist() == [512, 512, 10]
