"""The GPU's turn (runtimes/pytorch/gpu_turn.py) with real processes and a real flock, and the engine's
launch timing read from CUDA events (a double of torch's events and graphs: no CUDA here)."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tritonbundle.runtimes.pytorch.engine import Engine
from tritonbundle.runtimes.pytorch.gpu_turn import (
    COSTS_KEPT_S,
    Turn,
    costs_path,
    gpu_turn,
    lock_path,
    share_costs,
    shared_costs,
)


def _hold(folder: str, ready: Any, seconds: float) -> None:
    with gpu_turn("GPU-1234", folder=folder) as turn:
        assert turn.held
        ready.set()
        time.sleep(seconds)


def _holder(folder: Path, seconds: float) -> Any:
    """A process that holds GPU-1234's turn for ``seconds``, started and holding it."""
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold, args=(str(folder), ready, seconds))
    holder.start()
    assert ready.wait(30), "the holder never took its turn"
    return holder


def test_a_second_process_waits_for_the_first_ones_turn_to_end(tmp_path: Path) -> None:
    holder = _holder(tmp_path, 1.0)
    try:
        with gpu_turn("GPU-1234", folder=tmp_path) as turn:
            assert turn.held and 0.5 < turn.waited_s < 10, turn
        with gpu_turn("GPU-5678", folder=tmp_path) as other:  # another GPU: no wait
            assert other.held and other.waited_s < 0.5
    finally:
        holder.join(10)
    assert holder.exitcode == 0


def test_a_turn_held_past_the_timeout_is_timed_without_it_and_a_dead_holder_lets_go(tmp_path: Path) -> None:
    holder = _holder(tmp_path, 60.0)
    try:
        with gpu_turn("GPU-1234", timeout_s=0.3, folder=tmp_path) as turn:
            assert not turn.held and 0.3 <= turn.waited_s < 5, turn
        holder.kill()
        holder.join(10)
        with gpu_turn("GPU-1234", timeout_s=5, folder=tmp_path) as turn:  # the kernel released the dead one's lock
            assert turn.held and turn.waited_s < 1, turn
    finally:
        holder.kill()


def test_the_lock_file_is_named_by_the_gpu_and_one_that_cannot_be_opened_gives_no_turn_and_says_why(
    tmp_path: Path,
) -> None:
    assert lock_path("GPU-8f2c/..x y", tmp_path) == tmp_path / "tritonbundle-gpu-GPU-8f2c-..x-y.lock"
    with gpu_turn("GPU-1", folder=tmp_path / "missing") as turn:
        assert not turn.held and turn.waited_s == 0.0 and "missing" in turn.error
    assert not os.path.exists(tmp_path / "missing")
    target = tmp_path / "elsewhere"
    lock_path("GPU-2", tmp_path).symlink_to(target)  # a planted link is not followed
    with gpu_turn("GPU-2", folder=tmp_path) as turn:
        assert not turn.held and turn.error
    assert not target.exists()


def test_a_lock_file_another_user_made_read_only_is_still_a_turn(tmp_path: Path) -> None:
    with gpu_turn("GPU-3", folder=tmp_path) as turn:
        assert turn.held and not turn.error
    path = lock_path("GPU-3", tmp_path)
    assert path.stat().st_mode & 0o777 == 0o644  # whatever this process's umask
    path.chmod(0o444)
    with gpu_turn("GPU-3", folder=tmp_path) as turn:
        assert turn.held and not turn.error


class _Clock:
    """A GPU's timeline: each replay runs for its scripted time, events read the time when reached."""

    def __init__(self) -> None:
        self.now_ms = 0.0


class _Event:
    def __init__(self, clock: _Clock, **_: Any) -> None:
        self.clock, self.at = clock, None

    def record(self) -> None:
        self.at = self.clock.now_ms

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: _Event) -> float:
        assert self.at is not None and end.at is not None
        return end.at - self.at


class _Graph:
    def __init__(self, clock: _Clock, times_ms: list[float]) -> None:
        self.clock, self.times = clock, list(times_ms)

    def replay(self) -> None:
        self.clock.now_ms += self.times.pop(0)


class _Torch:
    def __init__(self, clock: _Clock) -> None:
        self.cuda = type("cuda", (), {"Event": staticmethod(lambda **kw: _Event(clock, **kw))})


@pytest.mark.parametrize(("fastest", "expected_ms"), [(True, 2.0), (False, 4.0)])
def test_launch_costs_are_the_fastest_replay_after_the_warm_up(fastest: bool, expected_ms: float) -> None:
    """Replays stretched by another process's kernels (7 and 3 ms of a 2 ms launch) do not set the cost;
    the warm-up replay (50 ms) never counts. The old way (mean) is kept for A/B runs."""
    clock = _Clock()
    engine = Engine.__new__(Engine)
    engine.torch = _Torch(clock)
    engine.buckets, engine.targets = (1,), (16,)
    engine.graphs = {(1, 16): _Graph(clock, [50.0, 7.0, 2.0, 3.0])}  # type: ignore[dict-item]
    got = engine.time_shapes(reps=3, fastest=fastest)
    assert got == {(1, 16): pytest.approx(expected_ms / 1000.0)}


