"""The report's positives by route: how far each round trip moves a sentence, per engine.

For every route of a ``candidates`` dataset (the project's own, and any others given to compare,
such as a stand-in run's), a seeded sample of its clean round trips (noise ``none``: the
candidate of the sentence itself, whose ``noised_text`` is the sentence): the cosine of candidate
and sentence under the report's encoder (both encoded here, so every dataset is measured alike)
and the candidate's ``edit_ratio`` (normalised character Indel distance to the sentence, from
backtranslate). Outputs: a table (quantiles per route), a two-panel PNG (cosine, edit ratio:
one histogram outline per route) and the figures for the metrics.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.shards import open_dataset
from pairforge.pipeline.plumbing.storage import dataset_path

QUANTILES = (0.1, 0.5, 0.9)


def source_label(path: str) -> str:
    """What made a candidates dataset: its engine, ``stand-in`` when its manifest says so."""
    manifest = json.loads((dataset_path(path) / "_manifest.json").read_text())
    if manifest.get("standin"):
        return "stand-in"
    return str((manifest.get("engine") or {}).get("engine", "unknown"))


def route_samples(path: str, n: int, seed: int) -> dict[str, dict[str, Any]]:
    """``{route: {"source", "target", "edit", "identical"}}``: up to ``n`` clean round trips per
    route of the dataset at ``path``, drawn with ``seed``, in dataset order."""
    table = open_dataset(path, S.CANDIDATES).read_table(
        [S.ROUTE, S.NOISE, S.NOISED_TEXT, S.TEXT, S.EDIT_RATIO, S.IDENTICAL]
    )
    table = table.filter(pc.equal(table[S.NOISE], "none"))
    routes = table[S.ROUTE].to_numpy(zero_copy_only=False)
    out = {}
    for k, route in enumerate(sorted(set(routes.tolist()))):
        rows = np.flatnonzero(routes == route)
        rng = np.random.default_rng([seed, k])
        pick = np.sort(rng.choice(rows, size=min(n, rows.size), replace=False))
        part = table.take(pick)
        out[route] = {
            "source": part[S.NOISED_TEXT].to_pylist(),
            "target": part[S.TEXT].to_pylist(),
            "edit": part[S.EDIT_RATIO].to_numpy(zero_copy_only=False).astype(np.float64),
            "identical": part[S.IDENTICAL].to_numpy(zero_copy_only=False).astype(bool),
        }
    return out


def measure(
    datasets: list[str], encode, n: int, seed: int
) -> dict[str, dict[str, np.ndarray | int | float]]:
    """Per ``"<source label> <route>"`` series: ``cos`` and ``edit`` arrays ``(k,)``, ``n`` and
    the identical share, the texts of all datasets encoded in one call of ``encode`` (texts ->
    unit vectors ``(m, dim)``)."""
    samples = {}
    for path in datasets:
        label = source_label(path)
        for route, sample in route_samples(path, n, seed).items():
            name = f"{label} {route}"
            while name in samples:  # two datasets of one engine: keep both apart
                name += "'"
            samples[name] = sample
    texts = list(dict.fromkeys(t for s in samples.values() for t in s["source"] + s["target"]))
    where = {t: i for i, t in enumerate(texts)}
    vectors = encode(texts) if texts else np.zeros((0, 1), np.float32)
    out = {}
    for name, s in samples.items():
        a = vectors[[where[t] for t in s["source"]]]
        b = vectors[[where[t] for t in s["target"]]]
        out[name] = {
            "cos": np.einsum("ij,ij->i", a, b).astype(np.float64),
            "edit": s["edit"],
            "n": len(s["source"]),
            "identical": float(s["identical"].mean()) if len(s["source"]) else 0.0,
        }
    return out


def summary(series: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The metrics: per series ``n``, ``identical`` share, mean and p10/p50/p90 of each measure."""
    out = {}
    for name, s in series.items():
        row: dict[str, Any] = {"n": s["n"], "identical": round(s["identical"], 4)}
        for measure in ("cos", "edit"):
            values = s[measure]
            if values.size:
                qs = np.quantile(values, QUANTILES)
                named = zip(QUANTILES, qs, strict=True)
                row[measure] = {
                    "mean": round(float(values.mean()), 4),
                    **{f"p{int(q * 100)}": round(float(v), 4) for q, v in named},
                }
        out[name] = row
    return out


def markdown(table: dict[str, dict[str, Any]], encoder: str, n: int, png: str) -> str:
    """The report's section: the table and the figure."""
    lines = [
        "## Positive candidates by route",
        "",
        f"Clean round trips (the sentence itself, no DebCSE noise), up to {n:,} per route: cosine "
        f"of candidate and sentence under `{encoder}` and the candidate's edit ratio (normalised "
        "character Indel distance). A stand-in copies the sentence with seeded word swaps; a real "
        "translation moves it further and sometimes errs.",
        "",
        "| source and route | n | identical | cos p10 | p50 | p90 | mean | edit p10 | p50 | p90 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in table.items():
        cos, edit = row.get("cos", {}), row.get("edit", {})

        def cell(d: dict, key: str) -> str:
            return f"{d[key]:.3f}" if key in d else ""

        lines.append(
            f"| {name} | {row['n']:,} | {row['identical']:.1%} | {cell(cos, 'p10')} | "
            f"{cell(cos, 'p50')} | {cell(cos, 'p90')} | {cell(cos, 'mean')} | "
            f"{cell(edit, 'p10')} | {cell(edit, 'p50')} | {cell(edit, 'p90')} |"
        )
    lines += ["", f"![positives by route]({png})", ""]
    return "\n".join(lines)


def plot(series: dict[str, dict[str, Any]], path: Path, encoder: str, bins: int) -> None:
    """Two panels (cosine to the sentence, edit ratio), one step outline per series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, measure, low, high, xlabel in (
        (axes[0], "cos", 0.0, 1.0, f"cosine to the sentence ({encoder})"),
        (axes[1], "edit", 0.0, 1.0, "edit ratio to the sentence (character Indel, normalised)"),
    ):
        edges = np.linspace(low, high, bins + 1)
        for name, s in series.items():
            values = np.clip(s[measure], low, high)
            if not values.size:
                continue
            counts, _ = np.histogram(values, bins=edges)
            dashed = name.startswith("stand-in")
            ax.stairs(counts / counts.sum(), edges, label=name, linestyle="--" if dashed else "-")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("fraction of candidates")
    axes[1].legend(fontsize=8)
    fig.suptitle("Positive candidates by route: how far each round trip moves a sentence")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
