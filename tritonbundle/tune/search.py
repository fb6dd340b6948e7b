"""Coordinate descent over the tuner's knobs: from a start, try each knob's neighbouring values, move
to the best, knob after knob, until a full round improves nothing or the budget runs out. A move that
paid is followed further the same way, at doubling strides (instances 1 -> 2 -> 4 -> 8: three points
where single steps take five rounds), while each step pays; a stride that overshot is bisected back
at once (threads 1 -> 2 paid, 8 lost: 4 next, not a round later), and the other skipped values are
the next round's neighbours. Folding the tokenizer in carries the instance count along
(:meth:`.space.Space.moved`). A step that reads within the noise under the current point is looked
past once; a comparison uses measurements of one run (``tune --resume`` spans runs and machines).
Every measured point is kept (the report shows them all), and the descent measures a point again
only for a tie-break or to compare within a run.

One rate search moves 15-40 % from run to run on the H200 (docs/tuning.md, "Re-run"), more than most
knobs do, so a winner picked from single searches is partly picked by noise. :func:`confirm` then
re-measures the best few side by side, in turns, and the winner is the one with the best median."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypedDict, cast

from tritonbundle.measure.search import CLIENT_BOUND, MAX_RATE, TIME_BUDGET
from tritonbundle.tune.space import Config, Space, config_from_json, describe, inert, key


class PointDetail(TypedDict, total=False):
    """What a point's measurement observed, written into ``tune.json`` as is (a dict on disk, its keys
    checked here): every key is optional, since a point that failed to build has only its status."""

    #: "ok", or why the point has no rate ("build failed: ...", "failed: ...", "no rate met the SLO ...").
    status: str
    #: The server's start-up, s; the engine's launch timings ("<batch>x<padded length>" -> ms, None for
    #: runtimes that report none); what those say one replica serves (:mod:`.capacity`), req/s.
    startup_s: float
    launch_ms_by_shape: dict[str, float] | None
    capacity_estimate_rps: float
    #: The rate search as written (:meth:`tritonbundle.measure.search.Sweep.to_json`) and why it ended.
    sweep: dict[str, Any]
    stopped: str
    #: At the best level: latency, CPU by process and the server's share, the GPU's busy share,
    #: Triton's metric views.
    p50_ms: float
    p99_ms: float
    cpu_cores_by_process: dict[str, float]
    server_cores: float
    gpu_util_mean: float | None
    triton: Any
    #: The point's wall time, the run it belongs to (``--resume``), the host's speed after it (ms).
    seconds: float
    run: str | None
    host_python_ms: float
    #: Every measurement of the configuration, first first (a finalist measured again).
    rates: list[float]


@dataclass
class Point:
    """One configuration and what it did: its rate at the SLO (None: failed to load or to pass), and
    ``detail``, what its measurement observed."""

    label: str
    config: Config
    rate: float | None
    detail: PointDetail = field(default_factory=lambda: PointDetail())

    @property
    def score(self) -> float:
        return self.rate or 0.0

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "config": self.config, "rate": self.rate, "detail": self.detail}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Point:
        return cls(data["label"], config_from_json(data["config"]), data.get("rate"),
                   cast(PointDetail, dict(data.get("detail") or {})))


class Cut(NamedTuple):
    """Where the time budget cut a descent; the verdict names it, so that "done" does not read as
    "searched" (on an H100 host slower per request, 450 s reached the instances alone: docs/tuning.md)."""

    round: int  # 1 the first
    #: The knob whose steps it was taking (None: before a knob's first step, or in the tie-break).
    stepping: str | None
    tie_break: bool
    #: The knobs no round took a step of (a knob with one value has none to take).
    untried: tuple[str, ...]


@dataclass
class Result:
    points: list[Point]
    best: Point | None
    #: Accepted moves: (knob, from, to, rate before, rate after).
    moves: list[tuple[str, Any, Any, float, float]]
    stopped: str
    #: After :func:`confirm`: each finalist (by :func:`.space.key`) and its rates, first measurement first.
    finals: dict[Any, tuple[Point, list[float]]] = field(default_factory=dict)
    #: Where the time budget cut the descent (None: it was not cut).
    cut_in: Cut | None = None


#: A round that moved nothing re-measures the current point and its closest neighbours (at most
#: :data:`TIES`) whose single measurement came within the noise band below it (:func:`noise_band`):
#: the current point is the best of noisy measurements, so it reads high (on the H200 one configuration
#: measured 10-29 % apart, and six against eight folded instances 10,262 against 10,201 req/s:
#: docs/tuning.md). The band is at least TIE_BAND, at most NOISE_CAP.
TIE_BAND = 0.15
NOISE_CAP = 0.35
TIES = 2
_ANY = object()
#: A move needs this gain in rate (relative) to count, so noise does not walk the search around.
MIN_GAIN = 0.03
#: A step that reads within :data:`MIN_GAIN` of the current point's rate on at most this share of its server
#: CPU per answered request moves too: the same rate from fewer cores leaves room for the knobs after it.
#: On the H200, from the bad start, folding the tokenizer in read 14,501 req/s on 4.40 server cores against
#: 14,486 on 7.23 and was not taken; the folded hand-picked settings then led the tune's winner in three
#: bench rounds of three, median 13,558 against 12,781 req/s (docs/tuning.md, "buckets offered").
CHEAPER = 0.8


def noise_band(measured: Mapping[Any, list[Point]]) -> float:
    """How far under the current point a reading says nothing: the widest relative spread (1 - lowest /
    highest) of any configuration measured more than once, within [:data:`TIE_BAND`, :data:`NOISE_CAP`]."""
    spreads = [1 - min(r) / max(r) for r in ([p.score for p in got] for got in measured.values())
               if len(r) > 1 and max(r) > 0]
    return min(NOISE_CAP, max([TIE_BAND, *spreads]))


def cut_short(point: Point) -> bool:
    """The time budget ended ``point``'s rate search before it finished (before or while it narrowed the
    knee down): its rate is a floor, and ``tune --resume`` measures it again."""
    return point.detail.get("stopped") == TIME_BUDGET


#: Why a point's rate is only a floor of its knee, by how its rate search ended (no level above it missed).
FLOOR_STOPS = {TIME_BUDGET: "the budget cut its rate search",
               CLIENT_BOUND: "the load generators fell behind above it",
               MAX_RATE: "its rate search reached --max-rate"}


def floor_reason(point: Point) -> str:
    """Why ``point``'s rate is a floor, not the knee ('' when its search bracketed the knee)."""
    return FLOOR_STOPS.get(str(point.detail.get("stopped")), "")


