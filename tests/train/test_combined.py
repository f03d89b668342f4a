"""The combined objective: DebCSE's loss plus DenoSent's denoising term, over embeddings, on a tiny
BERT, and through the trainer from params."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from pairforge.pipeline.plumbing.errors import ConfigError
from pairforge.stages.train import stage as T
from pairforge.train.objectives import columns, trainable_parameters
from pairforge.train.objectives.combined import Combined, combined_loss
from pairforge.train.objectives.debcse import debcse_loss
from pairforge.train.objectives.denosent import DenoSent, build_denoiser, denoising_loss

from tests.train.builders import pairs_rows, write_pairs
from tests.train.test_loop import config

D, VOCAB, PAD = 8, 20, 0
TINY = {"num_decoder_layers": 2, "decoder_feedforward": 16}


def test_denosent_and_combined_build_their_decoder_one_way():
    """Both take DenoSent's projector and decoder from ``build_denoiser``: the same weights under
    a seed as DenoSent's own, the same modules in Combined."""
    torch.manual_seed(0)
    denosent = DenoSent(D, mask_token_id=4, pad_token_id=PAD, vocab_size=VOCAB, **TINY)
    torch.manual_seed(0)
    projector, decoder = build_denoiser(D, VOCAB, **TINY)
    for ours, theirs in ((projector, denosent.projector), (decoder, denosent.decoder)):
        mine, built = ours.state_dict(), theirs.state_dict()
        assert mine.keys() == built.keys()
        assert all(torch.equal(mine[k], built[k]) for k in mine)
    combined = Combined(D, PAD, vocab_size=VOCAB, **TINY)
    shapes = {k: v.shape for k, v in combined.decoder.state_dict().items()}
    assert shapes == {k: v.shape for k, v in decoder.state_dict().items()}
    assert combined.projector.weight.shape == (D, D)


def objective(weight: float = 0.5, **kwargs) -> Combined:
    torch.manual_seed(0)
    # No dropout anywhere, so two evaluations of the same inputs agree exactly.
    options = dict(TINY, decoder_dropout=0.0, noise_dropout=0.0, **kwargs)
    return Combined(D, PAD, vocab_size=VOCAB, denoising_weight=weight, **options).double()


