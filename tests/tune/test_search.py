"""Coordinate descent over a synthetic response surface (the measure function is the unit's input;
the real server is measured in test_tune_cpu.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from tritonbundle.measure.search import TIME_BUDGET
from tritonbundle.tune.search import Cut, Point, PointDetail, coordinate_descent, reason
from tritonbundle.tune.space import Knob, Space, key

ROOT = Path(__file__).resolve().parents[2]

SPACE = Space((Knob("instances", (1, 2, 3, 4)), Knob("max_queue_delay_us", (0, 500, 1000, 2500, 5000))))


def surface(config: dict[str, Any]) -> float | None:
    """Best at 3 instances and 1000 us; 5000 us misses the SLO at every rate."""
    if config["max_queue_delay_us"] == 5000:
        return None
    return 100.0 - 20 * abs(config["instances"] - 3) - abs(config["max_queue_delay_us"] - 1000) / 50


def run(start: dict[str, Any], budget: int = 100) -> tuple[Any, list[dict[str, Any]]]:
    measured: list[dict[str, Any]] = []

    def measure(label: str, config: dict[str, Any]) -> Point:
        measured.append(config)
        return Point(label, config, surface(config))

    return coordinate_descent(measure, start, SPACE, can_continue=lambda: len(measured) < budget), measured


def test_finds_the_best_point_from_a_bad_start_without_measuring_any_point_twice() -> None:
    result, measured = run({"instances": 1, "max_queue_delay_us": 5000})
    assert result.best is not None and result.best.config == {"instances": 3, "max_queue_delay_us": 1000}
    assert len({key(c) for c in measured}) == len(measured)
    assert result.moves[0][:3] == ("max_queue_delay_us", 5000, 2500)  # every instance count fails at 5000 us


def test_a_failed_point_is_kept_and_loses() -> None:
    result, _ = run({"instances": 3, "max_queue_delay_us": 5000})
    failed = [p for p in result.points if p.rate is None]
    assert failed and failed[0].config["max_queue_delay_us"] == 5000
    assert result.best is not None and result.best.rate is not None


def test_the_budget_stops_the_search_and_keeps_what_was_measured() -> None:
    result, measured = run({"instances": 1, "max_queue_delay_us": 0}, budget=3)
    assert result.stopped == "time budget" and len(result.points) == len(measured) == 3
    assert result.best is max(result.points, key=lambda p: p.score)


def test_a_cut_search_says_where_and_which_knobs_no_round_stepped() -> None:
    # Instances 1 -> 2 -> 4 (a doubling stride), then cut before 3 (bisecting back): stepping the instances.
    result, measured = run({"instances": 1, "max_queue_delay_us": 0}, budget=3)
    assert [c["instances"] for c in measured] == [1, 2, 4]
    assert result.cut_in == Cut(1, "instances", False, ("max_queue_delay_us",))
    text = reason(result, None)
    assert "ended the search in round 1 while it stepped instances; no round stepped max_queue_delay_us: " in text
    assert "--resume tune.json" in text
    # The instances done (3 measured), cut before the queue delay's first step.
    between, _ = run({"instances": 1, "max_queue_delay_us": 0}, budget=4)
    assert between.cut_in == Cut(1, None, False, ("max_queue_delay_us",))
    assert "ended the search in round 1; no round stepped max_queue_delay_us: " in reason(between, None)
    # Cut in round 2: every knob stepped in round 1, so none is named.
    later, _ = run({"instances": 1, "max_queue_delay_us": 0}, budget=7)
    assert later.cut_in == Cut(2, None, False, ())
    assert "ended the search in round 2: give it a larger --budget-s" in reason(later, None)
    done, _ = run({"instances": 1, "max_queue_delay_us": 0})
    assert done.cut_in is None and "ended the search" not in reason(done, None)


def test_a_cut_in_the_tie_break_says_so_and_a_knob_of_one_value_is_not_untried() -> None:
    space = Space((*SPACE.knobs, Knob("tokenizer_threads", (1,))))  # one value: no step to take
    measured: list[dict[str, Any]] = []

    def flat(label: str, config: dict[str, Any], n: int = 0) -> Point:
        measured.append(config)
        return Point(label, config, 100.0 + config["instances"] * 0.5)  # every step within the noise

    start = {"instances": 2, "max_queue_delay_us": 1000, "tokenizer_threads": 1}
    whole = coordinate_descent(flat, start, space, can_continue=lambda: True, again=flat)
    steps = len([p for p in whole.points if not p.label.startswith("tie-break")])
    measured.clear()
    result = coordinate_descent(flat, start, space, can_continue=lambda: len(measured) <= steps, again=flat)
    assert result.cut_in == Cut(1, None, True, ())
    assert "ended the search in round 1 in its tie-break: give it" in reason(result, None)


def test_moves_below_the_noise_margin_are_not_taken() -> None:
    def flat(label: str, config: dict[str, Any]) -> Point:
        return Point(label, config, 100.0 + config["instances"] * 0.5)  # +0.5 % per instance: noise

    result = coordinate_descent(flat, {"instances": 1, "max_queue_delay_us": 0}, SPACE, can_continue=lambda: True)
    assert result.moves == []


def test_the_reason_names_the_winner_the_defaults_and_each_move() -> None:
    result, _ = run({"instances": 1, "max_queue_delay_us": 5000})
    baseline = Point("defaults", {"instances": 1, "max_queue_delay_us": 2000}, 50.0)
    text = reason(result, baseline)
    assert "instances=3" in text and "50.0 req/s" in text and "+100%" in text
    assert "max_queue_delay_us 5000 -> 2500" in text
    assert reason(result, result.best).count("manifest's own setting") == 1


def test_a_verdict_after_the_start_alone_says_the_search_measured_no_candidate() -> None:
    from tritonbundle.tune.search import Result

    only = Point("start", {"instances": 1}, 12.5)
    text = reason(Result([only], only, [], "time budget"), only)
    assert "stopped (time budget) before it measured any candidate past its start" in text
    assert "noise margin" not in text
    other = Point("round 1: instances 2", {"instances": 2}, 12.6)
    text = reason(Result([only, other], only, [], "converged"), only)
    assert "none of the 1 other configuration(s) measured beat it" in text
    failing = Point("the manifest's defaults", {"instances": 4}, None)
    assert "met the SLO at no rate tried" in reason(Result([only, failing], only, [], "converged"), failing)


def test_the_tuned_manifest_keeps_the_files_comments_and_layout(tmp_path: Path) -> None:
    import yaml

    from tritonbundle.tune.report import tuned_manifest

    manifest = ROOT / "build" / "models.yaml"
    out = tuned_manifest(manifest, "minilm", {"instances": 3, "batch_buckets": (1, 16), "max_queue_delay_us": 500},
                         tmp_path / "models.tuned.yaml")
    text = out.read_text()
    for line in manifest.read_text().splitlines():
        if line.strip().startswith("#"):
            assert line in text, line  # every comment of the original is still there
    entry = yaml.safe_load(text)["models"][0]
    assert (entry["instances"], entry["batch_buckets"], entry["max_queue_delay_us"]) == (3, [1, 16], 500)
    assert "max_queue_delay_us: 2000 # dynamic batcher" in text  # the defaults block is untouched


def test_the_first_rate_comes_from_the_engines_launch_timings() -> None:
    from tritonbundle.tune.run import capacity_estimate

    launches = {"1x64": 1.0, "32x64": 8.0, "64x64": 40.0, "1x256": 2.0, "32x256": 20.0}
    # 64 rows: 40 ms is over half of a 50 ms SLO; per length the best fitting batch: 4 and 1.6 rows/ms.
    assert capacity_estimate(launches, 2, 50.0) == 2 * (4000 + 1600) / 2
    assert capacity_estimate(None, 2, 50.0) is None


def test_instances_sharing_a_gpu_do_not_multiply_its_capacity() -> None:
    """On the H200 eight folded instances' estimate made the first level 19,685 req/s: 61 % failed."""
    from tritonbundle.tune.run import launches_at_once

    assert launches_at_once("gpu", 8) == 1 and launches_at_once("cpu", 8) == 8