def cpu_per_request(point: Point) -> float | None:
    """Server CPU seconds per answered request at ``point``'s best passing level (None: not measured)."""
    cores = point.detail.get("server_cores")
    return cores / point.rate if cores and point.rate else None


def cheaper(candidate: Point, current: Point) -> bool:
    """``candidate`` serves a request on at most :data:`CHEAPER` of ``current``'s server CPU (each point's
    own measurement: a 20 % margin is wider than the host's drift between calls on the H200)."""
    mine, theirs = cpu_per_request(candidate), cpu_per_request(current)
    return mine is not None and theirs is not None and mine <= theirs * CHEAPER


def run_of(point: Point) -> Any:
    """The tune run that measured ``point`` (None for reports written before runs were named)."""
    return point.detail.get("run")


def coordinate_descent(
    measure: Callable[[str, Config], Point], start: Config, space: Space, *, can_continue: Callable[[], bool],
    min_gain: float = MIN_GAIN, rounds: int = 3, again: Callable[[str, Config, int], Point] | None = None,
) -> Result:
    """``measure(label, config)`` returns the point; a move needs ``min_gain`` (relative) to count, so
    noise does not walk the search around; a step within ``min_gain`` of the current rate moves when it
    is :func:`cheaper` in server CPU per request. ``again(label, config, n)``: the configuration's
    measurement number ``n`` (0 the first). With it:

    - a step that reads within the noise band under the current point says nothing, so the next value
      past it that way is measured too, once (on the H200 two tokenizer threads read 9 % under one, in
      a run that missed 10,159 req/s by 0.17 ms of p99, where four read +40 % in the bench: docs/tuning.md);
    - a candidate measured in another run than the current point (``tune --resume`` on another
      machine) is compared with the current point measured again in the candidate's run;
    - a round that moved nothing is tie-broken (:data:`TIE_BAND`): the current point and its closest
      neighbours are measured again in turns, and the best median moves if it beats the current
      point's by ``min_gain``.

    ``Result.best`` is where the descent ended: the point that won every comparison it took part in."""
    points: list[Point] = []
    seen: dict[Any, Point] = {}
    measured: dict[Any, list[Point]] = {}  # every measurement of a configuration, the first first
    broken: set[Any] = set()  # neighbours a tie-break measured again (once is enough)

    def visit(label: str, config: Config) -> Point:
        k = key(config)
        if k not in seen:
            seen[k] = measure(label, dict(config))
            points.append(seen[k])
            measured[k] = [seen[k]]
        return seen[k]

    def measure_again(label: str, point: Point) -> None:
        assert again is not None
        got = measured.setdefault(key(point.config), [point])
        got.append(again(label, dict(point.config), len(got)))
        points.append(got[-1])

    def score(point: Point, run: Any = _ANY) -> float:
        """The median of ``point``'s measurements (those of ``run`` when it has any)."""
        got = measured.get(key(point.config)) or [point]
        return statistics.median([p.score for p in got if run is _ANY or run_of(p) == run] or [p.score for p in got])

    def compare(candidate: Point) -> tuple[float, float]:
        """The candidate's score and the current point's, from one run's measurements when they can be."""
        run = run_of(candidate)
        runs = {run_of(p) for p in measured[key(current.config)]}
        if again is not None and run not in runs and candidate.score and can_continue():
            measure_again(f"anchor: {current.label}", current)
            runs.add(run_of(points[-1]))
        common = run if run in runs else _ANY
        return score(candidate, common), score(current, common)

    stepped: set[str] = set()  # the knobs any round took a step of

    def cut(round_: int, stepping: str | None = None, tie_break: bool = False) -> Result:
        untried = tuple(k.name for k in space.knobs
                        if k.name not in stepped and len(k.values) > 1 and not inert(k.name, current.config))
        return Result(points, _end(current, points), moves, TIME_BUDGET,
                      cut_in=Cut(round_ + 1, stepping, tie_break, untried))

    current = visit("start", start)
    moves: list[tuple[str, Any, Any, float, float]] = []
    stopped = "converged"
    for round_ in range(rounds):
        improved = False
        tried: list[tuple[str, Any, Point]] = []
        for knob in space.knobs:
            if inert(knob.name, current.config):
                continue
            origin = current.config.get(knob.name)
            for value in knob.neighbours(origin):
                # A move that paid is followed the same way at doubling strides while it keeps paying;
                # the other way is then not tried this round. A stride that overshot is bisected back.
                steps, looked, overshot = [value, *knob.onward(origin, value)], False, None
                while steps:
                    step = steps.pop(0)
                    config = space.moved(current.config, knob.name, step)
                    if key(config) not in seen and not can_continue():  # a step measured before costs nothing
                        return cut(round_, knob.name if any(t[0] == knob.name for t in tried) else None)
                    label = f"round {round_ + 1}: {describe(_changed(current.config, config))}"
                    candidate = visit(label, config)
                    tried.append((knob.name, step, candidate))
                    stepped.add(knob.name)
                    mine, theirs = compare(candidate)
                    # As fast: within the margin seen from the candidate's side, so that a move back from a
                    # point that paid just over the margin is never also "as fast" (no back and forth).
                    as_fast = mine * (1 + min_gain) >= theirs and cheaper(candidate, current)
                    if mine <= theirs * (1 + min_gain) and not as_fast:
                        further = knob.past(origin, step)
                        if (again is not None and step == value and not looked and further is not None
                                and mine >= theirs * (1 - noise_band(measured))):
                            steps, looked = [further, *knob.onward(step, further)], True
                            continue
                        overshot = step if step != value else None
                        middle = knob.between(current.config.get(knob.name), overshot)
                        if middle is not None and key(space.moved(current.config, knob.name, middle)) not in seen:
                            steps = [middle]
                            continue
                        break
                    moves.append((knob.name, current.config.get(knob.name), step, theirs, mine))
                    current = candidate
                    improved = True
                    middle = knob.between(step, overshot) if overshot is not None else None
                    if middle is not None:
                        steps = [middle]
                if current.config.get(knob.name) != origin:
                    break
        band = noise_band(measured)
        close = sorted((t for t in tried if key(t[2].config) not in broken and t[2].rate
                        and score(t[2]) * (1 + band) >= score(current)), key=lambda t: -score(t[2]))[:TIES]
        if not improved and again is not None and close:
            for point in [current, *(c for _, _, c in close)]:
                if not can_continue():
                    return cut(round_, tie_break=True)
                measure_again(f"tie-break {round_ + 1}: {point.label}", point)
            broken.update(key(p.config) for p in [current, *(c for _, _, c in close)])
            run = run_of(measured[key(current.config)][-1])
            name, step, best = max(close, key=lambda t: score(t[2], run))
            if score(best, run) > score(current, run) * (1 + min_gain):
                moves.append((name, current.config.get(name), step, score(current, run), score(best, run)))
                current, improved = best, True
        if not improved:
            break
    else:
        stopped = f"{rounds} rounds"
    return Result(points, _end(current, points), moves, stopped)


