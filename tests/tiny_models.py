"""Every tiny model the tests use, as session fixtures registered once for the whole run.

The root ``tests/conftest.py`` imports these fixtures, so each is built once per test run
whatever folders are selected (``tests/test_tiny_models.py`` checks it). Folder conftests must
not import them again: a second registration is a second session fixture, built again.

- the trainer's tiny BERT (``tiny_tokenizer``, ``tiny_mlm``, ``tiny_model_dir``,
  ``tiny_encoder_dir``) and the STS folder in its vocabulary (``sts_dir``);
- the mining stages' tiny BERT (``tiny_bert``);
- the augment stages' tiny MarianMT models (``tiny_marian``, ``copy_marian``) and their corpus.

The two BERTs stay two models: see ``tiny_bert``. The one-torch-thread autouse fixtures stay in
the folder conftests that want them (``tests/train/conftest.py``,
``tests/stages/mining_fixtures.py``); they must not become autouse for every test. torch,
transformers and the stage helpers are imported inside the fixtures, so that a run that uses no
model does not pay for importing them.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from transformers import BertForMaskedLM, BertTokenizerFast

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
    """The trainer's tiny tokenizer vocabulary: special tokens, prompt tokens, ``SENTENCES``."""
    words = sorted({word for sentence in SENTENCES for word in sentence.split()})
    return SPECIAL_TOKENS + [token for token in EXTRA_TOKENS if token not in words] + words


# --- the trainer's tiny BERT ----------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_sentences() -> list[str]:
    """The fixed sentences the tiny tokenizer covers, for the short training runs."""
    return list(SENTENCES)


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> BertTokenizerFast:
    """A word-level WordPiece tokenizer over ``vocabulary()``."""
    from transformers import BertTokenizerFast

    folder = tmp_path_factory.mktemp("tiny_tokenizer")
    (folder / "vocab.txt").write_text("\n".join(vocabulary()) + "\n")
    return BertTokenizerFast.from_pretrained(str(folder))


@pytest.fixture(scope="session")
def _tiny_mlm_once(tiny_tokenizer: BertTokenizerFast) -> BertForMaskedLM:
    """The session's tiny BERT with its MLM head (seed 0); tests take a copy (``tiny_mlm``)."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

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
    """A fresh copy of the session's tiny BERT with its MLM head, in train mode, so training in
    one test leaves the others' starting point unchanged."""
    model = copy.deepcopy(_tiny_mlm_once)
    model.train()
    return model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, _tiny_mlm_once, tiny_tokenizer) -> Path:
    """The tiny BERT with its MLM head and its tokenizer, saved as a model folder."""
    folder = tmp_path_factory.mktemp("tiny_bert_mlm")
    _tiny_mlm_once.save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_encoder_dir(tmp_path_factory, _tiny_mlm_once, tiny_tokenizer) -> Path:
    """The tiny BERT encoder alone (no MLM head, like a sentence-transformers checkpoint)."""
    folder = tmp_path_factory.mktemp("tiny_bert_encoder")
    _tiny_mlm_once.bert.save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def sts_dir(tmp_path_factory) -> Path:
    """Every STS task in the SentEval layout, with pairs in the tiny tokenizer's vocabulary."""
    from tests.train.builders import STS_PAIRS, write_sts

    return write_sts(tmp_path_factory.mktemp("sts"), STS_PAIRS)


# --- the mining stages' tiny BERT -----------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    """A 2-layer, 32-d BERT (no MLM head, 128 positions) with a WordPiece vocabulary of the
    mining test corpus (``tests.stages.mining_helpers``), saved like a hub folder.

    It is not the trainer's tiny BERT, on purpose: the mining texts are drawn from
    ``mining_helpers.WORDS``, which the trainer's vocabulary does not cover (they would encode
    as [UNK]), and the trainer's tests need their own vocabulary (the DenoSent prompt tokens,
    the truncation words, ``test_cotbert``'s extension of it). One merged vocabulary would
    change the embedding matrix, and so every weight both models draw from seed 0; tests assert
    on those exact weights: ``tests/stages/embed/test_ctranslate2.py`` bounds the int8-vs-float32
    cosine it measured on these (cosine ~0.995 between texts), ``tests/stages/report`` bounds
    the dropout positives' cosine, and the trainer's short SimCSE runs are tuned to leave the
    starting plateau of theirs (see ``_tiny_mlm_once``).
    """
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from tests.stages.mining_helpers import vocabulary as mining_vocabulary

    folder = tmp_path_factory.mktemp("tiny-bert")
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(mining_vocabulary()) + "\n")
    tokenizer = BertTokenizerFast.from_pretrained(str(folder))
    assert tokenizer.unk_token_id not in tokenizer("the river .")["input_ids"]
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(mining_vocabulary()),
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


# --- the augment stages' tiny MarianMT models -----------------------------------------------


@pytest.fixture(scope="session")
def corpus() -> list[str]:
    """The augment tests' 400 seeded sentences, which the Marian vocabularies are trained on."""
    from tests.stages.augment_helpers import make_sentences

    return make_sentences(400, seed=1)


@pytest.fixture(scope="session")
def tiny_marian(tmp_path_factory, corpus) -> Path:
    """A randomly initialised 2+2-layer MarianMT (d_model 32) with a sentencepiece vocabulary
    trained on the test corpus. ``init_std`` 1.0 makes its (meaningless) greedy output depend on
    the input, which is what the engine comparisons need."""
    from tests.stages.augment_helpers import build_tiny_marian

    folder = tmp_path_factory.mktemp("models") / "tiny-marian"
    return build_tiny_marian(folder, corpus, init_std=1.0)


@pytest.fixture(scope="session")
def copy_marian(tmp_path_factory, corpus) -> Path:
    """A stand-in (constructed) MarianMT that copies its input exactly: no neighbours given."""
    from pairforge.stages.standin.marian import build_model

    from tests.stages.augment_helpers import tokenizer_folder

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
