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

import json
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.files import apply_umask, atomic_write_bytes
from pairforge.pipeline.plumbing.storage import RemotePath
from pairforge.pipeline.science.dataset_card import front_matter, hub_license, hub_metadata

CARD = "README.md"
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
    shards: list[pa.Table], out: Path | RemotePath, fmt: ExportFormat, m: int, card: dict[str, Any]
) -> dict[str, int]:
    """Write ``shards`` of ``pairs`` exported to ``fmt`` under ``out`` (Hub layout; a local
    folder or a store's URL, ``pipeline/plumbing/storage.py``); returns the totals."""
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    for old in data.glob("train-*.parquet"):
        old.unlink()
    totals: dict[str, int] = {}
    n = len(shards)
    for i, shard in enumerate(shards):
        table, counts = export_table(shard, fmt, m)
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="zstd")
        atomic_write_bytes(data / f"train-{i:05d}-of-{n:05d}.parquet", sink.getvalue())
        for key, value in counts.items():
            totals[key] = totals.get(key, 0) + value
    if not isinstance(out, RemotePath):
        apply_umask(data)
    text = export_card(fmt, m, totals, {"path": str(out), **card})
    atomic_write_bytes(out / CARD, text.encode())
    return totals


COLUMN_DOCS = {
    "anchor": "a corpus sentence",
    "positive": "a paraphrase of the anchor (a back-translation or LLM rewrite, sampled by "
    "DebCSE's P_pos)",
    "negative": "another corpus sentence close to the anchor in meaning but not a paraphrase "
    "(a hard negative from the cosine band, sampled by DebCSE's P_neg)",
}
# The in-batch negatives loss every layout trains with (a triplet's negative is one more
# candidate beside the other rows' positives).
LOSS = "MultipleNegativesRankingLoss"


def export_card(fmt: str, m: int, totals: dict[str, int], card: dict[str, Any]) -> str:
    """The export folder's ``README.md``: Hub front matter (the ``train`` split's files, the
    licence as a Hub id), what a row is, how the rows were made, the counts, how to train on it.

    ``card``: ``name`` and ``license`` (as written in params) of the corpus, ``source`` (the
    pairs dataset's path), ``params`` (the sample stage's, from the pairs manifest), ``path``
    (the export folder, for the loading snippet).
    """
    license_text = card.get("license")
    license_id = hub_license(license_text)
    name = card.get("name") or "pairs"
    sections = [
        front_matter(
            hub_metadata(
                license_text,
                int(totals.get("rows", 0)),
                pretty_name=f"{name}: sentence-transformers {fmt}s",
                source=(card.get("params") or {}).get("corpus_source"),
                tags=(fmt,),
                data_files="data/train-*.parquet",
            )
        ),
        _intro(fmt, m, name, card.get("source")),
        _columns_section(fmt, m),
        _how_made_section(card.get("params") or {}),
        _counts_section(totals),
        _training_section(fmt, card.get("path")),
        FILES_SECTION,
        _licence_section(license_id, license_text),
    ]
    # Each section ends its last line; one more newline between them is the blank line.
    return "\n".join(sections)


def _intro(fmt: str, m: int, name: str, source: str | None) -> str:
    """The title and the paragraph saying what a row of the ``fmt`` layout holds and which
    pairs dataset (``source``) of which corpus (``name``) it was exported from."""
    holds = {
        "triplet": "a paraphrase of it and a hard negative",
        "n-tuple": f"a paraphrase of it and {m} hard negatives",
        "pair": "a paraphrase of it",
    }[fmt]
    return f"""# {name}: sentence-transformers {fmt}s

Training data for sentence embeddings in the sentence-transformers `{fmt}` layout: each row
holds an anchor sentence, {holds}. Exported by `pairforge export --format {fmt}` from the
pairforge pairs dataset `{source}` (not shipped here), mined from {name}.
"""


def _columns_section(fmt: str, m: int) -> str:
    """The "Columns" section: one table row per column of the layout (``_columns``), then
    how many rows an anchor gives and which anchors give none."""
    col_rows = "\n".join(
        f"| `{c}` | string | {COLUMN_DOCS[c.split('_')[0]]} |" for c in _columns(fmt, m)
    )
    per_row = {
        "triplet": "one row per (sampled positive, sampled negative) of an anchor: an anchor "
        "with p positives and n negatives gives p x n rows, each negative repeated for each "
        'positive (as sentence-transformers\' `mine_hard_negatives(output_format="triplet")`)',
        "n-tuple": f"one row per sampled positive of an anchor, with the anchor's first {m} "
        f"negatives; anchors with fewer than {m} negatives have no row",
        "pair": "one row per sampled positive of an anchor; the other rows of a batch are its "
        "negatives",
    }[fmt]
    no_row = "a positive" if fmt == "pair" else "a positive or enough negatives"
    return f"""## Columns

| column | type | what |
|---|---|---|
{col_rows}

Rows: {per_row}. Anchors without {no_row} have no row.
"""