def confirm(measure: Callable[[str, Config], Point], result: Result, candidates: list[Point], *, rounds: int,
            can_continue: Callable[[], bool], versus: Point | None = None, weighed: bool = True,
            readings: Callable[[Point], list[float]] | None = None) -> None:
    """Measure two finalists ``rounds`` more times each, in turns (A, B, A, B: a slow spell of the
    machine hits both), while ``can_continue()``: ``result.best`` (the descent's pick; else the best
    of ``candidates``) and ``versus`` (the manifest's defaults, or the ``--versus`` settings, whose
    comparison the report states), or the runner-up when the best is ``versus`` or there is none.
    Then ``result.best`` is the finalist with the higher median rate (a failed measurement counts 0),
    as a copy whose rate is that median and whose ``detail["rates"]`` lists every measurement
    (:func:`confirmed`). Keeping the re-measured points is ``measure``'s
    business, as in the descent.

    Settings the descent never weighed (``weighed`` False: ``tune --versus``, measured beside the search,
    not a step of it) left with one reading (the budget ended first) win when they read higher, with no
    side-by-side claim; with no finalist measured again the descent's pick stands otherwise.

    ``readings(p)``: the measurements a finalist's median starts from (by default all of them,
    ``detail["rates"]``); ``tune --resume`` passes this run's only, so that no reading from another
    run (another machine, another day) joins a side-by-side comparison. A finalist left with none (the
    budget ended before it was measured here) compares with nothing: the descent's pick stands."""
    picked = key(result.best.config) if result.best is not None else None  # the descent's pick leads
    ranked = sorted((p for p in candidates if p.rate), key=lambda p: (key(p.config) == picked, p.score), reverse=True)
    if versus is not None and ranked and versus.rate and key(versus.config) != key(ranked[0].config):
        ranked = [ranked[0], versus]
    ranked = ranked[:2]
    if len(ranked) < 2:
        return
    start = readings or (lambda p: list(p.detail.get("rates") or [p.score]))
    finals = {key(p.config): (p, start(p)) for p in ranked}
    for round_ in range(rounds):
        taken: list[tuple[Point, Point]] = []
        for point in ranked:
            if not can_continue():
                break
            taken.append((point, measure(f"again {round_ + 1}: {point.label}", dict(point.config))))
        if any(cut_short(again) for _, again in taken):
            continue  # a search the budget cut is a floor: the round is left out for both, side by side
        for point, again in taken:
            finals[key(point.config)][1].append(again.score)
    if not all(rates for _, rates in finals.values()):
        return
    medians = [statistics.median(finals[key(p.config)][1]) for p in ranked]
    if not max(medians):  # re-measured, neither met the SLO at most readings: no winner is confirmed
        result.finals, result.best = finals, None
        return
    one_reading = rounds < 1 or any(len(rates) == 1 for _, rates in finals.values())
    if one_reading and not weighed and ranked[1] is versus and medians[1] > medians[0]:
        result.best = _with_rates(*finals[key(versus.config)])
        return
    if rounds < 1 or all(len(rates) == 1 for _, rates in finals.values()):
        return  # no time for any: the single best stands
    result.finals = finals
    result.best = confirmed(result, ranked[medians.index(max(medians))])


