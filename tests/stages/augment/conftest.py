"""Fixtures of the augment tests: tiny MarianMT models with a sentencepiece vocabulary trained here,
built once per session, and helpers to write a sentences dataset and params."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from pipeline import schemas as S
from pipeline.shards import DatasetWriter
from pipeline.text import sentence_ids

WORDS = (
    "river stone market quiet engine paper garden winter signal copper lantern orbit harbor "
    "violet meadow thunder silver canvas maple puzzle the a of and to in is was on for with "
    "bread train city music doctor storm village forest teacher window"
).split()


def make_sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 14))]
        out.append(" ".join(words).capitalize() + f" {i}.")
    return out


def write_sentences(path: Path, texts: list[str], rows_per_shard: int, ids: list[str] | None = None) -> Path:
    """A complete ``sentences`` dataset at ``path`` (ids from the texts unless given)."""
    ids = ids if ids is not None else sentence_ids(texts)[0]
    writer = DatasetWriter(
        path, S.SENTENCES, stage="test", params={}, fingerprint=f"test-{len(texts)}", rows_per_shard=rows_per_shard
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


def _tokenizer_folder(folder: Path, texts: list[str], vocab_size: int) -> dict[str, int]:
    from stages.augment.standin import marian_vocab, train_vocabulary, write_tokenizer

    spm_model = train_vocabulary(texts, vocab_size)
    vocab = marian_vocab(spm_model)
    write_tokenizer(folder, spm_model, vocab)
    return vocab


@pytest.fixture(scope="session")
def corpus() -> list[str]:
    return make_sentences(400, seed=1)


@pytest.fixture(scope="session")
def tiny_marian(tmp_path_factory, corpus) -> Path:
    """A randomly initialised 2+2-layer MarianMT (d_model 32) with a sentencepiece vocabulary
    trained on the test corpus. ``init_std`` 1.0 makes its (meaningless) greedy output depend on
    the input, which is what the engine comparisons need."""
    import torch
    from transformers import MarianConfig, MarianMTModel

    folder = tmp_path_factory.mktemp("models") / "tiny-marian"
    vocab = _tokenizer_folder(folder, corpus, 300)
    config = MarianConfig(
        vocab_size=len(vocab),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=128,
        pad_token_id=vocab["<pad>"],
        eos_token_id=vocab["</s>"],
        decoder_start_token_id=vocab["<pad>"],
        init_std=1.0,
    )
    torch.manual_seed(0)
    MarianMTModel(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def copy_marian(tmp_path_factory, corpus) -> Path:
    """A stand-in (constructed) MarianMT that copies its input exactly: no neighbours given."""
    from stages.augment.standin import build_model

    folder = tmp_path_factory.mktemp("models") / "copy-marian"
    vocab = _tokenizer_folder(folder, corpus, 300)
    build_model(vocab, {}, seed=3, substitute_rate=0.0, sharpness=4.0).save_pretrained(folder)
    return folder


@pytest.fixture()
def model_copy(tmp_path):
    """Copy a session model folder into this test's tmp dir (tests may change it)."""

    def copy(folder: Path, name: str | None = None) -> Path:
        dest = tmp_path / (name or folder.name)
        shutil.copytree(folder, dest)
        return dest

    return copy
