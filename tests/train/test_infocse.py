"""InfoCSE: masking, the MLM loss by hand, where gradients go (the frozen lower layers stay put,
the encoder is reached only through [CLS]), sourcing of the auxiliary network, and a short run."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from pairforge.pipeline.plumbing.errors import ConfigError
from pairforge.pipeline.science.models import head_is_untrained, output_projection
from pairforge.train.infocse_aux import (
    AuxiliaryMLM,
    load_auxiliary,
    mask_tokens,
    masked_lm_loss,
    save_auxiliary,
)
from pairforge.train.objectives import check_columns, columns, get_objective, trainable_parameters
from pairforge.train.objectives.base import BuildContext
from pairforge.train.objectives.infocse import InfoCSE, infocse_loss
from pairforge.train.objectives.simcse import simcse_loss
from torch import nn

SPECIALS = [0, 1, 2, 3]  # pad, unk, cls, sep
MASK_ID = 4


def trained_head(model: nn.Module) -> nn.Module:
    """The tiny model's MLM head made to look trained (a fresh one is detected as untrained)."""
    with torch.no_grad():
        model.cls.predictions.transform.LayerNorm.weight.mul_(1.5)
    return model.cls


def tokenize(tokenizer, texts: list[str]) -> dict[str, torch.Tensor]:
    return dict(tokenizer(texts, padding=True, return_tensors="pt"))


def infocse(model, tokenizer, **options) -> InfoCSE:
    options.setdefault("lower_layers", 1)
    return InfoCSE(32, tokenizer, encoder=model.bert, mlm_head=trained_head(model), **options)


# --- masking and the MLM loss -------------------------------------------------------------------


def test_mask_tokens_never_touches_special_tokens_or_padding():
    ids = torch.tensor([[2, 10, 11, 12, 3, 0, 0], [2, 13, 14, 15, 16, 17, 3]])
    attention = (ids != 0).long()
    generator = torch.Generator().manual_seed(0)
    masked, labels = mask_tokens(ids, attention, SPECIALS, MASK_ID, 30, 1.0, generator)
    real = attention.bool() & ~torch.isin(ids, torch.tensor(SPECIALS))
    assert torch.equal(labels[real], ids[real])  # rate 1: every real token is a target
    assert (labels[~real] == -100).all()
    assert torch.equal(masked[~real], ids[~real])


def test_mask_tokens_rate_and_80_10_10_split():
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 30_000, (200, 100), generator=generator)
    ids[:, 0], ids[:, -1] = 2, 3
    attention = torch.ones_like(ids)
    masked, labels = mask_tokens(ids, attention, SPECIALS, MASK_ID, 30_000, 0.4, generator)
    picked = labels != -100
    assert picked.float().mean().item() == pytest.approx(0.4 * 98 / 100, abs=0.01)
    to_mask = (masked == MASK_ID) & picked
    kept = (masked == ids) & picked
    changed = picked & ~to_mask & ~kept
    n = picked.sum().item()
    assert to_mask.sum().item() / n == pytest.approx(0.8, abs=0.01)
    assert kept.sum().item() / n == pytest.approx(0.1, abs=0.01)
    assert changed.sum().item() / n == pytest.approx(0.1, abs=0.01)
    again = mask_tokens(
        ids, attention, SPECIALS, MASK_ID, 30_000, 0.4, torch.Generator().manual_seed(1)
    )
    assert not torch.equal(again[1], labels)  # a different stream of draws, not a fixed pattern


def test_masked_lm_loss_matches_hand_computed_value():
    states = torch.tensor([[[9.0, 9.0, 9.0], [0.0, 0.0, 0.0], [2.0, 0.0, 0.0]]])
    labels = torch.tensor([[-100, 1, 0]])
    loss, accuracy = masked_lm_loss(nn.Identity(), states, labels)
    expected = (math.log(3) + -math.log(math.exp(2) / (math.exp(2) + 2))) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert accuracy.item() == pytest.approx(0.5)  # position 1 is a tie (argmax 0), position 2 right


def test_masked_lm_loss_without_targets_is_zero_and_keeps_the_graph():
    states = torch.randn(2, 3, 4, requires_grad=True)
    loss, _ = masked_lm_loss(nn.Linear(4, 5), states, torch.full((2, 3), -100))
    assert loss.item() == 0.0
    loss.backward()
    assert states.grad is not None


def test_infocse_loss_is_contrastive_plus_weighted_mlm():
    assert infocse_loss(torch.tensor(0.5), torch.tensor(4.0), 1e-5).item() == pytest.approx(
        0.5 + 4e-5
    )


# --- the objective ------------------------------------------------------------------------------


