"""Helpers of the augment tests: a synthetic corpus, a sentences dataset, a params file."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import yaml
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.shards import DatasetWriter
from pairforge.pipeline.science.text import sentence_ids

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


def make_sentences(
    n: int, seed: int = 0, lengths: tuple[int, int] = (4, 14), numbered: bool = True
) -> list[str]:
    """``n`` seeded sentences of ``WORDS``, ``lengths[0]`` to ``lengths[1]`` words each;
    ``numbered``: each ends with its index, so that all are distinct."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(*lengths))]
        out.append(" ".join(words).capitalize() + (f" {i}." if numbered else "."))
    return out


def tokenizer_folder(folder: Path, texts: list[str], vocab_size: int) -> dict[str, int]:
    """A Marian tokenizer (sentencepiece trained on ``texts``) written to ``folder``; its vocab."""
    from pairforge.stages.standin.marian import marian_vocab, train_vocabulary, write_tokenizer

    spm_model = train_vocabulary(texts, vocab_size)
    vocab = marian_vocab(spm_model)
    write_tokenizer(folder, spm_model, vocab)
    return vocab


def build_tiny_marian(folder: Path, texts: list[str], **config) -> Path:
    """A randomly initialised (seed 0) MarianMT in ``folder`` with a 300-piece vocabulary
    trained on ``texts``: 2+2 layers, d_model 32, 2 heads, FFN 64, 128 positions unless
    ``config`` (``MarianConfig`` keys) says otherwise."""
    import torch
    from transformers import MarianConfig, MarianMTModel

    vocab = tokenizer_folder(folder, texts, 300)
    sizes = dict(
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=128,
    )
    marian = MarianConfig(
        vocab_size=len(vocab),
        pad_token_id=vocab["<pad>"],
        eos_token_id=vocab["</s>"],
        decoder_start_token_id=vocab["<pad>"],
        **{**sizes, **config},
    )
    torch.manual_seed(0)
    MarianMTModel(marian).save_pretrained(folder)
    return folder


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


def write_candidates(path: Path, rows: list[tuple[str, str, str, str]]) -> Path:
    """A complete one-shard ``candidates`` dataset of clean round trips ``(id, sentence,
    candidate, route)``, with their identical flags and edit ratios."""
    from pairforge.pipeline.science.candidate_quality import quality_signals

    ids, sources, texts, routes = (list(c) for c in zip(*rows, strict=True))
    identical, length_ratio, edit_ratio = quality_signals(sources, texts)
    n = len(rows)
    table = pa.table(
        {
            S.ID: pa.array(ids, pa.string()),
            S.CANDIDATE_ID: pa.array([f"{i:016x}" for i in range(n)], pa.string()),
            S.TEXT: pa.array(texts, pa.string()),
            S.ROUTE: pa.array(routes, pa.string()),
            S.ENGINE: pa.array(["test"] * n, pa.string()),
            S.MODEL: pa.array(["test"] * n, pa.string()),
            S.DECODING: pa.array(["greedy"] * n, pa.string()),
            S.NOISE: pa.array(["none"] * n, pa.string()),
            S.NOISED_TEXT: pa.array(sources, pa.string()),
            S.PIVOT: pa.array([None] * n, pa.string()),
            S.IDENTICAL: pa.array(identical, pa.bool_()),
            S.LENGTH_RATIO: pa.array(length_ratio, pa.float32()),
            S.EDIT_RATIO: pa.array(edit_ratio, pa.float32()),
        }
    )
    writer = DatasetWriter(path, S.CANDIDATES, stage="test", params={}, fingerprint=f"test-{n}")
    writer.write(0, table)
    writer.finalize(1)
    return path


def write_params(path: Path, sections: dict) -> Path:
    path.write_text(yaml.safe_dump(sections, sort_keys=False))
    return path
