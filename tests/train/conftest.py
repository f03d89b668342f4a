"""A tiny randomly initialised BERT and a word-level tokenizer, built once per session.

Tests get a deep copy of the model (``tiny_mlm``), so training in one test leaves the others'
starting point unchanged.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

SENTENCES = [
    "the cat sat on the mat .",
    "a dog ran in the park .",
    "birds fly over the blue sea .",
    "she reads a long book at night .",
    "he plays guitar with his friends .",
    "the sun rises over green hills .",
    "children build a castle of sand .",
    "rain falls on the quiet town .",
]

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# The DenoSent prompt's own tokens, and a few words only the truncation test uses.
EXTRA_TOKENS = ['"', "means", ",", "one", "two", "three", "four", "five"]


def vocabulary() -> list[str]:
    words = sorted({word for sentence in SENTENCES for word in sentence.split()})
    return SPECIAL_TOKENS + [token for token in EXTRA_TOKENS if token not in words] + words


@pytest.fixture(scope="session")
def tiny_sentences() -> list[str]:
    """The fixed sentences the tiny tokenizer covers, for the short training runs."""
    return list(SENTENCES)


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> BertTokenizerFast:
    folder = tmp_path_factory.mktemp("tiny_tokenizer")
    (folder / "vocab.txt").write_text("\n".join(vocabulary()) + "\n")
    return BertTokenizerFast.from_pretrained(str(folder))


@pytest.fixture(scope="session")
def _tiny_mlm_once(tiny_tokenizer: BertTokenizerFast) -> BertForMaskedLM:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tiny_tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        pad_token_id=tiny_tokenizer.pad_token_id,
        # At BERT's 0.02 the random encoder maps every sentence to nearly the same [CLS] vector,
        # and 30 steps of SimCSE barely leave that plateau; wider weights keep sentences apart.
        initializer_range=0.1,
    )
    return BertForMaskedLM(config)


@pytest.fixture
def tiny_mlm(_tiny_mlm_once: BertForMaskedLM) -> BertForMaskedLM:
    """A fresh copy of the session's tiny BERT with its MLM head, in train mode."""
    model = copy.deepcopy(_tiny_mlm_once)
    model.train()
    return model


# --- model folders and STS data for the trainer, evaluator and export tests --------------------


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, _tiny_mlm_once, tiny_tokenizer):
    """The tiny BERT with its MLM head and its tokenizer, saved as a model folder."""
    folder = tmp_path_factory.mktemp("tiny_bert_mlm")
    _tiny_mlm_once.save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_encoder_dir(tmp_path_factory, _tiny_mlm_once, tiny_tokenizer):
    """The tiny BERT encoder alone (no MLM head, like a sentence-transformers checkpoint)."""
    folder = tmp_path_factory.mktemp("tiny_bert_encoder")
    _tiny_mlm_once.bert.save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def sts_dir(tmp_path_factory):
    """Every STS task in the SentEval layout, with pairs in the tiny tokenizer's vocabulary."""
    from tests.train.builders import STS_PAIRS, write_sts

    return write_sts(tmp_path_factory.mktemp("sts"), STS_PAIRS)


@pytest.fixture(scope="package", autouse=True)
def _one_torch_thread():
    """Tiny models gain nothing from a second thread, and on a busy machine two threads that
    spin-wait on each other make a step 10-100x slower: the training tests run on one, and so do
    the processes they start (OMP_NUM_THREADS), so in-process and subprocess runs compare
    bitwise."""
    import os

    threads, env = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    yield
    torch.set_num_threads(threads)
    if env is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = env