def test_forward_parts_add_up_and_contrastive_is_simcse(tiny_mlm, tiny_tokenizer, tiny_sentences):
    tiny_mlm.eval()
    objective = infocse(tiny_mlm, tiny_tokenizer, mlm_weight=0.5, temperature=0.1).eval()
    assert objective.pooling == "cls_before_pooler"
    features = tokenize(tiny_tokenizer, tiny_sentences[:4])
    out = objective({columns.TEXT: features}, tiny_mlm.bert)
    cls = tiny_mlm.bert(**features).last_hidden_state[:, 0]
    z = objective.pooler(cls)
    assert out["contrastive"].item() == pytest.approx(simcse_loss(z, z, 0.1).item(), rel=1e-5)
    assert out["mlm"].item() > 0
    assert out["loss"].item() == pytest.approx(
        out["contrastive"].item() + 0.5 * out["mlm"].item(), rel=1e-6
    )


def test_mlm_gradient_reaches_the_encoder_only_through_cls(
    tiny_mlm, tiny_tokenizer, tiny_sentences
):
    objective = infocse(tiny_mlm, tiny_tokenizer, mlm_weight=1.0)
    encoder = tiny_mlm.bert
    features = tokenize(tiny_tokenizer, tiny_sentences[:4])
    torch.manual_seed(0)
    masked, labels = mask_tokens(
        features["input_ids"], features["attention_mask"], tiny_tokenizer.all_special_ids,
        tiny_tokenizer.mask_token_id, len(tiny_tokenizer), 0.4,
    )  # fmt: skip
    assert (labels != -100).any()
    hidden = encoder(**features).last_hidden_state
    hidden.retain_grad()
    loss, _ = objective.auxiliary(hidden[:, 0], masked, features["attention_mask"], labels)
    loss.backward()
    assert hidden.grad[:, 0].abs().sum() > 0
    assert hidden.grad[:, 1:].abs().sum() == 0
    # With [CLS] cut off, no encoder parameter gets anything: no shared or tied weights.
    encoder.zero_grad(set_to_none=True)
    hidden = encoder(**features).last_hidden_state
    loss, _ = objective.auxiliary(hidden[:, 0].detach(), masked, features["attention_mask"], labels)
    loss.backward()
    assert all(p.grad is None for p in encoder.parameters())
    assert all(p.grad is None for p in objective.auxiliary.lower.parameters())
    assert all(p.grad is not None for p in objective.auxiliary.head_layers.parameters())


def test_frozen_lower_layers_are_a_copy_that_training_leaves_unchanged(
    tiny_mlm, tiny_tokenizer, tiny_sentences
):
    torch.manual_seed(0)
    encoder = tiny_mlm.bert
    objective = infocse(tiny_mlm, tiny_tokenizer, mlm_weight=1.0)
    aux = objective.auxiliary
    encoder_ids = {id(p) for p in encoder.parameters()}
    assert not encoder_ids & {id(p) for p in objective.parameters()}
    frozen = {
        name: p.detach().clone()
        for name, p in aux.named_parameters()
        if "lower" in name or "embeddings" in name
    }
    assert frozen and all(
        not p.requires_grad for p in [*aux.lower.parameters(), *aux.embeddings.parameters()]
    )
    head_before = [p.detach().clone() for p in aux.head_layers.parameters()]
    lower_before = [p.detach().clone() for p in encoder.encoder.layer[0].parameters()]
    optimizer = torch.optim.AdamW(
        trainable_parameters(encoder, objective), lr=1e-2, weight_decay=0.1
    )
    batch = {columns.TEXT: tokenize(tiny_tokenizer, tiny_sentences)}
    for _ in range(3):
        loss = objective(batch, encoder)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = dict(aux.named_parameters())
    assert all(torch.equal(frozen[name], after[name]) for name in frozen)
    changed = [
        not torch.equal(a, b)
        for a, b in zip(head_before, aux.head_layers.parameters(), strict=True)
    ]
    assert all(changed)
    moved = [
        not torch.equal(a, b)
        for a, b in zip(lower_before, encoder.encoder.layer[0].parameters(), strict=True)
    ]
    assert any(moved)  # the encoder's own lower layer trains; the copy does not follow


