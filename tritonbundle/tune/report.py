"""What a tune run leaves behind, in its report folder:

* ``tune.json``: every point measured (configuration, rate at the SLO, p50/p99 there, CPU and GPU
  use, every load level), the winner, the shipped defaults' point and the reason; rewritten after
  every point, so an interrupted run keeps what it measured
* ``tune.md``: the same as a table, with the reason in plain words
* ``tune.png``: p99 against offered load for every point, and the throughput/latency front
* ``winner.yaml``: the winning overrides, as manifest keys
* ``autoscaling-values.yaml``: Helm values scaling on requests/s per pod from the winner's rate
  (:mod:`tritonbundle.tune.capacity`)

and, beside the manifest, a copy of it with the winner written into the tuned model's entry.
"""

from __future__ import annotations

import contextlib
import math
import shutil
from pathlib import Path
from typing import Any

import yaml

from tritonbundle.errors import ConfigError
from tritonbundle.files import write_json
from tritonbundle.measure.search import Sweep
from tritonbundle.tune.capacity import autoscaling_values
from tritonbundle.tune.result import Move, PointSummary, TuneResult, Verdict
from tritonbundle.tune.search import Point, Result, cut_short, floor_reason, reason
from tritonbundle.tune.space import Config, Space, describe


def summary(found: Result, baseline: Point | None, searched: Space, reference: Point | None = None) -> Verdict:
    """The verdict of a search: the winner, the defaults' point, the moves and why (and the ``--versus``
    settings' point, when named)."""
    return Verdict(
        winner=PointSummary.of(found.best) if found.best and found.best.rate else None,
        baseline=PointSummary.of(baseline) if baseline else None, search_stopped=found.stopped,
        moves=[Move(k, a, b, r0, r1) for k, a, b, r0, r1 in found.moves], reason=reason(found, baseline, reference),
        reference=PointSummary.of(reference) if reference else None,
    )


def write(result: TuneResult, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_json(result.to_json(), out / "tune.json")
    (out / "tune.md").write_text(markdown(result))
    with contextlib.suppress(Exception):  # a plot is a convenience: never lose the numbers to it
        plot(result, out / "tune.png")
    winner = result.winner
    if winner:
        (out / "winner.yaml").write_text(yaml.safe_dump(_yaml_config(winner.config), sort_keys=False))
    if winner and winner.rate:
        # The chart's autoscaling target from what one replica served at the SLO (helm -f this file).
        (out / "autoscaling-values.yaml").write_text(
            "# From this tune run: autoscale on requests/s per pod, a share (headroom) of one pod's capacity at\n"
            "# the SLO. helm upgrade ... -f autoscaling-values.yaml (docs/tuning.md, \"Autoscaling\").\n"
            + yaml.safe_dump(autoscaling_values(result), sort_keys=False))


def _floor_label(point: Point) -> str:
    """After a point's status in the table: why its rate is only a floor, if it is."""
    if cut_short(point):
        return " (cut by the budget: a floor)"
    return f" (a floor: {why})" if (why := floor_reason(point)) else ""


def _yaml_config(config: Config) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()}


def _f(value: Any, spec: str = ",.1f") -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "-"