def _noisy(rates: dict[int, list[float | None]]) -> tuple[Any, list[tuple[str, int]]]:
    """A measure whose n-th measurement of ``instances=k`` returns ``rates[k][n]``; records the order."""
    calls: list[tuple[str, int]] = []

    def measure(label: str, config: dict[str, Any]) -> Point:
        k = config["instances"]
        n = sum(1 for _, c in calls if c == k)
        calls.append((label, k))
        return Point(label, config, rates[k][n])

    return measure, calls


def test_the_finalists_are_measured_again_in_turns_and_the_better_median_wins() -> None:
    """One lucky search (130 for 2 instances, then 80, 82) loses to a steady 100 by median."""
    from tritonbundle.tune.search import Result, confirm

    measure, calls = _noisy({1: [100.0, 101.0, 99.0], 2: [130.0, 80.0, 82.0], 3: [90.0]})
    points = [measure("start", {"instances": k}) for k in (1, 2, 3)]
    result = Result(points, max(points, key=lambda p: p.score), [], "converged")
    confirm(measure, result, points, rounds=2, can_continue=lambda: True)
    assert [k for _, k in calls[3:]] == [2, 1, 2, 1], "in turns, the single best first"
    assert calls[3][0] == "again 1: start"
    assert result.best is not None and result.best.config == {"instances": 1}
    assert result.best.rate == 100.0 and result.best.detail["rates"] == [100.0, 101.0, 99.0]
    assert "median 100.0 of [100.0, 101.0, 99.0]" in reason(result, None)
    assert "median 82.0 of [130.0, 80.0, 82.0]" in reason(result, None)