def test_copied_network_and_reports(tiny_mlm, tiny_tokenizer, caplog):
    encoder = tiny_mlm.bert
    with caplog.at_level(logging.WARNING, logger="pairforge"):
        objective = InfoCSE(32, tiny_tokenizer, encoder=encoder, mlm_head=None)
    report = objective.init_report
    assert report["mlm_head"] == "initialised" and report["mlm_head_initialised"]
    assert not report["aux_pretrained"]
    assert report["lower_layers"] == 1  # half of the tiny model's 2 layers
    assert "no MLM head" in caplog.text and "not pre-trained" in caplog.text
    assert "fewer than the paper's 6" in caplog.text
    aux = objective.auxiliary
    decoder = output_projection(aux.mlm_head)
    words = encoder.embeddings.word_embeddings.weight
    assert torch.equal(decoder.weight, words) and decoder.weight is not words
    assert torch.equal(
        aux.lower[0].output.dense.weight, encoder.encoder.layer[0].output.dense.weight
    )
    assert torch.equal(
        aux.head_layers[1].output.dense.weight, encoder.encoder.layer[1].output.dense.weight
    )
    # A head still at its initial values counts as no head; a trained one is copied.
    assert head_is_untrained(tiny_mlm.cls)
    assert (
        InfoCSE(32, tiny_tokenizer, encoder=encoder, mlm_head=tiny_mlm.cls).init_report["mlm_head"]
        == "initialised"
    )
    head = trained_head(tiny_mlm)
    kept = InfoCSE(32, tiny_tokenizer, encoder=encoder, mlm_head=head, lower_layers=2)
    assert kept.init_report["mlm_head"] == "encoder" and kept.init_report["lower_layers"] == 2
    assert torch.equal(
        output_projection(kept.auxiliary.mlm_head).weight, output_projection(head).weight
    )
    with pytest.raises(ConfigError, match="lower_layers=3"):
        InfoCSE(32, tiny_tokenizer, encoder=encoder, lower_layers=3)
    plain = InfoCSE(32, tiny_tokenizer, mlm_weight=0)
    assert plain.auxiliary is None


def test_pretrained_network_round_trip_and_checks(tiny_mlm, tiny_tokenizer, tmp_path):
    aux = AuxiliaryMLM.from_encoder(tiny_mlm.bert, 1, 2, trained_head(tiny_mlm))
    save_auxiliary(aux, tmp_path / "aux", {"mlm_head_initialised": False})
    loaded, meta = load_auxiliary(tmp_path / "aux", tiny_mlm.config)
    assert meta["lower_layers"] == 1 and meta["head_layers"] == 2
    for (name, a), (_, b) in zip(
        aux.state_dict().items(), loaded.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    assert all(not p.requires_grad for p in loaded.lower.parameters())
    objective = InfoCSE(32, tiny_tokenizer, config=tiny_mlm.config, aux_path=str(tmp_path / "aux"))
    assert objective.init_report["aux_pretrained"] and objective.init_report["warnings"] == []
    with pytest.raises(ConfigError, match="pre-trained with 1"):
        InfoCSE(
            32,
            tiny_tokenizer,
            config=tiny_mlm.config,
            aux_path=str(tmp_path / "aux"),
            lower_layers=2,
        )
    other = type(tiny_mlm.config)(**{**tiny_mlm.config.to_dict(), "hidden_size": 16})
    with pytest.raises(ConfigError, match="hidden_size=32"):
        load_auxiliary(tmp_path / "aux", other)
    with pytest.raises(ConfigError, match="pairforge pretrain"):
        load_auxiliary(tmp_path / "missing", tiny_mlm.config)


def test_built_from_the_trainer_context(tiny_mlm, tiny_tokenizer):
    cls = get_objective("infocse")
    assert cls is InfoCSE and cls.wants_mlm_head()
    context = BuildContext(encoder=tiny_mlm.bert, tokenizer=tiny_tokenizer, mlm_head=tiny_mlm.cls)
    objective = cls.build(context, {"mask_rate": 0.3})
    assert objective.mask_rate == 0.3 and objective.mlm_weight == 1e-5
    assert objective.init_report["mlm_head"] == "initialised"  # the tiny head is untrained


# --- training -----------------------------------------------------------------------------------


def test_training_on_a_tiny_bert_lowers_both_losses(tiny_mlm, tiny_tokenizer, tiny_sentences):
    torch.manual_seed(0)
    encoder = tiny_mlm.bert
    # λ = 1 so that the auxiliary loss visibly trains in a few steps; the default 1e-5 leaves it
    # a whisper next to the contrastive loss, as in the paper.
    objective = infocse(tiny_mlm, tiny_tokenizer, mlm_weight=1.0, mask_rate=0.4)
    batch = {columns.TEXT: tokenize(tiny_tokenizer, tiny_sentences)}
    check_columns("infocse", batch)
    optimizer = torch.optim.AdamW(trainable_parameters(encoder, objective), lr=3e-3)
    parts = []
    for _ in range(20):
        out = objective(batch, encoder)
        optimizer.zero_grad()
        out["loss"].backward()
        optimizer.step()
        parts.append((out["contrastive"].item(), out["mlm"].item()))
    first, last = parts[:5], parts[-5:]
    for k in (0, 1):
        assert all(math.isfinite(p[k]) for p in parts)
        assert sum(p[k] for p in last) / 5 < sum(p[k] for p in first) / 5, parts
