"""DebCSE's pair diagnostics (Tables 1 and 4, Figures 1 and 4) as pure functions.

- ``lexical_overlap``: shared words / words of the longer sentence, per pair (Table 1's measure).
  Words are lower-cased runs of letters and digits, so punctuation and tokenisation differences
  (SNLI is PTB-tokenised, corpora usually are not) do not count; shared words are counted with
  multiplicity (a word twice in both sentences is shared twice).
- ``histograms``: the fraction of pairs per bin for every (source, side) series, on common bins,
  as rows for a DVC plots CSV.
- ``summary_rows`` / ``markdown_table``: the Table 1/4 style summary beside the paper's numbers.
- ``plot``: the histograms as a two-panel PNG (positives, negatives), one step outline per source.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

_WORDS = re.compile(r"[^\W_]+")

# DebCSE Tables 1 and 4: mean lexical overlap of (positive, negative) pairs.
PAPER_OVERLAP = {
    "nli": (0.38, 0.28),
    "simcse": (1.0, 0.09),
    "mined": (0.56, 0.21),
}
SOURCE_LABELS = {
    "nli": "supervised NLI (entailment / contradiction)",
    "simcse": "SimCSE-style (same sentence, dropout / random sentence)",
    "mined": "DebCSE-mined (this dataset: sampled positives / negatives)",
}


def words(text: str) -> list[str]:
    return _WORDS.findall(text.lower())


def lexical_overlap(a: list[str], b: list[str]) -> np.ndarray:
    """Shared words / words of the longer sentence for each pair ``(a[i], b[i])``, in [0, 1].

    A pair where both sentences have no word scores 0. Shape ``(n,)`` float64.
    """
    if len(a) != len(b):
        raise ValueError(f"a and b must be aligned, got {len(a)} and {len(b)}")
    out = np.zeros(len(a), dtype=np.float64)
    cache: dict[str, Counter] = {}

    def bag(text: str) -> Counter:
        found = cache.get(text)
        if found is None:
            found = cache[text] = Counter(words(text))
        return found

    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        bx, by = bag(x), bag(y)
        longer = max(sum(bx.values()), sum(by.values()))
        if longer:
            out[i] = sum((bx & by).values()) / longer
    return out


def histograms(
    series: dict[str, np.ndarray], bins: int, low: float, high: float
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Bin centres ``(bins,)`` and each series' fraction of values per bin (sums to 1)."""
    edges = np.linspace(low, high, bins + 1)
    centres = (edges[:-1] + edges[1:]) / 2
    out = {}
    for name, values in series.items():
        values = np.clip(np.asarray(values, dtype=np.float64), low, high)
        counts, _ = np.histogram(values, bins=edges)
        out[name] = counts / max(1, counts.sum())
    return centres, out


# Every series of the DVC plots CSVs, in a fixed order: dvc.yaml declares them as the plot's
# ``y``; a source not measured in a run (NLI without its data) is an empty column.
SERIES = (
    "mined_positive",
    "mined_negative",
    "simcse_positive",
    "simcse_negative",
    "nli_positive",
    "nli_negative",
)


def csv_text(centres: np.ndarray, fractions: dict[str, np.ndarray]) -> str:
    """A wide CSV: ``bin`` then one column per series of :data:`SERIES` (DVC plots reads it with
    ``x: bin`` and those columns as ``y``), empty where a series was not measured."""
    unknown = sorted(set(fractions) - set(SERIES))
    if unknown:
        raise ValueError(f"series {unknown} are not in SERIES {SERIES}")
    lines = [",".join(["bin", *SERIES])]
    for i, c in enumerate(centres):
        cells = [f"{fractions[n][i]:.6f}" if n in fractions else "" for n in SERIES]
        lines.append(",".join([f"{c:.4f}", *cells]))
    return "\n".join(lines) + "\n"


def _stats(values: np.ndarray) -> dict[str, Any]:
    values = np.asarray(values, dtype=np.float64)
    if not values.size:
        return {"n": 0, "mean": None, "median": None}
    return {
        "n": int(values.size),
        "mean": round(float(values.mean()), 4),
        "median": round(float(np.median(values)), 4),
    }


def summarise(pairs: dict[str, dict[str, dict[str, np.ndarray]]]) -> dict[str, Any]:
    """``pairs[source][side] = {"overlap": ..., "cos": ...}`` -> nested means and medians."""
    return {
        source: {
            side: {measure: _stats(v) for measure, v in measures.items()}
            for side, measures in sides.items()
        }
        for source, sides in pairs.items()
    }


def markdown_table(summary: dict[str, Any]) -> str:
    """The Table 1/4 style summary (means; medians in the metrics) with the paper's overlaps."""

    def cell(source: str, side: str, measure: str) -> str:
        value = summary.get(source, {}).get(side, {}).get(measure, {}).get("mean")
        return "-" if value is None else f"{value:.2f}"

    lines = [
        "| pairs | positive overlap | negative overlap | positive cos | negative cos | "
        "paper overlap (pos / neg) |",
        "|---|---|---|---|---|---|",
    ]
    for source in ("nli", "simcse", "mined"):
        if source not in summary:
            continue
        paper = PAPER_OVERLAP[source]
        lines.append(
            f"| {SOURCE_LABELS[source]} | {cell(source, 'positive', 'overlap')} | "
            f"{cell(source, 'negative', 'overlap')} | {cell(source, 'positive', 'cos')} | "
            f"{cell(source, 'negative', 'cos')} | {paper[0]:.2f} / {paper[1]:.2f} |"
        )
    return "\n".join(lines)


def plot(
    series: dict[str, np.ndarray],
    path: Path,
    xlabel: str,
    bins: int,
    low: float,
    high: float,
    title: str,
) -> None:
    """:func:`figure` as a PNG at ``path``."""
    fig = figure(series, xlabel, bins, low, high, title)
    import matplotlib.pyplot as plt  # after figure() chose the Agg backend

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def figure(
    series: dict[str, np.ndarray], xlabel: str, bins: int, low: float, high: float, title: str
):
    """Two panels (positive pairs, negative pairs), each source's histogram as a step outline
    over its bins (lightly filled), so overlapping sources stay visible; a matplotlib Figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    edges = np.linspace(low, high, bins + 1)
    _, fractions = histograms(series, bins, low, high)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True, layout="constrained")
    colours = {"mined": "C0", "simcse": "C1", "nli": "C2"}
    for ax, side in zip(axes, ("positive", "negative"), strict=True):
        for name, frac in fractions.items():
            source, s = name.rsplit("_", 1)
            if s != side:
                continue
            label = SOURCE_LABELS.get(source, source).split(" (")[0]
            n = int(np.asarray(series[name]).size)
            colour = colours.get(source)
            ax.stairs(frac, edges, fill=True, alpha=0.18, color=colour)
            ax.stairs(frac, edges, lw=1.6, color=colour, label=f"{label} ({n:,} pairs)")
        ax.set_title(f"{side} pairs", fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_xlim(low, high)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    axes[0].set_ylabel(f"fraction of pairs per bin (bin width {(high - low) / bins:.3g})")
    fig.suptitle(title, fontsize=11)
    return fig
