"""The quality benchmark's figures (benchmarks/quality.py writes them beside its table): the
sampled negatives' cosine and edit distance, each row's paired difference to SimCSE with its 95%
interval, the STS average against the negatives' hardness, and the dev curves. Matplotlib is
imported inside each function (Agg): the table's arithmetic needs none of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from quality_rows import NEGATIVE_ROWS, ROWS


def plot_negatives(pairs: dict[str, Path], path: Path) -> dict[str, dict[str, float]]:
    """Histograms of the sampled negatives' cosine to the anchor and word edit distance, one
    line per sampler; returns their means and the share of random fills."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pyarrow.compute as pc
    from pairforge.pipeline.plumbing import schemas as S
    from pairforge.pipeline.plumbing.shards import open_dataset

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    stats = {}
    for name in pairs:
        table = open_dataset(pairs[name], S.PAIRS).read_table(["negative_cos", "negative_edit"])
        cos = pc.list_flatten(table["negative_cos"]).to_numpy(zero_copy_only=False)
        edit = pc.list_flatten(table["negative_edit"]).to_numpy(zero_copy_only=False)
        stats[name] = {"negatives": int(cos.size), "cos_mean": float(cos.mean()),
                       "edit_mean": float(edit.mean())}  # fmt: skip
        for ax, values, lo, hi in ((axes[0], cos, -0.1, 1.0), (axes[1], edit, 0.0, 1.0)):
            ax.hist(values, bins=np.linspace(lo, hi, 45), histtype="step", density=True,
                    linewidth=1.5, label=f"{name} (mean {values.mean():.3f})")  # fmt: skip
    axes[0].set(xlabel="cosine to the anchor (MiniLM, mean pooling)", ylabel="density",
                title="Sampled negatives: cosine")  # fmt: skip
    axes[1].set(xlabel="word-level normalised Levenshtein distance to the anchor",
                ylabel="density", title="Sampled negatives: edit distance")  # fmt: skip
    for ax in axes:
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return stats


