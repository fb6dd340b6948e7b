"""The plan report (``tritonbundle plan``): a table, the plan as JSON, and a PNG histogram of the
traffic's lengths with the bucket edges drawn on it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tritonbundle.manifest import ModelSpec
from tritonbundle.plan import ModelPlan


@dataclass(frozen=True)
class ReportFiles:
    table: str
    json: Path
    png: Path | None


def table(plan: ModelPlan) -> str:
    lines = [f"model {plan.model}: runtime {plan.runtime} ({plan.target}), padding policy '{plan.policy}', "
             f"max batch {plan.max_batch_size}, {len(plan.profiles)} optimization profile(s)"]
    if plan.traffic:
        t = plan.traffic
        line = f"traffic: {int(t['requests'])} requests, {int(t['rows'])} rows"
        if "mean_tokens" in t:
            line += (f", mean {t['mean_tokens']:.1f} tokens, P50 {t['p50_tokens']:.0f}, P95 {t['p95_tokens']:.0f}, "
                     f"P99 {t['p99_tokens']:.0f}, max {t['max_tokens']:.0f}")
        line += "".join(f", {axis} mean {t[f'mean_{axis}']:.1f} max {t[f'max_{axis}']:.0f}" for axis in plan.axis_buckets
                        if f"mean_{axis}" in t)
        lines.append(line)
    if plan.sequence_buckets:
        lines.append("")
        lines.append(f"{'bucket':<8}{'min':>6}{'opt':>6}{'max':>6}{'share':>9}   padding target")
        for i, b in enumerate(plan.sequence_buckets):
            target = str(b.max) if plan.policy == "targets" else "batch's longest (ragged)"
            lines.append(f"{i:<8}{b.min:>6}{b.opt:>6}{b.max:>6}{b.share:>8.1%}   {target}")
    for axis, buckets in plan.axis_buckets.items():
        lines.append("")
        lines.append(f"{axis + ' bucket':<16}{'min':>6}{'opt':>6}{'max':>6}")
        lines += [f"{i:<16}{b.min:>6}{b.opt:>6}{b.max:>6}" for i, b in enumerate(buckets)]
    axes = [*(["sequence"] if plan.sequence_buckets else []), *plan.axis_buckets]
    lines.append("")
    lines.append(f"{'profile':<9}{'batch (min/opt/max)':<22}" + "".join(f"{a + ' (min/opt/max)':<24}" for a in axes))
    for p in plan.profiles:
        cells = [f"{x.min}/{x.opt}/{x.max}" if (x := p.axes.get(a)) else "-" for a in axes]
        lines.append(f"{p.index:<9}{f'{p.batch.min}/{p.batch.opt}/{p.batch.max}':<22}" + "".join(f"{c:<24}" for c in cells))
    if plan.waste is not None:
        w = plan.waste
        lines.append("")
        lines.append("computed tokens per useful token (1.00 = no padding):")
        lines.append(f"  {'bucketed (this plan)':<44}{w.bucketed:>6.2f}")
        lines.append(f"  {'pad every request to ' + str(plan.max_sequence_length):<44}{w.pad_to_max:>6.2f}")
        for batch, value in sorted(w.single_profile.items()):
            label = f"one dynamic profile, batch {batch}, pad to longest"
            lines.append(f"  {label:<44}{value:>6.2f}")
    return "\n".join(lines)


def histogram_png(spec: ModelSpec, plan: ModelPlan, lengths: list[int], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=110)
    ax.hist(lengths, bins=min(128, max(10, plan.max_sequence_length // 4)), color="#4C72B0", alpha=0.85)
    for i, b in enumerate(plan.sequence_buckets):
        ax.axvline(b.max, color="#C44E52", linestyle="-", linewidth=1.5, label="bucket edge" if i == 0 else None)
        ax.axvline(b.opt, color="#55A868", linestyle="--", linewidth=1, label=f"opt (P{spec.opt_percentile:g})" if i == 0 else None)
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("rows")
    title = f"{plan.model}: {len(plan.sequence_buckets)} buckets, edges {[b.max for b in plan.sequence_buckets]}"
    if plan.waste:
        title += f"\ncomputed/useful tokens: {plan.waste.bucketed:.2f} bucketed vs {plan.waste.pad_to_max:.2f} pad-to-max"
    ax.set_title(title, fontsize=10)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def write_report(spec: ModelSpec, plan: ModelPlan, options: object, out_dir: Path) -> ReportFiles:
    from tritonbundle.build.stage import traffic_for

    out_dir.mkdir(parents=True, exist_ok=True)
    text = table(plan)
    (out_dir / "plan.txt").write_text(text + "\n")
    json_path = out_dir / "plan.json"
    json_path.write_text(json.dumps(plan.to_json(), indent=2))
    png = None
    sample = traffic_for(spec, options)  # type: ignore[arg-type]
    if sample is not None and plan.sequence_buckets:
        lengths = sample.clipped(spec.max_sequence_length).row_lengths().tolist()
        png = histogram_png(spec, plan, lengths, out_dir / "histogram.png")
    return ReportFiles(text, json_path, png)