def test_the_defaults_are_the_other_finalist_and_a_failed_measurement_counts_zero() -> None:
    from tritonbundle.tune.search import Result, confirm, confirmed

    measure, calls = _noisy({1: [50.0, 60.0, 55.0], 2: [70.0, None, 71.0], 3: [65.0]})
    points = [measure("start", {"instances": k}) for k in (1, 2, 3)]
    result = Result(points, points[1], [], "converged")
    defaults = points[0]
    confirm(measure, result, points, rounds=2, can_continue=lambda: True, versus=defaults)
    assert sorted({k for _, k in calls[3:]}) == [1, 2], "the defaults, not the runner-up (3), are re-measured"
    assert result.best is not None and result.best.rate == 70.0  # median of 70, 0, 71
    again = confirmed(result, defaults)
    assert again is not None and again.rate == 55.0
    assert "+27% on the same measurement" in reason(result, again)


def test_finalists_that_both_fail_their_re_measurements_confirm_no_winner() -> None:
    """Medians of [1000, 0, 0] and [900, 0, 0] are 0: the winner was named with rate None, "sustains 0.0
    req/s within the SLO", and its settings written."""
    from tritonbundle.tune.search import Result, confirm

    measure, _ = _noisy({1: [1000.0, None, None], 2: [900.0, None, None]})
    points = [measure("start", {"instances": k}) for k in (1, 2)]
    result = Result(points, points[0], [], "converged")
    confirm(measure, result, points, rounds=2, can_continue=lambda: True)
    assert result.best is None and reason(result, None).startswith(
        "no winner: re-measured side by side, no finalist met the SLO in most of its readings: ")
    assert "[1,000.0, 0.0, 0.0]" in reason(result, None) and "[900.0, 0.0, 0.0]" in reason(result, None)
    assert [rates for _, rates in result.finals.values()] == [[1000.0, 0, 0], [900.0, 0, 0]]


def test_a_round_with_a_re_measurement_the_budget_cut_short_stays_out_of_the_finals() -> None:
    """A cut search's rate is a floor: as a reading it pulled that finalist's median down (105 and a cut
    40: 72.5, under the other's steady 100). Left out alone, it would leave that finalist's one earlier
    reading against the other's two: the round is left out for both, so the medians stay side by side."""
    from tritonbundle.tune.search import Result, confirm

    calls: list[int] = []

    def measure(label: str, config: dict[str, Any]) -> Point:
        calls.append(config["instances"])
        cut = len(calls) == 4  # round 1's re-measurement of 2: its search cut by the budget at 40
        rate = 40.0 if cut else {1: 100.0, 2: 105.0}[config["instances"]]
        return Point(label, config, rate, {"stopped": "time budget"} if cut else {})

    points = [measure("start", {"instances": k}) for k in (1, 2)]
    result = Result(points, points[0], [], "converged")
    confirm(measure, result, points, rounds=2, can_continue=lambda: True)
    assert calls == [1, 2, 1, 2, 1, 2]
    assert [rates for _, rates in result.finals.values()] == [[100.0, 100.0], [105.0, 105.0]]
    assert result.best is not None and result.best.config == {"instances": 2}


def test_no_time_or_one_round_leaves_the_single_best() -> None:
    from tritonbundle.tune.search import Result, confirm

    measure, calls = _noisy({1: [100.0], 2: [130.0]})
    points = [measure("start", {"instances": k}) for k in (1, 2)]
    result = Result(points, points[1], [], "converged")
    confirm(measure, result, points, rounds=2, can_continue=lambda: False)
    assert len(calls) == 2
    assert result.best is points[1] and "re-measured" not in reason(result, None)
    confirm(measure, result, points, rounds=0, can_continue=lambda: True)
    assert len(calls) == 2 and result.best is points[1]


def test_a_folded_configuration_spends_no_point_on_the_tokenizer_models_knobs() -> None:
    """With the tokenizer in the encoder there is no tokenizer model: its instances and queue delay do
    nothing, so the descent does not measure them; the tokenizer's threads still count."""
    from tritonbundle.tune.space import inert

    space = Space((Knob("tokenize_in_encoder", (False, True)), Knob("tokenizer_instances", (1, 2, 4)),
                   Knob("tokenizer_queue_delay_us", (0, 100)), Knob("tokenizer_threads", (1, 2))))
    measured: list[dict[str, Any]] = []

    def measure(label: str, config: dict[str, Any]) -> Point:
        measured.append(config)
        return Point(label, config, 200.0 if config["tokenize_in_encoder"] else 100.0)

    start = {"tokenize_in_encoder": False, "tokenizer_instances": 2, "tokenizer_queue_delay_us": 0, "tokenizer_threads": 1}
    result = coordinate_descent(measure, start, space, can_continue=lambda: True)
    assert result.best is not None and result.best.config["tokenize_in_encoder"] is True
    folded = [c for c in measured if c["tokenize_in_encoder"]]
    assert {c["tokenizer_threads"] for c in folded} == {1, 2}
    assert {(c["tokenizer_instances"], c["tokenizer_queue_delay_us"]) for c in folded} == {(2, 0)}
    assert inert("tokenizer_instances", {"tokenize_in_encoder": True})
    assert not inert("tokenizer_threads", {"tokenize_in_encoder": True})
    assert not inert("tokenizer_instances", {"tokenize_in_encoder": False})


