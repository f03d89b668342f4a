"""Fixtures of the augment tests: tiny MarianMT models with a sentencepiece vocabulary trained here,
built once per session (helpers that write datasets and params: ``augment_helpers``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from augment_helpers import make_sentences


def _tokenizer_folder(folder: Path, texts: list[str], vocab_size: int) -> dict[str, int]:
    from pairforge.stages.augment.standin import marian_vocab, train_vocabulary, write_tokenizer

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
    from pairforge.stages.augment.standin import build_model

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
