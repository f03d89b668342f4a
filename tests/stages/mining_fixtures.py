"""Fixtures of the mining stage tests: one torch thread (autouse, for the folders whose conftest
imports it), and a small project with sentences and candidates built once and copied by the tests
that write into it. Their tiny BERT (``tiny_bert``) is in ``tests/tiny_models.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
from pairforge.pipeline.science.text import sentence_id

from tests.stages.mining_helpers import (
    candidate_rows,
    make_texts,
    write_candidates,
    write_sentences,
)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """One torch thread while a mining test runs: a 32-d model gains nothing from more, and on a
    busy 2-core machine OpenMP spin-waiting makes two threads ~30x slower than one."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def mining_inputs(tmp_path_factory) -> Path:
    """A project folder with 240 sentences in 6 shards and their candidates, built once."""
    root = tmp_path_factory.mktemp("mining-inputs")
    texts = make_texts(240, seed=1)
    write_sentences(root / "data/sentences", texts, rows_per_shard=40)
    ids = [sentence_id(t) for t in texts]
    write_candidates(root / "data/candidates", candidate_rows(ids, texts), rows_per_shard=300)
    return root
