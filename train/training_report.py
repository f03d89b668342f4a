"""Training curves and evaluation tables: DVC plot data (CSV), PNG figures and markdown.

Files are written atomically (temporary name, then rename). Figures use matplotlib's Agg backend.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pairforge.pipeline.plumbing.files import atomic_write_bytes
from pairforge.pipeline.science.sts import LABELS, TEST_TASKS


def write_csv(path: Path, rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(
        buffer, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n"
    )
    writer.writeheader()
    for row in rows:
        writer.writerow({c: _fmt(row.get(c)) for c in columns})
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, buffer.getvalue().encode())


def _fmt(value: Any) -> Any:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "" if value is None else value


def _save_figure(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}.png")
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    os.replace(tmp, path)


def training_figure(name: str, history: list[dict], dev: list[dict], dev_tasks: Sequence[str]):
    """The training figure (a matplotlib Figure): loss with the mean dev score on a second axis,
    the dev score per task, the learning rate and the throughput, every axis labelled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(2, 2, figsize=(11, 6.5), layout="constrained")
    (ax_loss, ax_dev), (ax_lr, ax_speed) = axes
    steps = [h["step"] for h in history]
    ax_loss.plot(steps, [h.get("loss") for h in history], lw=1.2, color="C0", label="training loss")
    ax_loss.set_ylabel("training loss", color="C0")
    ax_loss.set_title("loss and mean dev score", fontsize=10)
    dev_steps = [d["step"] for d in dev]
    if dev:
        twin = ax_loss.twinx()  # Spearman x100 and a loss share no scale
        twin.plot(
            dev_steps,
            [d["score"] for d in dev],
            color="black",
            lw=1.8,
            marker="o",
            ms=4,
            label="mean dev Spearman x100",
        )
        twin.set_ylabel("mean dev Spearman x100")
        handles = ax_loss.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
        ax_loss.legend(handles=handles, fontsize=8, loc="upper right")
        for task in dev_tasks:
            ax_dev.plot(
                dev_steps,
                [d.get(task) for d in dev],
                marker="o",
                ms=4,
                label=LABELS.get(task, task),
            )
        ax_dev.plot(dev_steps, [d["score"] for d in dev], color="black", lw=1.8, label="mean")
        kept = max(dev, key=lambda d: d["score"])["step"]  # the checkpoint the trainer exports
        for ax in (ax_dev, twin):
            ax.axvline(kept, color="grey", ls=":", lw=1.2)
        ax_dev.plot([], [], color="grey", ls=":", label=f"kept: step {kept}")
        ax_dev.legend(fontsize=8, loc="best")
    else:
        ax_dev.text(0.5, 0.5, "no dev evaluation (eval_every: 0)", ha="center", va="center")
    ax_dev.set_ylabel("dev Spearman x100")
    ax_dev.set_title("dev score per task", fontsize=10)
    ax_lr.plot(steps, [h.get("lr") for h in history], lw=1.2)
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_title("learning rate schedule", fontsize=10)
    ax_speed.plot(steps, [h.get("rows_per_s") for h in history], lw=1.2)
    ax_speed.set_ylabel("rows / second")
    ax_speed.set_title("throughput", fontsize=10)
    if dev:
        ax_dev.set_xlim(ax_loss.get_xlim())  # the dev points on the same steps as the loss
    for ax in axes.flat:
        ax.set_xlabel("optimiser step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    fig.suptitle(f"train: {name}", fontsize=12)
    return fig


def plot_training(
    path: Path, name: str, history: list[dict], dev: list[dict], dev_tasks: Sequence[str]
) -> None:
    """:func:`training_figure` as a PNG at ``path``."""
    import matplotlib.pyplot as plt

    fig = training_figure(name, history, dev, dev_tasks)
    _save_figure(fig, path)
    plt.close(fig)


def sts_table(results: dict[str, dict], tasks: Sequence[str] = TEST_TASKS) -> str:
    """Markdown: one row per model, Spearman x100 per task, the average, alignment, uniformity."""
    head = ["model", "pooling", *[LABELS.get(t, t) for t in tasks], "Avg.", "align", "uniform"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in results.items():
        cells = [name, r.get("pooling", "")]
        cells += [f"{r['tasks'][t]['spearman']:.2f}" if t in r["tasks"] else "" for t in tasks]
        cells.append(f"{r['avg']:.2f}" if "avg" in r else "")
        cells.append(f"{r['alignment']:.3f}" if "alignment" in r else "")
        cells.append(f"{r['uniformity']:.3f}" if "uniformity" in r else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_align_uniform(path: Path, results: dict[str, dict], caption: str | None = None) -> None:
    """Alignment against uniformity per model (lower-left is better), as SimCSE's Figure 2.

    ``caption`` names the pairs measured and whether they were a sample (the title says so).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4))
    for name, r in results.items():
        if "alignment" in r and "uniformity" in r:
            ax.scatter(r["uniformity"], r["alignment"], s=40)
            ax.annotate(
                f"{name} ({r.get('avg', float('nan')):.1f})",
                (r["uniformity"], r["alignment"]),
                fontsize=7,
                xytext=(4, 4),
                textcoords="offset points",
            )
    ax.set_xlabel("uniformity (lower is better)")
    ax.set_ylabel("alignment (lower is better)")
    ax.set_title(f"alignment vs uniformity\n{caption or 'STS-B test'}", fontsize=9)
    ax.grid(alpha=0.3)
    _save_figure(fig, path)
    plt.close(fig)
