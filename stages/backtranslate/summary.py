"""Metrics and plots of the ``backtranslate`` stage, read back from the finished dataset."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.compute as pc
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.errors import DataIntegrityError
from pairforge.pipeline.plumbing.shards import open_dataset
from pairforge.stages.backtranslate.noise import KINDS

PASS_COUNTS = ("requested", "dedup_saved", "cache_hits", "translated")


def summarize(output: str, routes: list[str], manifest: dict, conversions: dict) -> dict:
    """The stage's metrics: counts from the manifest, per-route quality means from the data."""
    counts = manifest["counts"]
    dataset = open_dataset(output, S.CANDIDATES)
    table = dataset.read_table([S.ROUTE, S.IDENTICAL, S.LENGTH_RATIO, S.EDIT_RATIO])
    if table.num_rows != counts.get("candidates", 0):
        raise DataIntegrityError(
            f"backtranslate: {table.num_rows} candidate rows written, counts say {counts.get('candidates', 0)}"
        )
    per_route = {}
    totals = dict.fromkeys(PASS_COUNTS, 0)
    for route in routes:
        rows = table.filter(pc.equal(table[S.ROUTE], route))
        entry = {
            "candidates": int(counts.get(f"{route}.candidates", 0)),
            "identical": int(counts.get(f"{route}.identical", 0)),
            "mean_edit_ratio": _mean(rows[S.EDIT_RATIO]),
            "mean_length_ratio": _mean(rows[S.LENGTH_RATIO]),
        }
        entry["identical_rate"] = (
            round(entry["identical"] / entry["candidates"], 4) if entry["candidates"] else 0.0
        )
        for leg in ("forward", "backward"):
            entry[leg] = {k: int(counts.get(f"{route}.{leg}.{k}", 0)) for k in PASS_COUNTS}
            for k in PASS_COUNTS:
                totals[k] += entry[leg][k]
        per_route[route] = entry
    n_sent = int(counts.get("sentences", 0))
    n_cand = int(counts.get("candidates", 0))
    identical = int(counts.get("identical", 0))
    standin = manifest.get("standin")
    return {
        "sentences_in": n_sent,
        "candidates_out": n_cand,
        "candidates_per_sentence": round(n_cand / n_sent, 3) if n_sent else 0.0,
        "identical": identical,
        "identical_rate": round(identical / n_cand, 4) if n_cand else 0.0,
        "empty": int(counts.get("empty", 0)),
        "translations": {
            "requested": totals["requested"],
            "dedup_saved": totals["dedup_saved"],
            "cache_hits": totals["cache_hits"],
            "performed": totals["translated"],
        },
        "routes": per_route,
        "noise": {k: int(counts.get(f"noise.{k}", 0)) for k in ("none", *KINDS, "collisions")},
        "engine": manifest["engine"],
        "ctranslate2_conversions": conversions,
        "standin": bool(standin),
        "standin_note": standin["note"] if standin else None,
        "shards": manifest["num_shards"],
    }


def _mean(column) -> float:
    value = pc.mean(column).as_py() if len(column) else None
    return round(float(value), 4) if value is not None else 0.0


def plot_edit_ratio(output: str, routes: list[str], path: str) -> None:
    """PNG histogram of the character edit ratio to the source, one series per route."""
    table = open_dataset(output, S.CANDIDATES).read_table([S.ROUTE, S.EDIT_RATIO])
    values = {
        route: table.filter(pc.equal(table[S.ROUTE], route))[S.EDIT_RATIO].to_numpy()
        for route in routes
    }
    fig = edit_ratio_figure(values)
    import matplotlib.pyplot as plt  # after edit_ratio_figure chose the Agg backend

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)


def edit_ratio_figure(values: dict[str, np.ndarray], bins: int = 40):
    """Each route's edit ratios as a step histogram (fraction of its candidates per bin), so
    routes of different sizes and overlapping shapes stay readable; a matplotlib Figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    edges = np.linspace(0.0, 1.0, bins + 1)
    fig, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    for route, v in values.items():
        v = np.asarray(v, dtype=np.float64)
        if not v.size:
            continue
        counts, _ = np.histogram(np.clip(v, 0.0, 1.0), bins=edges)
        line = ax.stairs(counts / v.size, edges, lw=1.6, label=f"{route} ({v.size:,} candidates)")
        ax.stairs(counts / v.size, edges, fill=True, alpha=0.15, color=line.get_edgecolor())
    ax.set_xlim(0.0, 1.0)
    ax.set_xlabel("character edit ratio to the source (0 = identical)")
    ax.set_ylabel(f"fraction of the route's candidates\n(bin width {1 / bins:.3g})")
    ax.set_title("backtranslate: how far candidates move from their source", fontsize=11)
    ax.grid(alpha=0.3)
    if any(np.asarray(v).size for v in values.values()):
        ax.legend(fontsize=9)
    return fig