def test_a_move_that_pays_is_followed_at_doubling_strides() -> None:
    """Rate grows with instances up to 8: from 1, the steps 2, 4, 8 (three points, not five rounds)."""
    space = Space((Knob("instances", (1, 2, 3, 4, 6, 8)),))
    measured: list[int] = []

    def measure(label: str, config: dict[str, Any]) -> Point:
        measured.append(config["instances"])
        return Point(label, config, 100.0 * config["instances"])

    result = coordinate_descent(measure, {"instances": 1}, space, can_continue=lambda: True)
    assert measured[:4] == [1, 2, 4, 8]
    assert [m[2] for m in result.moves] == [2, 4, 8]
    assert measured[4:] == [6], "the next round tries the value the stride skipped, not 1 or 2 again"
    assert result.best is not None and result.best.config == {"instances": 8}


def test_a_stride_past_the_best_is_bisected_back_and_the_rest_comes_next_round() -> None:
    """Best at 4 of (1, 2, 3, 4, 6, 8): 2 pays, 4 pays, 8 does not, so 6 (between 4 and 8) at once;
    round 2 tries 3, the other value around 4."""
    space = Space((Knob("instances", (1, 2, 3, 4, 6, 8)),))
    measured: list[int] = []

    def measure(label: str, config: dict[str, Any]) -> Point:
        measured.append(config["instances"])
        return Point(label, config, 100.0 - 10 * abs(config["instances"] - 4))

    result = coordinate_descent(measure, {"instances": 1}, space, can_continue=lambda: True)
    assert measured == [1, 2, 4, 8, 6, 3]
    assert result.best is not None and result.best.config == {"instances": 4}


def test_a_stride_that_overshot_tries_the_value_it_skipped_before_the_next_knob() -> None:
    """As on the H200 (2026-12-04): threads 1 -> 2 paid, the stride to 8 lost, and the budget ended
    before round 2 came back to 4 (+40 % in the bench). Now 4 is measured right after 8, before the
    queue delay, and taken; a bisection that pays keeps halving towards the value that lost."""
    space = Space((Knob("tokenizer_threads", (1, 2, 4, 8)), Knob("max_queue_delay_us", (0, 500, 2500))))
    rates = {1: 100.0, 2: 115.0, 4: 140.0, 8: 90.0}
    measured: list[tuple[int, int]] = []

    def measure(label: str, config: dict[str, Any]) -> Point:
        measured.append((config["tokenizer_threads"], config["max_queue_delay_us"]))
        return Point(label, config, rates[config["tokenizer_threads"]] - config["max_queue_delay_us"] / 100)

    result = coordinate_descent(measure, {"tokenizer_threads": 1, "max_queue_delay_us": 0}, space,
                                can_continue=lambda: True)
    assert measured[:5] == [(1, 0), (2, 0), (8, 0), (4, 0), (4, 500)]
    assert [m[1:3] for m in result.moves] == [(1, 2), (2, 4)]
    assert result.best is not None and result.best.config == {"tokenizer_threads": 4, "max_queue_delay_us": 0}
    knob = Knob("batch_buckets", tuple(range(9)))
    assert [knob.between(1, 8), knob.between(8, 1), knob.between(4, 5), knob.between(3, 3)] == [4, 5, None, None]


def test_onward_values_at_doubling_strides_both_ways() -> None:
    knob = Knob("max_queue_delay_us", (0, 500, 1000, 2500, 5000))
    assert knob.onward(0, 500) == [2500, 5000]
    assert knob.onward(5000, 2500) == [500, 0]
    assert knob.onward(2500, 5000) == [] and knob.onward(7, 500) == []


