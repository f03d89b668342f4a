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

from pairforge.pipeline.shards import atomic_write_bytes
from pairforge.train.sts import LABELS, TEST_TASKS


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


def plot_training(
    path: Path, name: str, history: list[dict], dev: list[dict], dev_tasks: Sequence[str]
) -> None:
    """Loss, learning rate and throughput per step, and the dev scores, in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4 if dev else 3, figsize=(16 if dev else 12, 3.2))
    steps = [h["step"] for h in history]
    series = [("loss", "training loss"), ("lr", "learning rate"), ("rows_per_s", "rows / s")]
    for ax, (key, title) in zip(axes, series, strict=False):
        ax.plot(steps, [h.get(key) for h in history], lw=1.2)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if dev:
        ax = axes[3]
        for task in dev_tasks:
            ax.plot(
                [d["step"] for d in dev],
                [d[task] for d in dev],
                marker="o",
                ms=3,
                label=LABELS.get(task, task),
            )
        ax.plot(
            [d["step"] for d in dev], [d["score"] for d in dev], color="black", lw=2, label="mean"
        )
        ax.set_title("dev Spearman x100")
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(f"train: {name}")
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
