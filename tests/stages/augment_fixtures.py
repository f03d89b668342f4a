"""Fixtures of the augment tests: tiny MarianMT models with a sentencepiece vocabulary trained here,
built once per session (helpers that write datasets and params: ``augment_helpers``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.stages.augment_helpers import build_tiny_marian, make_sentences, tokenizer_folder


@pytest.fixture(scope="session")
def corpus() -> list[str]:
    return make_sentences(400, seed=1)


@pytest.fixture(scope="session")
def tiny_marian(tmp_path_factory, corpus) -> Path:
    """A randomly initialised 2+2-layer MarianMT (d_model 32) with a sentencepiece vocabulary
    trained on the test corpus. ``init_std`` 1.0 makes its (meaningless) greedy output depend on
    the input, which is what the engine comparisons need."""
    folder = tmp_path_factory.mktemp("models") / "tiny-marian"
    return build_tiny_marian(folder, corpus, init_std=1.0)


@pytest.fixture(scope="session")
def copy_marian(tmp_path_factory, corpus) -> Path:
    """A stand-in (constructed) MarianMT that copies its input exactly: no neighbours given."""
    from pairforge.stages.standin.marian import build_model

    folder = tmp_path_factory.mktemp("models") / "copy-marian"
    vocab = tokenizer_folder(folder, corpus, 300)
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