def test_a_later_point_is_measured_around_the_rate_it_is_compared_with() -> None:
    """The first point climbs x2 from the start (or an eighth of the engine's estimate); a later one
    starts at 0.7 of the best so far and climbs by sqrt(2): its bisections end within 9 %, not 19 %."""
    import math

    from tritonbundle.measure.latency import Slo, step_result
    from tritonbundle.measure.search import search_rate
    from tritonbundle.tune.options import TuneOptions
    from tritonbundle.tune.run import ladder_for

    options = TuneOptions(out=ROOT, manifest=ROOT, artifacts=ROOT, start_rate=4.0, rate_factor=2.0, refine=2)
    first = ladder_for(options, 0.0, 800.0)
    assert (first.start, first.factor) == (100.0, 2.0)
    assert ladder_for(options, 0.0, None).start == 4.0
    later = ladder_for(options, 1000.0, 800.0)
    assert later.start == 700.0 and later.factor == math.sqrt(2.0)

    def knee_at(capacity: float) -> tuple[float, list[float]]:
        offered: list[float] = []

        def measure(rate: float) -> Any:
            offered.append(rate)
            return step_result(rate, 1.0, [10.0 if rate <= capacity else 100.0] * int(rate), 0)

        sweep = search_rate(measure, slo=Slo(p99_ms=50.0), start=later.start, factor=later.factor, refine=later.refine)
        return sweep.best.offered_rps if sweep.best else 0.0, offered

    # A candidate 10 % over the best so far is measured over it (the x2 ladder from a quarter of the
    # best would stop at the best itself: 250, 500, 1000 pass, 2000, 1414, 1189 fail).
    found, offered = knee_at(1100.0)
    assert 1000.0 < found <= 1100.0 and len(offered) == 5
    # A much worse one is given up a quarter of the way down.
    found, offered = knee_at(100.0)
    assert found == 0.0 and min(offered) >= 0.24 * 1000.0


def test_a_configuration_measured_more_than_once_counts_by_its_median() -> None:
    """Points taken over from an earlier run's finalists (tune --resume): 130 then 80 then 82 for two
    instances is a median of 82, below one instance's single 100; as a finalist it starts from all three."""
    from tritonbundle.tune.search import Result, by_configuration, confirm

    points = [Point("start", {"instances": 1}, 100.0), Point("round 1: instances=2", {"instances": 2}, 130.0),
              Point("again 1: round 1: instances=2", {"instances": 2}, 80.0),
              Point("again 2: round 1: instances=2", {"instances": 2}, 82.0)]
    merged = by_configuration(points)
    assert [(p.label, p.rate) for p in merged] == [("start", 100.0), ("round 1: instances=2", 82.0)]
    assert merged[1].detail["rates"] == [130.0, 80.0, 82.0]
    measure, calls = _noisy({1: [101.0], 2: [84.0]})
    result = Result(points, merged[0], [], "converged")
    confirm(measure, result, merged, rounds=1, can_continue=lambda: True)
    assert result.finals[key({"instances": 2})][1] == [130.0, 80.0, 82.0, 84.0]
    assert result.best is not None and result.best.config == {"instances": 1}


def test_finalists_compare_on_this_runs_readings_only() -> None:
    """tune --resume on another H100 (docs/tuning/h100-bert-base-resume-4): the reference read 13,461 on
    the earlier host and 14,635 here; its median of both went into the finals beside the winner's two
    readings from here. With this run's readings only, a finalist another run measured starts empty."""
    from tritonbundle.tune.search import Result, confirm, run_of

    def point(label: str, threads: int, rate: float, run: str) -> Point:
        return Point(label, {"tokenizer_threads": threads}, rate, {"run": run})

    def finals(time_left: bool, this_run_only: bool = True) -> Result:
        points = [point("the reference", 4, 13_461.3, "earlier"),
                  point("round 1: tokenizer_threads=2", 2, 14_618.3, "here")]

        def again(label: str, config: dict[str, Any]) -> Point:
            got = {2: 13_217.0, 4: 14_635.3}[config["tokenizer_threads"]]
            points.append(point(label, config["tokenizer_threads"], got, "here"))
            return points[-1]

        def here(p: Point) -> list[float]:
            return [q.score for q in points if q.config == p.config and run_of(q) == "here"]

        result = Result(list(points), points[1], [], "budget")
        confirm(again, result, list(points), rounds=1, can_continue=lambda: time_left, versus=points[0],
                weighed=False, readings=here if this_run_only else None)
        return result

    result = finals(time_left=True)
    assert result.best is not None and result.best.config == {"tokenizer_threads": 4}
    assert result.best.detail["rates"] == [14_635.3], "the earlier host's 13,461 is not one of its readings"
    assert not result.finals, "one reading on the reference's side: named by it, with no side-by-side claim"
    # Left with no reading here (no time to measure it again), it compares with nothing.
    result = finals(time_left=False)
    assert result.best is not None and result.best.label == "round 1: tokenizer_threads=2" and not result.finals
    # By default (no runs to tell apart) every reading counts, as before.
    result = finals(time_left=True, this_run_only=False)
    assert result.finals[key({"tokenizer_threads": 4})][1] == [13_461.3, 14_635.3]