def by_configuration(points: list[Point]) -> list[Point]:
    """One point per configuration, in the order they were first measured; one measured more than once
    (a finalist, or one an earlier run's finalists re-measured, taken over by ``tune --resume``) as its
    first point with the median of every measurement (a failed one counts 0) and ``detail["rates"]``."""
    groups: dict[Any, list[Point]] = {}
    for point in points:
        groups.setdefault(key(point.config), []).append(point)
    return [_with_rates(first, [first.score] + [p.score for p in again]) if again else first
            for first, *again in groups.values()]


def _with_rates(first: Point, rates: list[float]) -> Point:
    """``first`` with the median of ``rates`` as its rate and ``detail["rates"]`` listing them."""
    detail = first.detail.copy()
    detail["rates"] = rates
    return Point(first.label, first.config, statistics.median(rates) or None, detail)


def confirmed(result: Result, point: Point | None) -> Point | None:
    """``point`` with its median rate when :func:`confirm` re-measured it (for comparisons on the same
    footing as the winner's), else ``point``."""
    if point is None or key(point.config) not in result.finals:
        return point
    return _with_rates(*result.finals[key(point.config)])


def _changed(before: Config, after: Config) -> Config:
    """What a move set: the knob, and the knobs it carries along (:meth:`.space.Space.moved`)."""
    return {k: v for k, v in after.items() if before.get(k) != v}


