"""How alike two samplers' pairs are: of the anchors both pairs datasets hold, the share that drew
the same negatives and the same positive, and how far each dataset's negative draw
probabilities are from a uniform draw over the anchor's pool (the largest drawn probability x
the pool size: 1.0 is uniform) and the mean normalised entropy the sample stage records.

Two samplers whose pairs are the same rows train the same model up to those rows: read such rows
of the quality table as one. Times nothing.

    python benchmarks/pairs_overlap.py runs/quality/pipeline-apertium/data/pairs-uniform \\
        runs/quality/pipeline-apertium/data/pairs-paper
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

COLUMNS = [
    "id",
    "negative_ids",
    "positive_text_id",
    "negative_prob",
    "negative_pool_size",
    "negative_entropy",
]


def uniformity(probs: list[list[float] | None], pool_sizes: list[int]) -> dict[str, float]:
    """The largest draw probability of each anchor's drawn negatives x its pool size (1.0: a
    uniform draw over the pool), over the anchors with a draw: p50, p90 and max."""
    ratios = np.array(
        [max(p) * n for p, n in zip(probs, pool_sizes, strict=True) if p], dtype=np.float64
    )
    if not ratios.size:
        return {"p50": float("nan"), "p90": float("nan"), "max": float("nan")}
    p50, p90 = np.percentile(ratios, [50, 90])
    return {"p50": float(p50), "p90": float(p90), "max": float(ratios.max())}


def overlap(a: dict[str, list[Any]], b: dict[str, list[Any]]) -> dict[str, Any]:
    """Compare two pairs tables (columns :data:`COLUMNS`, as lists) anchor by anchor (by ``id``):
    anchors in both, the share with the same negative ids (as drawn, in order) and the same
    positive, and each side's draw uniformity and mean normalised negative entropy."""
    rows_b = {anchor: i for i, anchor in enumerate(b["id"])}
    common = [(i, rows_b[anchor]) for i, anchor in enumerate(a["id"]) if anchor in rows_b]
    if not common:
        raise SystemExit("pairs_overlap: the two datasets share no anchor id")
    same_neg = sum(a["negative_ids"][i] == b["negative_ids"][j] for i, j in common)
    same_pos = sum(a["positive_text_id"][i] == b["positive_text_id"][j] for i, j in common)

    def entropy(t: dict[str, list[Any]]) -> float:
        values = np.array([e for e in t["negative_entropy"] if e is not None], dtype=np.float64)
        return float(values.mean()) if values.size else float("nan")

    return {
        "anchors": len(common),
        "same_negatives": same_neg,
        "same_positive": same_pos,
        "uniformity": [uniformity(t["negative_prob"], t["negative_pool_size"]) for t in (a, b)],
        "entropy": [entropy(a), entropy(b)],
    }


def markdown(names: list[str], result: dict[str, Any]) -> str:
    n = result["anchors"]
    lines = [
        f"{n:,} anchors in both; the same negatives: {result['same_negatives']:,} "
        f"({result['same_negatives'] / n:.1%}); the same positive: {result['same_positive']:,} "
        f"({result['same_positive'] / n:.1%})",
        "",
        "| pairs | max p x pool size p50 | p90 | max | mean normalised entropy |",
        "|---|---|---|---|---|",
    ]
    for name, u, e in zip(names, result["uniformity"], result["entropy"], strict=True):
        lines.append(f"| {name} | {u['p50']:.4f} | {u['p90']:.4f} | {u['max']:.4f} | {e:.7f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pairs", nargs=2, type=Path, help="two pairs dataset folders")
    args = parser.parse_args()
    from pairforge.pipeline.plumbing import schemas as S
    from pairforge.pipeline.plumbing.shards import open_dataset

    tables = [open_dataset(p, S.PAIRS).read_table(COLUMNS).to_pydict() for p in args.pairs]
    names = [p.name for p in args.pairs]
    print(markdown(names, overlap(*tables)))


if __name__ == "__main__":
    main()
