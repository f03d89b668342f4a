"""Fixtures of the mining stage tests: a tiny BERT built once per session, and a small project
with sentences and candidates built once and copied by the tests that write into it."""

from __future__ import annotations

from pathlib import Path

import pytest
from pairforge.pipeline.text import sentence_id

from tests.stages.mining_helpers import (
    candidate_rows,
    make_texts,
    vocabulary,
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
def tiny_bert(tmp_path_factory) -> Path:
    """A 2-layer, 32-d BERT with a WordPiece vocabulary written here, saved like a hub folder."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder = tmp_path_factory.mktemp("tiny-bert")
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(vocabulary()) + "\n")
    tokenizer = BertTokenizerFast.from_pretrained(str(folder))
    assert tokenizer.unk_token_id not in tokenizer("the river .")["input_ids"]
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(vocabulary()),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
        # Wider than BERT's 0.02, so that a random encoder still tells sentences apart.
        initializer_range=0.1,
    )
    BertModel(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def mining_inputs(tmp_path_factory) -> Path:
    """A project folder with 240 sentences in 6 shards and their candidates, built once."""
    root = tmp_path_factory.mktemp("mining-inputs")
    texts = make_texts(240, seed=1)
    write_sentences(root / "data/sentences", texts, rows_per_shard=40)
    ids = [sentence_id(t) for t in texts]
    write_candidates(root / "data/candidates", candidate_rows(ids, texts), rows_per_shard=300)
    return root
