"""Helpers of the augment tests: a synthetic corpus, a sentences dataset, a params file."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import yaml
from pairforge.pipeline import schemas as S
from pairforge.pipeline.shards import DatasetWriter
from pairforge.pipeline.text import sentence_ids

WORDS = [
    "river",
    "stone",
    "market",
    "quiet",
    "engine",
    "paper",
    "garden",
    "winter",
    "signal",
    "copper",
    "lantern",
    "orbit",
    "harbor",
    "violet",
    "meadow",
    "thunder",
    "silver",
    "canvas",
    "maple",
    "puzzle",
    "the",
    "a",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "on",
    "for",
    "with",
    "bread",
    "train",
    "city",
    "music",
    "doctor",
    "storm",
    "village",
    "forest",
    "teacher",
    "window",
]


def make_sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 14))]
        out.append(" ".join(words).capitalize() + f" {i}.")
    return out


def write_sentences(
    path: Path, texts: list[str], rows_per_shard: int, ids: list[str] | None = None
) -> Path:
    """A complete ``sentences`` dataset at ``path`` (ids from the texts unless given)."""
    ids = ids if ids is not None else sentence_ids(texts)[0]
    writer = DatasetWriter(
        path,
        S.SENTENCES,
        stage="test",
        params={},
        fingerprint=f"test-{len(texts)}",
        rows_per_shard=rows_per_shard,
    )
    n_shards = 0
    for n_shards, start in enumerate(range(0, len(texts), rows_per_shard), start=1):
        chunk = slice(start, start + rows_per_shard)
        writer.write(
            n_shards - 1,
            pa.table(
                {
                    S.ID: pa.array(ids[chunk], pa.string()),
                    S.TEXT: pa.array(texts[chunk], pa.string()),
                    S.SOURCE: pa.array(["test.txt"] * len(texts[chunk]), pa.string()),
                    S.LINE: pa.array(range(start + 1, start + 1 + len(texts[chunk])), pa.int64()),
                }
            ),
        )
    writer.finalize(n_shards)
    return path


def write_params(path: Path, sections: dict) -> Path:
    path.write_text(yaml.safe_dump(sections, sort_keys=False))
    return path
