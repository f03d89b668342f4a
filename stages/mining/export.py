"""Export a ``pairs`` dataset to the column layouts sentence-transformers trains on.

- ``triplet``: ``(anchor, positive, negative)``, one row per (sampled positive, sampled negative)
  of an anchor, as ``mine_hard_negatives(output_format="triplet")`` writes (each negative is
  repeated for each positive);
- ``n-tuple``: ``(anchor, positive, negative_1, ..., negative_m)``, one row per sampled positive,
  for anchors with at least ``m`` negatives;
- ``pair``: ``(anchor, positive)``, one row per sampled positive (MultipleNegativesRankingLoss).

Anchors without a positive (or, for ``triplet``/``n-tuple``, without enough negatives) have no row
and are counted. The output folder is laid out for the Hugging Face Hub: ``README.md`` and
``data/train-XXXXX-of-YYYYY.parquet``, so ``datasets.load_dataset(folder)`` reads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pairforge.pipeline import schemas as S
from pairforge.pipeline.shards import atomic_write_bytes

ExportFormat = Literal["triplet", "n-tuple", "pair"]
FORMATS: tuple[str, ...] = ("triplet", "n-tuple", "pair")


def _lists(table: pa.Table, column: str) -> tuple[np.ndarray, pa.Array]:
    col = table[column].combine_chunks()
    offsets = col.offsets.to_numpy().astype(np.int64)
    offsets = offsets - offsets[0]
    return offsets, col.flatten()


def export_table(table: pa.Table, fmt: ExportFormat, m: int) -> tuple[pa.Table, dict[str, int]]:
    """One shard of ``pairs`` -> the export layout ``fmt``; counts of rows kept and skipped."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    anchors = table[S.TEXT].combine_chunks()
    p_off, positives = _lists(table, S.POSITIVE_TEXTS)
    n_off, negatives = _lists(table, S.NEGATIVE_TEXTS)
    n_pos, n_neg = np.diff(p_off), np.diff(n_off)
    counts = {"anchors": table.num_rows, "no_positive": int((n_pos == 0).sum())}
    if fmt == "pair":
        row = np.repeat(np.arange(table.num_rows), n_pos)  # (rows,)
        out = pa.table({"anchor": anchors.take(pa.array(row)), "positive": positives})
    elif fmt == "triplet":
        per = n_pos * n_neg  # (b,) rows per anchor
        counts["no_negative"] = int(((n_neg == 0) & (n_pos > 0)).sum())
        row = np.repeat(np.arange(table.num_rows), per)
        start = np.repeat(np.cumsum(per) - per, per)
        k = np.arange(row.size) - start  # index within the anchor's product
        pos = p_off[row] + k // np.maximum(n_neg[row], 1)
        neg = n_off[row] + k % np.maximum(n_neg[row], 1)
        out = pa.table(
            {
                "anchor": anchors.take(pa.array(row)),
                "positive": positives.take(pa.array(pos)),
                "negative": negatives.take(pa.array(neg)),
            }
        )
    else:
        full = n_neg >= m
        counts["short_negatives"] = int((~full & (n_pos > 0)).sum())
        reps = np.where(full, n_pos, 0)
        row = np.repeat(np.arange(table.num_rows), reps)
        start = np.repeat(np.cumsum(reps) - reps, reps)
        pos = p_off[row] + (np.arange(row.size) - start)
        cols = {"anchor": anchors.take(pa.array(row)), "positive": positives.take(pa.array(pos))}
        for j in range(m):
            cols[f"negative_{j + 1}"] = negatives.take(pa.array(n_off[row] + j))
        out = pa.table(cols)
    counts["rows"] = out.num_rows
    return out, counts


def write_export(
    shards: list[pa.Table], out: Path, fmt: ExportFormat, m: int, card: dict[str, Any]
) -> dict[str, int]:
    """Write ``shards`` of ``pairs`` exported to ``fmt`` under ``out`` (Hub layout); totals."""
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    for old in data.glob("train-*.parquet"):
        old.unlink()
    totals: dict[str, int] = {}
    n = len(shards)
    for i, shard in enumerate(shards):
        table, counts = export_table(shard, fmt, m)
        tmp = data / f".train-{i:05d}.tmp"
        pq.write_table(table, tmp, compression="zstd")
        tmp.replace(data / f"train-{i:05d}-of-{n:05d}.parquet")
        for key, value in counts.items():
            totals[key] = totals.get(key, 0) + value
    columns = ", ".join(f"`{c}`" for c in _columns(fmt, m))
    rows = "\n".join(f"- {k}: {v:,}" for k, v in totals.items())
    text = f"""---
configs:
- config_name: default
  data_files:
  - split: train
    path: data/train-*.parquet
license: {card.get("license", "other")}
---

# {card.get("name", "pairs")} ({fmt})

Sentence-transformers `{fmt}` layout ({columns}) exported by `pairforge export` from
`{card.get("source")}`; see that dataset's card (`README.md`) for how it was mined.

{rows}
"""
    atomic_write_bytes(out / "README.md", text.encode())
    return totals


def _columns(fmt: str, m: int) -> list[str]:
    if fmt == "pair":
        return ["anchor", "positive"]
    if fmt == "triplet":
        return ["anchor", "positive", "negative"]
    return ["anchor", "positive", *[f"negative_{j + 1}" for j in range(m)]]


def nonempty(table: pa.Table, column: str) -> int:
    """Rows of ``table`` whose list ``column`` is not empty."""
    return int(pc.sum(pc.greater(pc.list_value_length(table[column]), 0)).as_py() or 0)