def _end(current: Point, points: list[Point]) -> Point | None:
    """Where the descent ended, or None when no point met the SLO."""
    return current if current.rate else _best(points)


def _best(points: list[Point]) -> Point | None:
    passing = [p for p in points if p.rate]
    return max(passing, key=lambda p: p.score) if passing else None


def _sustained(point: Point) -> str:
    """``point``'s rate at the SLO in words: a floor when its only rate search stopped below the knee."""
    why = floor_reason(point) if len(point.detail.get("rates") or [point.score]) == 1 else ""
    return f"{point.score:,.1f} req/s" + (f" or more ({why})" if why else "")


def _against(best: Point, other: Point | None, theirs: str, same: str, footing: str) -> list[str]:
    """How the winner did against ``other`` (the manifest's defaults, or the ``--versus`` settings): ``same``
    when it is them (the same point, or its re-measured copy), else their rate and the winner's gain."""
    if other is None:
        return []
    if other.config == best.config:
        return [same]
    if not other.score:
        return [f"{theirs} met the SLO at no rate tried"]
    gain = (best.score / other.score - 1) * 100
    return [f"{theirs} sustain {_sustained(other)}: the winner is {'+' if gain >= 0 else ''}{gain:.0f}% {footing}"]


def reason(result: Result, baseline: Point | None, reference: Point | None = None) -> str:
    """Why the winner won, in plain words, from the moves the search made; against ``reference`` too
    (``tune --versus``) when there is one."""
    best = result.best
    if best is None and result.finals:  # confirm() found no finalist that held its rate
        return "no winner: re-measured side by side, no finalist met the SLO in most of its readings: " + "; ".join(
            f"{describe(p.config)}: [{', '.join(f'{r:,.1f}' for r in rates)}]" for p, rates in result.finals.values())
    if best is None:
        return "no configuration met the SLO at any rate tried"
    lines = [f"the winner ({describe(best.config)}) sustains {_sustained(best)} within the SLO"]
    lines += _against(best, reference, "the reference settings (--versus)", "it is the reference settings (--versus)",
                      "on them")
    lines += _against(best, baseline, "the manifest's settings", "it is the manifest's own setting",
                      "on the same measurement")
    for knob, old, new, before, after in result.moves:
        lines.append(f"{knob} {old} -> {new}: {before:,.1f} -> {after:,.1f} req/s"
                     + (" (as fast, on less server CPU per request)" if after <= before * (1 + MIN_GAIN) else ""))
    if result.finals:
        lines.append("re-measured side by side, in turns, the winner by median: " + "; ".join(
            f"{describe(p.config)}: median {statistics.median(rates):,.1f} of "
            f"[{', '.join(f'{r:,.1f}' for r in rates)}]" for p, rates in result.finals.values()))
    tried = [p for p in result.points if p.label != "start"]
    if not result.moves:
        if tried:
            lines.append(f"none of the {len(tried)} other configuration(s) measured beat it by more than the noise "
                         f"margin ({MIN_GAIN:.0%}) or matched it on less server CPU")
        else:
            lines.append(f"the search stopped ({result.stopped}) before it measured any candidate past its start; "
                         "give it a larger --budget-s")
            return "; ".join(lines)
    if result.cut_in is not None:
        where = result.cut_in
        lines.append(f"the time budget ended the search in round {where.round}"
                     + (f" while it stepped {where.stepping}" if where.stepping else "")
                     + (" in its tie-break" if where.tie_break else "")
                     + (f"; no round stepped {', '.join(where.untried)}" if where.untried else "")
                     + f": give it a larger --budget-s{_time_per_point(result.points, len(where.untried))}, "
                     "or go on from this run with --resume tune.json")
    return "; ".join(lines)


def _time_per_point(points: Sequence[Point], untried: int) -> str:
    """How long the run's points took, and what one point for each of ``untried`` knobs would add: the
    budget a user asks for next ("" when no point recorded its time)."""
    seconds = [p.detail["seconds"] for p in points if p.detail.get("seconds")]
    if not seconds:
        return ""
    each = statistics.mean(seconds)
    more = f": ~{untried * each:,.0f} s more for one point per knob left" if untried else ""
    return f" (its points took ~{each:,.0f} s each{more})"