def test_the_engine_times_its_launch_costs_in_the_gpus_turn_unless_told_concurrent(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    from tritonbundle.runtimes.pytorch import engine as engine_mod

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where a timed table is left

    turns: list[str] = []

    @contextlib.contextmanager
    def recorded_turn(gpu: str) -> Iterator[Turn]:
        turns.append(gpu)
        yield Turn(waited_s=1.5, held=True)

    monkeypatch.setattr(engine_mod, "gpu_turn", recorded_turn)
    for mode, expected_ms, taken in (("alone", 2.0, ["GPU-abc"]), ("concurrent", 4.0, [])):
        turns.clear()
        clock = _Clock()
        engine = Engine.__new__(Engine)
        engine.torch = _Torch(clock)
        engine.shape_timing, engine.buckets, engine.targets = mode, (1,), (16,)
        engine._gpu_name = lambda: "GPU-abc"  # type: ignore[method-assign]
        engine.graphs = {(1, 16): _Graph(clock, [50.0, 7.0, 2.0, 3.0])}  # type: ignore[dict-item]
        engine.timing_turn, engine.timings_shared, engine.costs_error = Turn(), False, ""
        engine.weights_dir, engine.precision, engine.packing = tmp_path, "fp16", False
        (tmp_path / "config.json").write_text("{}")
        (tmp_path / "model.safetensors").write_bytes(b"w")
        engine._time_launch_costs()
        assert turns == taken and not engine.timings_shared
        assert engine.timings == {(1, 16): pytest.approx(expected_ms / 1000.0)}
        assert engine.timing_turn.held is (mode == "alone")


def test_a_shared_table_is_read_back_under_its_key_only_and_a_broken_file_is_none(tmp_path: Path) -> None:
    assert shared_costs("GPU-1", "k", folder=tmp_path) is None  # no file yet
    assert share_costs("GPU-1", "k", {"1x32": 0.001, "64x512": 0.021}, folder=tmp_path) == ""
    assert shared_costs("GPU-1", "k", folder=tmp_path) == {"1x32": 0.001, "64x512": 0.021}
    assert shared_costs("GPU-1", "other key", folder=tmp_path) is None
    assert shared_costs("GPU-2", "k", folder=tmp_path) is None  # another GPU's file
    assert share_costs("GPU-1", "k2", {"1x32": 0.002}, folder=tmp_path) == ""  # both kept
    assert shared_costs("GPU-1", "k", folder=tmp_path) is not None
    path = costs_path("GPU-1", folder=tmp_path)
    assert path.parent == tmp_path and str(os.getuid()) in path.name
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # written whole, renamed
    tables = json.loads(path.read_text())
    tables["k"]["written"] -= COSTS_KEPT_S + 1  # an old table is dropped at the next write
    path.write_text(json.dumps(tables))
    share_costs("GPU-1", "k3", {"1x32": 0.003}, folder=tmp_path)
    assert shared_costs("GPU-1", "k", folder=tmp_path) is None and shared_costs("GPU-1", "k2", folder=tmp_path)
    path.write_text("{not json")
    assert shared_costs("GPU-1", "k2", folder=tmp_path) is None
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_text(json.dumps({"k": {"costs_s": {"1x32": 9.0}, "written": 0}}))
    assert shared_costs("GPU-1", "k", folder=tmp_path) is None  # never read through a link
    assert share_costs("GPU-1", "k", {"1x32": 0.001}, folder=tmp_path / "missing") != ""  # says why, no raise


def _timed_engine(clock: _Clock, times_ms: list[float], weights: Path, precision: str = "fp16") -> Engine:
    engine = Engine.__new__(Engine)
    engine.torch = _Torch(clock)
    engine.shape_timing, engine.buckets, engine.targets = "alone", (1,), (16,)
    engine.weights_dir, engine.precision, engine.packing = weights, precision, False
    engine._gpu_name = lambda: "GPU-abc"  # type: ignore[method-assign]
    engine.graphs = {(1, 16): _Graph(clock, times_ms)}  # type: ignore[dict-item]
    engine.timing_turn, engine.timings_shared, engine.costs_error = Turn(), False, ""
    return engine


def test_instances_of_one_server_time_once_and_the_others_read_the_table_in_their_turn(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """The first instance times its replays (2 ms) and leaves the table; the next, the same weights and
    shapes, reads it and replays nothing; another precision, or a turn that timed out, times its own."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "model.safetensors").write_bytes(b"w")
    (weights / "config.json").write_text("{}")
    first = _timed_engine(_Clock(), [50.0, 7.0, 2.0, 3.0], weights)
    first._time_launch_costs()
    assert first.timing_turn.held and not first.timings_shared and first.costs_error == ""
    assert first.timings == {(1, 16): pytest.approx(0.002)}

    second = _timed_engine(_Clock(), [50.0, 9.0, 9.0, 9.0], weights)
    second._time_launch_costs()
    assert second.timings_shared and second.timings == first.timings
    assert second.graphs[(1, 16)].times == [50.0, 9.0, 9.0, 9.0]  # type: ignore[attr-defined]  # no replay

    other = _timed_engine(_Clock(), [50.0, 9.0, 9.0, 9.0], weights, precision="bf16")
    other._time_launch_costs()
    assert not other.timings_shared and other.timings == {(1, 16): pytest.approx(0.009)}

    (weights / "model.safetensors").write_bytes(b"other weights")  # the same path, another file
    changed = _timed_engine(_Clock(), [50.0, 4.0, 4.0, 4.0], weights)
    changed._time_launch_costs()
    assert not changed.timings_shared and changed.timings == {(1, 16): pytest.approx(0.004)}

    from tritonbundle.runtimes.pytorch import engine as engine_mod

    @contextlib.contextmanager
    def timed_out(gpu: str) -> Iterator[Turn]:
        yield Turn(waited_s=120.0, held=False)

    monkeypatch.setattr(engine_mod, "gpu_turn", timed_out)
    late = _timed_engine(_Clock(), [50.0, 5.0, 5.0, 5.0], weights)
    late._time_launch_costs()
    assert not late.timings_shared and late.timings == {(1, 16): pytest.approx(0.005)}
    assert shared_costs("GPU-abc", late._costs_key(late.shapes())) == {"1x16": pytest.approx(0.004)}  # not left by it