def plot_curves(records: list[dict[str, Any]], path: Path) -> dict[tuple[str, str], list]:
    """The dev curves: per (row, start), the mean over seeds of the dev score at each dev step
    (a band from the lowest to the highest seed), one panel per start; returns the mean curves.
    Records without a ``dev_curve`` (sittings before it was kept) are left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple[str, str], dict[int, list[float]]] = {}
    for r in records:
        for step, score in r.get("dev_curve", []):
            groups.setdefault((r["row"], r["start"]), {}).setdefault(step, []).append(score)
    if not groups:
        return {}
    panels = sorted({"cls" if start == "mask" else start for _, start in groups})
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False,
                             constrained_layout=True)  # fmt: skip
    order = {name: i for i, name in enumerate(ROWS)}
    curves = {}
    for (row, start), by_step in sorted(groups.items(), key=lambda kv: order.get(kv[0][0], 99)):
        steps = sorted(by_step)
        scores = [by_step[s] for s in steps]
        mean = [float(np.mean(v)) for v in scores]
        curves[(row, start)] = list(zip(steps, mean, strict=True))
        ax = axes[0][panels.index("cls" if start == "mask" else start)]
        (line,) = ax.plot(steps, mean, linewidth=1.4, label=f"{row} ({len(scores[-1])} seeds)")
        ax.fill_between(steps, [min(v) for v in scores], [max(v) for v in scores],
                        color=line.get_color(), alpha=0.12)  # fmt: skip
    for ax, start in zip(axes[0], panels, strict=True):
        ax.set(xlabel="training step", ylabel="dev Spearman x 100 (STS-B dev, SICK-R trial)",
               title=f"Dev curves, {start} start (mean over seeds, band: min-max)")  # fmt: skip
        ax.legend(fontsize=7, ncol=2)
        ax.grid(alpha=0.3)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return curves


def plot_differences(
    summary: list[dict[str, Any]], path: Path, baseline: str = "simcse"
) -> list[tuple[str, str, float, tuple[float, float] | None, list[float]]]:
    """The table's result as a figure: each row's paired difference of the STS average to
    ``baseline`` (the settled reading), its mean, 95% interval (t over
    seeds; none for one seed) and every seed's difference, one panel per start (DenoSent's prompt
    beside [CLS]), rows in ``ROWS`` order. Returns ``(row, start, mean, interval, per seed)``;
    nothing is drawn when no row has a paired seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = [
        (s["row"], s["start"], s["diff_settled"]["mean"], s["diff_settled"]["ci95"],
         list(s["diff_settled"]["per_seed"]))
        for s in summary
        if s["row"] != baseline and s["diff_settled"]["per_seed"]
    ]  # fmt: skip
    if not entries:
        return []
    panel_of = {e[1]: "cls" if e[1] == "mask" else e[1] for e in entries}
    panels = sorted(set(panel_of.values()))
    most = max(sum(panel_of[e[1]] == p for e in entries) for p in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(7.5 * len(panels), 1.2 + 0.42 * most),
                             squeeze=False, constrained_layout=True)  # fmt: skip
    for ax, panel in zip(axes[0], panels, strict=True):
        mine = [e for e in entries if panel_of[e[1]] == panel]
        ys = [most - 1 - i for i in range(len(mine))]  # the first row on top, panels aligned
        for y, (row, _, mean, ci, per_seed) in zip(ys, mine, strict=True):
            colour = "C3" if row.startswith("peer") else "C0"
            ax.scatter(per_seed, [y] * len(per_seed), s=12, color=colour, alpha=0.35)
            if ci is not None:
                ax.plot(ci, [y, y], color=colour, linewidth=2)
            ax.plot([mean], [y], "o", color=colour, markersize=6)
        labels = [
            f"{row}{' (prompt)' if start == 'mask' else ''}, {len(ps)} seed"
            f"{'s' if len(ps) > 1 else ''}"
            for row, start, _, _, ps in mine
        ]
        ax.set_yticks(ys, labels, fontsize=8)
        ax.set_ylim(-0.6, most - 0.4)
        ax.axvline(0.0, color="grey", linestyle="--", linewidth=1)
        ax.set(xlabel=f"STS average minus {baseline}'s, same seed (x100)",
               title=f"Paired difference to {baseline}, {panel} start: mean, 95% interval, "
               "seeds")  # fmt: skip
        ax.grid(axis="x", alpha=0.3)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return entries


def plot_hardness(
    summary: list[dict[str, Any]], stats: dict[str, dict[str, float]], path: Path
) -> list[tuple[str, float, float, float | None]]:
    """The negatives-only rows' STS average (mean ± sd over seeds, [CLS] start) against the mean
    cosine of their sampled negatives to the anchor, SimCSE as a line; returns the points
    ``(row, mean cos, avg, sd)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_row = {s["row"]: s for s in summary if s["start"] == "cls"}
    points = [
        (name, stats[ROWS[name].pairs]["cos_mean"], *by_row[name]["avg"])
        for name in NEGATIVE_ROWS
        if name in by_row and ROWS[name].pairs in stats
    ]
    fig, ax = plt.subplots(figsize=(7, 4.5), constrained_layout=True)
    for name, cos, avg, sd in points:
        ax.errorbar(cos, avg, yerr=sd or 0.0, fmt="o", capsize=3,
                    color="C3" if name == "peer" else "C0")  # fmt: skip
        n = len(by_row[name]["seeds"])
        ax.annotate(f"{name} ({n} seed{'s' if n > 1 else ''})", (cos, avg), fontsize=7,
                    xytext=(4, 4), textcoords="offset points")  # fmt: skip
    if "simcse" in by_row:
        ax.axhline(by_row["simcse"]["avg"][0], color="grey", linestyle="--", linewidth=1)
        ax.annotate("SimCSE (no mined negatives)", (ax.get_xlim()[0], by_row["simcse"]["avg"][0]),
                    fontsize=7, xytext=(4, 4), textcoords="offset points")  # fmt: skip
    ax.set(xlabel="mean cosine of the sampled negatives to the anchor (MiniLM, mean pooling)",
           ylabel="7-task STS average (x100), [CLS] start",
           title="STS average against the negatives' hardness (mean ± sd over seeds)")  # fmt: skip
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return points