def _how_made_section(params: dict[str, Any]) -> str:
    """The "How the rows were made" section: positives, negatives, and the sample stage's
    sampling settings from ``params`` (those set, in a fixed order)."""
    recipe = ", ".join(
        f"{k} = {params[k]}"
        for k in ("m", "m_positive", "ipw", "lambda_n", "lambda_p", "temperature", "seed")
        if params.get(k) is not None
    )
    return f"""## How the rows were made

- **Positives**: augmentations of the anchor (back-translation round trips and, when enabled,
  LLM rewrites), drawn by DebCSE's inverse propensity weighting, which favours candidates that
  keep the meaning with fewer shared words (DebCSE, CIKM 2023, eqs. 5-6).
- **Negatives**: corpus sentences among the anchor's FAISS nearest neighbours whose cosine
  lies in the mining band (close in topic, not paraphrases), drawn by DebCSE's eqs. 3-4.
- Sampling settings: {recipe or "recorded in the pairs dataset's manifest"}.
"""


def _counts_section(totals: dict[str, int]) -> str:
    """The "Counts" table from ``write_export``'s totals: rows, anchors read, then each reason
    an anchor has no row, in the order the totals hold them."""
    skipped = {k: v for k, v in totals.items() if k not in ("rows", "anchors")}
    counts = "\n".join(
        [
            f"| rows | {totals.get('rows', 0):,} |",
            f"| anchors read | {totals.get('anchors', 0):,} |",
            *(
                f"| anchors without a row: {k.replace('_', ' ')} | {v:,} |"
                for k, v in skipped.items()
            ),
        ]
    )
    return f"""## Counts

| | |
|---|---|
{counts}
"""


def _training_section(fmt: str, path: str | None) -> str:
    """The "Training with it" section: why to train with the no-duplicates batch sampler, and
    a sentence-transformers training snippet that loads the folder at ``path``."""
    repeats = "positive" if fmt == "pair" else "positive and negative"
    path = json.dumps(str(path or "path/to/this/folder"))
    return f"""## Training with it

An anchor appears in several rows (one per {repeats}). With an in-batch negatives loss such as
`{LOSS}`, two rows of the same anchor in one batch would make each other's positive a false
negative: train with the no-duplicates batch sampler, `BatchSamplers.NO_DUPLICATES`.

```python
from datasets import load_dataset
from sentence_transformers import (
    SentenceTransformer,
    SentenceTransformerTrainer,
    SentenceTransformerTrainingArguments,
)
from sentence_transformers.losses import {LOSS}
from sentence_transformers.training_args import BatchSamplers

train = load_dataset({path}, split="train")
model = SentenceTransformer("sentence-transformers/all-MiniLM-L6-v2")  # the model to train
args = SentenceTransformerTrainingArguments(
    output_dir="out",
    per_device_train_batch_size=64,
    batch_sampler=BatchSamplers.NO_DUPLICATES,
)
trainer = SentenceTransformerTrainer(
    model=model, args=args, train_dataset=train, loss={LOSS}(model)
)
trainer.train()
```
"""


# The "Files" section: what the export folder holds, the same for every export.
FILES_SECTION = """## Files

- `README.md`: this card.
- `data/train-*.parquet`: the `train` split, zstd-compressed Parquet (`datasets`, polars,
  pyarrow and DuckDB read the folder directly).
"""


def _licence_section(license_id: str, license_text: str | None) -> str:
    """The "Licence" section: the Hub id and the corpus licence as written in params."""
    return f"""## Licence

`{license_id}`: the licence of the corpus text ({license_text or "not stated"}). Rows quote
corpus sentences and machine-generated paraphrases of them, so they carry the corpus's terms.
"""


def _columns(fmt: str, m: int) -> list[str]:
    """The column names of the ``fmt`` layout, in order (``n-tuple``: ``m`` negatives)."""
    if fmt == "pair":
        return ["anchor", "positive"]
    if fmt == "triplet":
        return ["anchor", "positive", "negative"]
    return ["anchor", "positive", *[f"negative_{j + 1}" for j in range(m)]]


def nonempty(table: pa.Table, column: str) -> int:
    """Rows of ``table`` whose list ``column`` is not empty."""
    return int(pc.sum(pc.greater(pc.list_value_length(table[column]), 0)).as_py() or 0)