def test_the_fold_is_tried_with_the_tokenizers_processes_kept() -> None:
    """Folded, the rate grows with the instances (80 each); beside tokenizers it is what the encoders
    pass (100 each, up to the tokenizers'). Folding two encoders alone would lose (160 < 200): the
    descent tries six folded instances, the two models' processes, and takes it."""
    space = Space((Knob("tokenize_in_encoder", (False, True)), Knob("instances", (1, 2, 3, 4, 6, 8))))
    measured: list[dict[str, Any]] = []

    def measure(label: str, config: dict[str, Any]) -> Point:
        measured.append(config)
        if config["tokenize_in_encoder"]:
            return Point(label, config, 80.0 * config["instances"])
        return Point(label, config, 100.0 * min(config["instances"], config["tokenizer_instances"]))

    start = {"tokenize_in_encoder": False, "instances": 2, "tokenizer_instances": 4}
    result = coordinate_descent(measure, start, space, can_continue=lambda: True)
    assert measured[1] == {**start, "tokenize_in_encoder": True, "instances": 6}
    assert result.points[1].label == "round 1: instances=6, tokenize_in_encoder=True"
    assert {"tokenize_in_encoder": True, "instances": 2, "tokenizer_instances": 4} not in measured
    assert result.best is not None and result.best.config["instances"] == 8
    assert result.best.config["tokenize_in_encoder"] is True


def test_a_step_as_fast_on_less_server_cpu_moves_and_one_as_fast_on_more_does_not() -> None:
    """The H200's reading from the bad start (docs/tuning.md): folding the tokenizer in passed 14,501
    req/s on 4.40 server cores where eight encoders beside four tokenizers passed 14,486 on 7.23. The
    fold moves (the reason says why); eight instances at the same rate on more cores do not."""
    space = Space((Knob("tokenize_in_encoder", (False, True)), Knob("instances", (6, 8))))
    table = {(False, 6): (14_486.0, 7.23), (True, 8): (14_501.0, 4.40), (True, 6): (14_400.0, 4.6),
             (False, 8): (14_490.0, 9.0)}

    def measure(label: str, config: dict[str, Any]) -> Point:
        rate, cores = table[(config["tokenize_in_encoder"], config["instances"])]
        return Point(label, config, rate, {"server_cores": cores})

    start = {"tokenize_in_encoder": False, "instances": 6, "tokenizer_instances": 2}
    result = coordinate_descent(measure, start, space, can_continue=lambda: True)
    assert result.moves[0] == ("tokenize_in_encoder", False, True, 14_486.0, 14_501.0)
    assert result.best is not None and result.best.config["tokenize_in_encoder"] is True
    assert result.best.config["instances"] == 8  # the fold keeps the processes: 6 + 2
    assert "(as fast, on less server CPU per request)" in reason(result, None)
    unfolded = coordinate_descent(measure, {"tokenize_in_encoder": False, "instances": 6, "tokenizer_instances": 2},
                                  Space((Knob("instances", (6, 8)),)), can_continue=lambda: True)
    assert unfolded.moves == []  # 14,490 on 9.0 cores: as fast, not cheaper
    table[(True, 8)] = (14_486.0 / 1.04, 4.40)  # cheaper, but 4 % slower: not as fast
    slower = coordinate_descent(measure, start, space, can_continue=lambda: True)
    assert all(m[0] != "tokenize_in_encoder" for m in slower.moves)


def test_a_point_that_paid_just_over_the_margin_is_not_left_again_as_fast_and_cheaper() -> None:
    """B beats A by 3.05 %, A costs half B's CPU: A -> B is a rate move, and B -> A must not read as fast
    (within 3 % of B from A's side is 1/1.0305 = 0.970 < 1/1.03), or the descent would go back and forth."""
    space = Space((Knob("instances", (1, 2)),))

    def measure(label: str, config: dict[str, Any]) -> Point:
        one = config["instances"] == 1
        return Point(label, config, 100.0 if one else 103.05, {"server_cores": 1.0 if one else 2.0})

    result = coordinate_descent(measure, {"instances": 1}, space, can_continue=lambda: True)
    assert [m[:3] for m in result.moves] == [("instances", 1, 2)] and result.stopped == "converged"


def test_a_round_that_moved_nothing_measures_the_close_ones_again_and_moves_by_median() -> None:
    """The start read high once (110, then 90 and 92); two instances read 105, then 104: by single
    measurements nothing moves; measured again in turns, 104.5 beats 100 by more than 3 % and the
    descent moves. The far neighbour (3 instances, 60) is measured once, past the inconclusive 2 (105
    is within the noise band under 110), and not again; no pair is measured twice."""
    space = Space((Knob("instances", (1, 2, 3)),))
    readings = {1: [110.0, 90.0, 92.0], 2: [105.0, 104.0, 106.0], 3: [60.0, 60.0]}
    calls: list[tuple[int, int]] = []

    def again(label: str, config: dict[str, Any], n: int) -> Point:
        calls.append((config["instances"], n))
        return Point(label, config, readings[config["instances"]][n])

    result = coordinate_descent(lambda label, config: again(label, config, 0), {"instances": 1}, space,
                                can_continue=lambda: True, again=again)
    assert calls == [(1, 0), (2, 0), (3, 0), (1, 1), (2, 1)]
    assert result.moves == [("instances", 1, 2, 100.0, 104.5)]
    assert [p.label for p in result.points][3:5] == ["tie-break 1: start", "tie-break 1: round 1: instances=2"]
    without, _ = run({"instances": 3, "max_queue_delay_us": 1000})
    assert not any(p.label.startswith("tie-break") for p in without.points)


