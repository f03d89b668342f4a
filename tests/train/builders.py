"""Builders for the trainer's tests: pairs datasets, STS fixture folders, tiny model folders.

Everything is real: pairs datasets are pairforge datasets (Parquet shards + manifest, written by
``DatasetWriter``); STS folders follow the layout and file formats of ``shared/data/sts``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.shards import DatasetWriter
from pairforge.pipeline.science.sts import STS_SUBSETS

PAIRS_COLUMNS = {
    S.TEXT: pa.string(),
    S.POSITIVE_TEXTS: pa.list_(pa.string()),
    S.NEGATIVE_TEXTS: pa.list_(pa.string()),
    S.POSITIVE_TEXT: pa.string(),
    S.VIEW1_TEXT: pa.string(),
    S.VIEW2_TEXT: pa.string(),
}


def drop_word(sentence: str, index: int) -> str:
    words = sentence.split()
    if len(words) < 3:
        return sentence
    del words[index % len(words)]
    return " ".join(words)


def pairs_rows(sentences: Sequence[str], seed: int = 0) -> dict[str, list]:
    """Columns for every objective, built from ``sentences`` by dropping words."""
    rng = random.Random(seed)
    n = len(sentences)
    return {
        S.TEXT: list(sentences),
        S.POSITIVE_TEXTS: [[drop_word(s, 1), drop_word(s, 2)] for s in sentences],
        S.NEGATIVE_TEXTS: [
            [sentences[(i + rng.randrange(1, n)) % n] for _ in range(2)] for i in range(n)
        ],
        S.POSITIVE_TEXT: [drop_word(s, 3) for s in sentences],
        S.VIEW1_TEXT: [drop_word(s, -2) for s in sentences],
        S.VIEW2_TEXT: [drop_word(s, 0) for s in sentences],
    }


def write_pairs(
    path: Path,
    columns: dict[str, list],
    rows_per_shard: int = 16,
    row_group_size: int | None = None,
    name: str = "pairs_test",
) -> Path:
    """A complete pairforge dataset of ``columns`` (the given subset of the pairs columns)."""
    spec = S.SchemaSpec(
        name,
        1,
        pa.schema([pa.field(c, PAIRS_COLUMNS.get(c, pa.string())) for c in columns]),
        "test pairs",
    )
    n = len(next(iter(columns.values())))
    writer = DatasetWriter(
        path, spec, stage="test", params={}, fingerprint=f"test-{n}", rows_per_shard=rows_per_shard
    )
    shards = 0
    for shard, start in enumerate(range(0, n, rows_per_shard)):
        table = pa.table(
            {
                c: pa.array(v[start : start + rows_per_shard], PAIRS_COLUMNS.get(c, pa.string()))
                for c, v in columns.items()
            }
        )
        if row_group_size:
            from pairforge.pipeline.plumbing.shards import write_shard

            write_shard(path, shard, table, spec, str(path), row_group_size=row_group_size)
        else:
            writer.write(shard, table)
        shards += 1
    writer.finalize(shards)
    return path


def write_sts(root: Path, pairs: Sequence[tuple[str, str, float]]) -> Path:
    """Every STS task and dev set in the SentEval layout, each with ``pairs`` (cycled per subset).

    STS12-16 subsets get the pairs in turn (two per subset, plus one unscored line each in STS15
    and STS16), so every file exists and the "all" aggregation has several subsets to join.
    """
    k = 0
    for task, subsets in STS_SUBSETS.items():
        folder = root / task
        folder.mkdir(parents=True, exist_ok=True)
        for name in subsets:
            inputs, gold = [], []
            for _ in range(2):
                a, b, score = pairs[k % len(pairs)]
                k += 1
                inputs.append(f"{a}\t{b}")
                gold.append(f"{score:.2f}")
            if task in ("sts15", "sts16"):
                inputs.append(f"{pairs[0][0]}\t{pairs[0][1]}")
                gold.append("")
            (folder / f"STS.input.{name}.txt").write_text("\n".join(inputs) + "\n")
            (folder / f"STS.gs.{name}.txt").write_text("\n".join(gold) + "\n")
    stsb = root / "stsb"
    stsb.mkdir(parents=True, exist_ok=True)
    for split in ("dev", "test"):
        lines = [
            f"main-captions\tMSRvid\t2012test\t{i:04d}\t{score:.3f}\t{a}\t{b}"
            for i, (a, b, score) in enumerate(pairs)
        ]
        (stsb / f"sts-{split}.csv").write_text("\n".join(lines) + "\n")
    sick = root / "sickr"
    sick.mkdir(parents=True, exist_ok=True)
    header = "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment"
    for name, newline in (("SICK_trial.txt", "\n"), ("SICK_test_annotated.txt", "\r\n")):
        lines = [header] + [
            f"{i}\t{a}\t{b}\t{1 + 4 * score / 5:.1f}\tNEUTRAL"
            for i, (a, b, score) in enumerate(pairs)
        ]
        (sick / name).write_text(newline.join(lines) + newline)
    return root


# Pairs in the tiny tokenizer's vocabulary, gold scores spread over [0, 5].
STS_PAIRS = [
    ("the cat sat on the mat .", "the cat sat on the mat .", 5.0),
    ("a dog ran in the park .", "a dog ran in the green park .", 4.6),
    ("birds fly over the blue sea .", "birds fly over the sea .", 4.2),
    ("she reads a long book at night .", "she reads a book .", 3.4),
    ("he plays guitar with his friends .", "he plays with his friends .", 3.0),
    ("the sun rises over green hills .", "rain falls on the quiet town .", 1.2),
    ("children build a castle of sand .", "the cat sat on the mat .", 0.4),
    ("rain falls on the quiet town .", "a dog ran in the park .", 0.0),
]