def embeddings(batch: int = 4, m: int = 2, seq: int = 5):
    torch.manual_seed(1)
    h_a = torch.randn(batch, D, dtype=torch.float64, requires_grad=True)
    h_p = torch.randn(batch, D, dtype=torch.float64, requires_grad=True)
    h_n = torch.randn(batch, m, D, dtype=torch.float64)
    emb = torch.randn(batch, seq, D, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(1, VOCAB, (batch, seq))
    ids[0, -2:] = PAD  # a padded row: its pad positions are no target
    return h_a, h_p, h_n, emb, ids


def test_combined_loss_is_the_weighted_sum():
    assert combined_loss(torch.tensor(2.0), torch.tensor(3.0), 0.5).item() == 3.5
    assert combined_loss(torch.tensor(2.0), torch.tensor(3.0), 0.0).item() == 2.0


def test_loss_is_debcse_plus_weight_times_denoising_of_the_positive():
    combined = objective(weight=0.5)
    h_a, h_p, h_n, emb, ids = embeddings()
    out = combined.losses(h_a, h_p, h_n, emb, ids)
    head = combined.debcse.head
    expected_contrastive = debcse_loss(
        head(h_a), h_a, head(h_p), h_p, head(h_n), h_n, temperature=0.05
    )
    logits = combined.decoder(combined.projector(h_a), emb, target_padding_mask=ids == PAD)
    expected_denoising = denoising_loss(logits, ids, PAD)
    assert out["contrastive"].item() == pytest.approx(expected_contrastive.item(), rel=1e-12)
    assert out["denoising"].item() == pytest.approx(expected_denoising.item(), rel=1e-12)
    assert out["loss"].item() == pytest.approx(
        expected_contrastive.item() + 0.5 * expected_denoising.item(), rel=1e-12
    )
    # A fresh decoder guesses near uniformly over the vocabulary.
    assert abs(out["denoising"].item() - math.log(VOCAB)) < 1.5


def test_the_denoising_term_trains_the_anchor_vector_not_the_positive_embeddings():
    combined = objective(weight=1.0)
    h_a, h_p, h_n, emb, ids = embeddings()
    out = combined.losses(h_a, h_p, h_n, emb, ids)
    grad_with = torch.autograd.grad(out["loss"], h_a, retain_graph=True)[0]
    grad_contrastive = torch.autograd.grad(
        combined.debcse.contrastive(h_a, h_p, h_n), h_a, retain_graph=True
    )[0]
    assert not torch.allclose(grad_with, grad_contrastive)  # the decoder's memory is W h_a
    assert torch.autograd.grad(out["loss"], emb, allow_unused=True)[0] is None  # detached input


def test_weight_zero_is_debcse_exactly_and_leaves_the_decoder_out():
    combined = objective(weight=0.0)
    h_a, h_p, h_n, emb, ids = embeddings()
    out = combined.losses(h_a, h_p, h_n, emb, ids)
    assert out["denoising"].item() == 0.0
    assert out["loss"].item() == combined.debcse.contrastive(h_a, h_p, h_n).item()
    out["loss"].backward()
    assert all(p.grad is None for p in combined.decoder.parameters())
    with pytest.raises(ValueError, match="denoising_weight must be >= 0"):
        objective(weight=-1.0)


def test_pooling_is_debcses_choice():
    assert objective().pooling == "cls_before_pooler"  # no start pooling: DebCSE's default
    assert objective(start_pooling="mean").pooling == "mean"
    assert objective(start_pooling="mean", pooling="cls").pooling == "cls"
    with pytest.raises(ValueError, match="objective 'combined': pooling 'mask' is not one of"):
        objective(pooling="mask")


def tokenize(tokenizer, texts):
    return dict(tokenizer(texts, padding=True, return_tensors="pt"))


def test_a_tiny_bert_learns_both_terms(tiny_mlm, tiny_tokenizer, tiny_sentences):
    n = len(tiny_sentences)
    negatives = [[tiny_sentences[(i + 3) % n], tiny_sentences[(i + 5) % n]] for i in range(n)]
    flat = tokenize(tiny_tokenizer, [text for row in negatives for text in row])
    positives = [" ".join(s.split()[:1] + s.split()[2:]) for s in tiny_sentences]
    batch = {
        columns.ANCHOR_TEXT: tokenize(tiny_tokenizer, tiny_sentences),
        columns.POSITIVE_TEXTS: tokenize(tiny_tokenizer, positives),
        columns.NEGATIVE_TEXTS: {k: v.reshape(n, 2, -1) for k, v in flat.items()},
    }
    torch.manual_seed(0)
    combined = Combined(
        32, tiny_tokenizer.pad_token_id, output_head=tiny_mlm.cls, denoising_weight=1.0, **TINY
    )
    encoder = tiny_mlm.bert
    optimizer = torch.optim.AdamW(trainable_parameters(encoder, combined), lr=3e-3)
    parts = []
    for _ in range(30):
        out = combined(batch, encoder)
        optimizer.zero_grad()
        out["loss"].backward()
        optimizer.step()
        parts.append((out["contrastive"].item(), out["denoising"].item()))
    first, last = np.mean(parts[:3], axis=0), np.mean(parts[-3:], axis=0)
    assert np.isfinite(parts).all()
    assert last[0] < first[0] and last[1] < first[1], parts


def test_combined_trains_through_the_trainer_from_its_recipe(
    tmp_path, tiny_sentences, tiny_model_dir, sts_dir
):
    pairs = write_pairs(tmp_path / "pairs", pairs_rows(tiny_sentences), rows_per_shard=3)
    recipe = {"options": {**TINY, "denoising_weight": 0.5}}
    cfg = config(
        tmp_path,
        tiny_model_dir,
        sts_dir,
        "combined",
        pairs,
        max_steps=6,
        save_every=3,
        eval_every=3,
        recipes={"combined": recipe},
    )
    metrics = T.run(cfg, progress=False)["combined"]
    assert metrics["steps"] == 6 and metrics["best_step"] in (3, 6)
    history = json.loads((tmp_path / "models" / "combined" / "history.json").read_text())
    record = history["history"][-1]
    assert record["loss"] == pytest.approx(record["contrastive"] + 0.5 * record["denoising"])
    assert record["denoising"] > 0
    info = json.loads((tmp_path / "models" / "combined" / "model" / "pairforge.json").read_text())
    assert info["objective"] == "combined" and info["pooling"] == "cls_before_pooler"
    assert info["options"]["denoising_weight"] == 0.5
    with pytest.raises(ConfigError, match=r"train.recipes.combined.options: .*unknown option"):
        config(
            tmp_path,
            tiny_model_dir,
            sts_dir,
            "combined",
            pairs,
            recipes={"combined": {"options": {"weight": 1}}},
        )


def test_the_profiles_hold_a_combined_recipe_beside_its_parts():
    import yaml
    from pairforge.stages.profile import preset_path

    for profile in ("demo", "paper"):
        cfg = T.TrainConfig(**yaml.safe_load(preset_path(profile).read_text())["train"])
        combined, debcse = T.settings_for(cfg, "combined"), T.settings_for(cfg, "debcse")
        denosent = T.settings_for(cfg, "denosent")
        # DebCSE's training settings and options, DenoSent's decoder: a like-for-like comparison.
        assert (combined.batch_size, combined.lr, combined.eval_tasks) == (
            debcse.batch_size,
            debcse.lr,
            debcse.eval_tasks,
        )
        assert {k: combined.options[k] for k in debcse.options} == debcse.options
        for key in ("num_decoder_layers", "noise_dropout"):
            assert combined.options[key] == denosent.options[key], (profile, key)
        assert combined.options["denoising_weight"] == 1.0