def _readings(table: dict[int, list[float]], calls: list[tuple[int, int]]) -> Any:
    def again(label: str, config: dict[str, Any], n: int) -> Point:
        calls.append((config["tokenizer_threads"], n))
        return Point(label, config, table[config["tokenizer_threads"]][n])

    return again


def test_a_step_that_reads_within_the_noise_is_looked_past_once() -> None:
    """Two threads read 5 % under one (noise: as on the H200, where four read +40 %): the descent
    measures four too and follows it (then eight, by stride). Read 30 % under one, two is a loss: four
    is not measured."""
    space = Space((Knob("tokenizer_threads", (1, 2, 4, 8)),))
    calls: list[tuple[int, int]] = []
    again = _readings({1: [100.0, 100.0], 2: [95.0, 95.0], 4: [140.0, 140.0], 8: [138.0, 138.0]}, calls)
    result = coordinate_descent(lambda label, config: again(label, config, 0), {"tokenizer_threads": 1}, space,
                                can_continue=lambda: True, again=again)
    assert [t for t, _ in calls][:4] == [1, 2, 4, 8]
    assert result.moves[0] == ("tokenizer_threads", 1, 4, 100.0, 140.0)
    assert result.best is not None and result.best.config == {"tokenizer_threads": 4}
    calls.clear()
    again = _readings({1: [100.0, 100.0], 2: [70.0, 70.0], 4: [140.0, 140.0]}, calls)
    result = coordinate_descent(lambda label, config: again(label, config, 0), {"tokenizer_threads": 1}, space,
                                can_continue=lambda: True, again=again)
    assert 4 not in [t for t, _ in calls] and result.moves == []


def test_a_resumed_runs_point_is_compared_within_one_run() -> None:
    """Run A (taken over) read one instance at 120 and two at 110; this run's machine is slower (one
    instance 90). Three instances read 100 here: against A's 120 it would lose; against the current
    point measured again here (the anchor, 90) it wins."""
    space = Space((Knob("instances", (1, 2, 3)),))
    history = {1: [Point("start", {"instances": 1}, 120.0, {"run": "A"})],
               2: [Point("round 1: instances=2", {"instances": 2}, 110.0, {"run": "A"})]}
    here = {1: 90.0, 2: 85.0, 3: 100.0}

    def again(label: str, config: dict[str, Any], n: int) -> Point:
        got = history.setdefault(config["instances"], [])
        if n >= len(got):
            got.append(Point(label, config, here[config["instances"]], {"run": "B"}))
        return got[n]

    result = coordinate_descent(lambda label, config: again(label, config, 0), {"instances": 1}, space,
                                can_continue=lambda: True, again=again)
    assert "anchor: start" in [p.label for p in result.points]
    assert result.moves[0] == ("instances", 1, 3, 90.0, 100.0)
    assert result.best is not None and result.best.config == {"instances": 3}


def test_the_noise_band_is_the_widest_spread_of_a_repeated_configuration() -> None:
    from tritonbundle.tune.search import NOISE_CAP, TIE_BAND, noise_band

    def points(*rates: float | None) -> list[Point]:
        return [Point("p", {}, r) for r in rates]

    assert noise_band({}) == TIE_BAND and noise_band({1: points(100.0)}) == TIE_BAND
    assert noise_band({1: points(100.0, 75.0), 2: points(100.0, 90.0)}) == 0.25
    assert noise_band({1: points(100.0, None)}) == NOISE_CAP


def test_the_reason_states_the_winner_against_the_versus_settings() -> None:
    result, _ = run({"instances": 1, "max_queue_delay_us": 0})
    assert result.best is not None and result.best.score == 100.0
    slower = Point("the reference (x.json)", {"instances": 2, "max_queue_delay_us": 1000}, 80.0)
    assert "the reference settings (--versus) sustain 80.0 req/s: the winner is +25% on them" in reason(result, None, slower)
    failed = Point("the reference (x.json)", {"instances": 2, "max_queue_delay_us": 5000}, None)
    assert "the reference settings (--versus) met the SLO at no rate tried" in reason(result, None, failed)
    same = Point("the reference (x.json)", dict(result.best.config), 99.0)
    assert "it is the reference settings (--versus)" in reason(result, None, same)
    assert "--versus" not in reason(result, None)