def markdown(result: TuneResult) -> str:
    lines = [f"# tune: {result.model}, p99 <= {result.slo_p99_ms} ms", ""]
    lines.append(f"Status: {result.status}; budget {_f(result.budget_s, '.0f')} s; command: `{result.command}`"
                 + (f"; GPU sharing (the instances'): {result.gpu_sharing}" if result.gpu_sharing else "")
                 + (f"; resumed from `{result.resumed_from}`" if result.resumed_from else "")
                 + (f"; load generators send: {result.load_sender}" if result.load_sender else ""))
    lines.append("")
    if result.verdict is not None and result.verdict.reason:
        lines += [f"**Why:** {result.verdict.reason}.", ""]
    for note in result.space.notes if result.space is not None else ():
        lines.append(f"- {note}")
    lines += ["", "| # | point | configuration | req/s at SLO | p50 ms | p99 ms | server CPU cores | GPU util % | start s | status |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    winner = result.winner.config if result.winner else None
    for i, p in enumerate(result.points):
        d = p.detail
        mark = " **(winner)**" if winner is not None and p.config == winner else ""
        gpu = d.get("gpu_util_mean")
        lines.append(
            f"| {i} | {p.label}{mark} | {describe(p.config)} | {_f(p.rate)} | {_f(d.get('p50_ms'))} "
            f"| {_f(d.get('p99_ms'))} | {_f(d.get('server_cores'), '.2f')} | {_f(gpu)} | {_f(d.get('startup_s'))} "
            f"| {d.get('status', '')}{_floor_label(p)} |")
    lines.append("")
    return "\n".join(lines)


def plot(result: TuneResult, path: Path) -> Path | None:
    """Left: p99 against offered load, one line per point. Right: each point's best level (rate at
    the SLO, p99 there) with the front of points no other beats on both."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [(p, Sweep.from_json(p.detail["sweep"])) for p in result.points if p.detail.get("sweep")]
    if not points:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5), dpi=100)
    best: list[tuple[float, float, str]] = []
    slo = float(result.slo_p99_ms or 0)
    finite = [_ms(s.p99_ms) for _, sweep in points for s in sweep.steps]
    # A level with no answered p99 (every request failed or timed out) is drawn at the top, not dropped.
    top = max([v for v in finite if v == v] + [slo]) * 2
    for i, (p, sweep) in enumerate(points):
        steps = sorted(sweep.steps, key=lambda s: s.offered_rps)
        ys = [_ms(s.p99_ms) for s in steps]
        ys = [y if y == y else top for y in ys]
        line = left.plot([s.offered_rps for s in steps], ys, linewidth=1, label=f"{i}: {p.label}")[0]
        passed = [s.passed for s in steps]
        left.scatter([s.offered_rps for s, ok in zip(steps, passed) if ok],
                     [y for y, ok in zip(ys, passed) if ok], color=line.get_color(), marker="o", s=14)
        left.scatter([s.offered_rps for s, ok in zip(steps, passed) if not ok],
                     [y for y, ok in zip(ys, passed) if not ok], color=line.get_color(), marker="x", s=30)
        if p.rate and p.detail.get("p99_ms") is not None:
            best.append((float(p.rate), float(p.detail["p99_ms"]), str(i)))
    left.scatter([], [], color="grey", marker="o", s=14, label="level passed")
    left.scatter([], [], color="grey", marker="x", s=30, label="level FAILED (SLO, failures or client-bound)")
    left.axhline(slo, color="grey", linestyle=":", label="SLO")
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("offered load (req/s)")
    left.set_ylabel("p99 latency (ms)")
    left.set_title("p99 against offered load, per configuration")
    left.legend(fontsize=6)
    if best:
        right.scatter([b[0] for b in best], [b[1] for b in best], color="#4C72B0")
        for rate, p99, label in best:
            right.annotate(label, (rate, p99), fontsize=7, xytext=(3, 3), textcoords="offset points")
        front = sorted((b for b in best if not any(o[0] >= b[0] and o[1] < b[1] or o[0] > b[0] and o[1] <= b[1]
                                                   for o in best)), key=lambda b: b[0])
        right.plot([b[0] for b in front], [b[1] for b in front], color="#C44E52", label="front")
        right.legend(fontsize=7)
    right.set_xlabel("rate at the SLO (req/s)")
    right.set_ylabel("p99 at that rate (ms)")
    right.set_title("throughput / latency of each configuration")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _ms(value: float) -> float:
    """A p99 to draw: NaN when nothing was answered or it is infinite (drawn at the top)."""
    return value if math.isfinite(value) else math.nan


def tuned_manifest(manifest: Path, model: str, config: Config, destination: Path) -> Path:
    """``manifest`` with ``config`` written into ``model``'s entry, saved as ``destination`` (its
    folder should be the manifest's: the paths inside stay relative to it). The file's own text and
    comments are kept: each tuned key's line in the entry is rewritten, or added under ``name:``
    (:func:`set_keys`). Writing over the manifest itself keeps the previous one as ``<manifest>.bak``."""
    text = manifest.read_text()
    values = _yaml_config(config)
    data = yaml.safe_load(text)
    if not any(m.get("name") == model for m in data.get("models", [])):
        raise ConfigError(f"{manifest}: no model named {model!r} to write the tuned settings into")
    edited = set_keys(text, model, values)
    if destination.resolve() == manifest.resolve():
        shutil.copyfile(manifest, manifest.with_name(manifest.name + ".bak"))
        destination.write_text(edited)
    else:
        destination.write_text(f"# {manifest.name} with the settings `tritonbundle tune` picked for {model}\n" + edited)
    return destination


def set_keys(text: str, model: str, values: dict[str, Any]) -> str:
    """The manifest ``text`` with ``values`` set in ``model``'s entry, line by line (comments stay). Falls
    back to a rewritten YAML (comments lost, said in a comment) when the entry is not laid out one key a
    line; the result always reads back with exactly these values."""
    import re

    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines)
                  if re.match(rf"^(\s*)-\s+name:\s*['\"]?{re.escape(model)}['\"]?\s*(#.*)?$", line)), None)
    if start is not None:
        indent = len(lines[start]) - len(lines[start].lstrip()) + 2  # the keys under "- "
        end = next((i for i in range(start + 1, len(lines))
                    if lines[i].strip() and not lines[i].lstrip().startswith("#")
                    and len(lines[i]) - len(lines[i].lstrip()) < indent), len(lines))
        for key_name, value in values.items():
            rendered = f"{' ' * indent}{key_name}: {yaml.safe_dump(value, default_flow_style=True).strip()}"
            rendered = rendered.removesuffix("\n...").rstrip()
            at = next((i for i in range(start + 1, end) if re.match(rf"^\s{{{indent}}}{re.escape(key_name)}:", lines[i])), None)
            if at is not None:
                comment = re.search(r"\s+#.*$", lines[at].rstrip("\n"))
                lines[at] = rendered + (comment.group(0) if comment else "") + "  # tuned\n"
            else:
                lines.insert(start + 1, rendered + "  # tuned\n")
                end += 1
        edited = "".join(lines)
        entry = next(m for m in yaml.safe_load(edited)["models"] if m.get("name") == model)
        if all(entry.get(k) == v for k, v in values.items()):
            return edited
    data = yaml.safe_load(text)
    next(m for m in data["models"] if m.get("name") == model).update(values)
    return "# (rewritten by tritonbundle tune: the entry's layout was not one key a line, so comments were lost)\n" \
        + yaml.safe_dump(data, sort_keys=False)