def test_settings_the_descent_never_weighed_win_on_one_reading_when_they_read_higher() -> None:
    """``tune --versus`` with no time to re-measure (the H100's tight budgets): the settings to beat read
    150 beside the descent's pick at 130. They were never a step of the descent, so the higher reading
    names them; the manifest's defaults (weighed: the descent started from them) would not overturn it.
    Without a second reading of each there is no side-by-side claim."""
    from tritonbundle.tune.search import Result, confirm

    measure, calls = _noisy({1: [100.0], 2: [130.0, 120.0], 4: [150.0]})
    points = [measure("start", {"instances": k}) for k in (1, 2)]
    reference = measure("the reference", {"instances": 4})
    reference.detail["stopped"] = TIME_BUDGET  # its rate search cut: 150 is a floor
    result = Result(points, points[1], [], "time budget")
    confirm(measure, result, points, rounds=2, can_continue=lambda: False, versus=reference, weighed=False)
    assert result.best is not None and result.best.config == {"instances": 4} and result.best.rate == 150.0
    words = reason(result, points[0], reference)
    assert "sustains 150.0 req/s or more (the budget cut its rate search) within the SLO" in words
    assert "it is the reference settings (--versus)" in words and "re-measured" not in words

    result = Result(points, points[1], [], "time budget")
    confirm(measure, result, points, rounds=2, can_continue=lambda: False, versus=reference, weighed=True)
    assert result.best is points[1], "a point the descent weighed does not overturn its pick on one reading"

    # Time for one more measurement: the pick read again (130, 120: median 125), the reference not.
    budget = [True]
    result = Result(points, points[1], [], "time budget")
    confirm(measure, result, points, rounds=2, can_continue=lambda: bool(budget and budget.pop()), versus=reference,
            weighed=False)
    assert [k for _, k in calls[3:]] == [2]
    assert not result.finals and result.best is not None and result.best.config == {"instances": 4}

    # Read lower than the pick, the reference does not win.
    low = Point("the reference", {"instances": 4}, 110.0)
    result = Result(points, points[1], [], "time budget")
    confirm(measure, result, points, rounds=0, can_continue=lambda: True, versus=low, weighed=False)
    assert result.best is points[1]


def test_instances_try_the_larger_neighbour_first_and_the_smaller_only_when_it_does_not_pay() -> None:
    """The H100 run from the bad start (docs/tuning/h100-bert-base-bad-start) stepped from the defaults'
    2 instances to 1 first (3,933 req/s against 6,081: 52 s of a 520-s budget for nothing), then 3, 6, 8.
    With the larger neighbour first the same surface costs one point less; where fewer instances pay
    (a CPU-bound host) the smaller one is still tried, one point later."""
    from tritonbundle.tune.space import space as make_space

    searched = make_space(slo_ms=50, cores=16, text=True, gpu=True, knobs=("instances",), include=({"instances": 5},))
    knob = searched.knob("instances")
    assert knob.upward_first and 5 in knob.values and knob.neighbours(2) == [3, 1]
    assert Knob("max_queue_delay_us", (0, 1000, 2500)).neighbours(1000) == [0, 2500]

    recorded = {1: 3933.3, 2: 6080.7, 3: 8406.3, 6: 11679.3, 8: 12654.0}
    for upward, first_steps in ((False, [2, 1, 3, 6, 8]), (True, [2, 3, 6, 8])):
        space = Space((Knob("instances", (1, 2, 3, 4, 6, 8), upward_first=upward),))
        result = coordinate_descent(lambda label, config: Point(label, config, recorded.get(config["instances"], 1e4)),
                                    {"instances": 2}, space, can_continue=lambda: True)
        assert [p.config["instances"] for p in result.points][: len(first_steps)] == first_steps
        assert result.best is not None and result.best.config == {"instances": 8}

    measured: list[int] = []

    def fewer_pay(label: str, config: dict[str, Any]) -> Point:
        measured.append(config["instances"])
        return Point(label, config, 100.0 / config["instances"])

    space = Space((Knob("instances", (1, 2, 3, 4), upward_first=True),))
    result = coordinate_descent(fewer_pay, {"instances": 2}, space, can_continue=lambda: True)
    assert measured == [2, 3, 1] and result.best is not None and result.best.config == {"instances": 1}


def test_a_cut_search_says_how_long_its_points_took_and_what_the_knobs_left_would_add() -> None:
    """The budget a user asks for next: the points' mean time, and one point per knob no round stepped."""
    measured: list[dict[str, Any]] = []

    def timed(label: str, config: dict[str, Any]) -> Point:
        measured.append(config)
        return Point(label, config, surface(config), cast(PointDetail, {"seconds": 40.0 + config["instances"]}))

    result = coordinate_descent(timed, {"instances": 1, "max_queue_delay_us": 0}, SPACE,
                                can_continue=lambda: len(measured) < 4)
    assert result.cut_in == Cut(1, None, False, ("max_queue_delay_us",))
    # Instances 1, 2, 4, 3: 41, 42, 44, 43 s, mean 42.5; one knob left.
    assert ("no round stepped max_queue_delay_us: give it a larger --budget-s (its points took ~42 s each: "
            "~42 s more for one point per knob left), or go on from this run with --resume tune.json") in reason(result, None)
    untimed, _ = run({"instances": 1, "max_queue_delay_us": 0}, budget=4)
    assert "give it a larger --budget-s, or go on" in reason(untimed, None)  # no times recorded: no estimate
