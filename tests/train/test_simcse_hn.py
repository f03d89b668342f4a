"""SimCSE with mined hard negatives (train/objectives/simcse_hn.py): the loss by hand, SimCSE's
exactly without negatives, and a short run on the tiny BERT that separates mined negatives."""

from __future__ import annotations

import math

import pytest
import torch
from pairforge.train.objective_options import check_options
from pairforge.train.objectives import check_columns, columns, trainable_parameters
from pairforge.train.objectives.simcse import simcse_loss
from pairforge.train.objectives.simcse_hn import SimCSEHardNegatives, simcse_hn_loss

R = math.sqrt(2.0)  # cos = 1/√2 divided by τ = 0.5


def t(values: list) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_loss_by_hand_counts_every_hard_negative_of_the_batch():
    z1 = t([[1, 0], [0, 1]])
    z2 = t([[1, 0], [0, 1]])
    # One hard negative per row: row 0's is at 45 degrees, row 1's opposite to row 1.
    hard = t([[[1, 1]], [[0, -1]]])
    # Row 0: positive cos 1, in-batch cos 0, hard cos 1/√2 (own) and 0 (row 1's); τ = 0.5.
    row0 = -math.log(math.exp(2) / (math.exp(2) + 1 + math.exp(R) + 1))
    # Row 1: positive 1, in-batch 0, row 0's hard negative 1/√2, its own -1.
    row1 = -math.log(math.exp(2) / (math.exp(2) + 1 + math.exp(R) + math.exp(-2)))
    loss = simcse_hn_loss(z1, z2, hard, temperature=0.5)
    assert loss.item() == pytest.approx((row0 + row1) / 2, rel=1e-12)


def test_without_hard_negatives_it_is_simcse():
    torch.manual_seed(0)
    z1, z2 = torch.randn(5, 8, dtype=torch.float64), torch.randn(5, 8, dtype=torch.float64)
    expected = simcse_loss(z1, z2, 0.05)
    assert simcse_hn_loss(z1, z2, None, 0.05).item() == pytest.approx(expected.item(), rel=1e-12)
    empty = torch.empty(5, 0, 8, dtype=torch.float64)
    assert simcse_hn_loss(z1, z2, empty, 0.05).item() == pytest.approx(expected.item(), rel=1e-12)
    # A hard negative can only add to the denominator.
    hard = torch.randn(5, 2, 8, dtype=torch.float64)
    assert simcse_hn_loss(z1, z2, hard, 0.05).item() > expected.item()


def test_options_and_pooling():
    assert check_options("simcse_hn", {"temperature": 0.05, "pooling": "mean"}, "k").pooling == (
        "mean"
    )
    with pytest.raises(Exception, match="unknown option 'positive_in_denominator'"):
        check_options("simcse_hn", {"positive_in_denominator": True}, "k")
    assert SimCSEHardNegatives(32, start_pooling="mean").pooling == "mean"
    objective = SimCSEHardNegatives(32, pooling="cls_before_pooler", start_pooling="mean")
    assert objective.pooling == "cls_before_pooler"
    assert (
        isinstance(objective.pooler, torch.nn.Module)
        and sum(p.numel() for p in objective.pooler.parameters()) == 32 * 32 + 32
    )  # SimCSE's training MLP over [CLS]


def test_training_on_a_tiny_bert_pushes_the_mined_negatives_away(
    tiny_mlm, tiny_tokenizer, tiny_sentences
):
    torch.manual_seed(0)
    n = len(tiny_sentences)
    # Each row's negatives: two other sentences of the set.
    negatives = [[tiny_sentences[(i + 3) % n], tiny_sentences[(i + 5) % n]] for i in range(n)]

    def tokenize(texts):
        return dict(tiny_tokenizer(texts, padding=True, return_tensors="pt"))

    flat = tokenize([text for row in negatives for text in row])
    batch = {
        columns.TEXT: tokenize(tiny_sentences),
        columns.NEGATIVE_TEXTS: {k: v.reshape(n, 2, -1) for k, v in flat.items()},
    }
    check_columns("simcse_hn", batch)
    objective = SimCSEHardNegatives(32, pooling="mean")
    encoder = tiny_mlm.bert
    optimizer = torch.optim.AdamW(trainable_parameters(encoder, objective), lr=3e-3)

    def negative_cos() -> float:
        encoder.eval()
        with torch.no_grad():
            a = encoder(**batch[columns.TEXT]).last_hidden_state.mean(1)
            b = encoder(**flat).last_hidden_state.mean(1).reshape(n, 2, -1)
        encoder.train()
        return torch.cosine_similarity(a.unsqueeze(1), b, dim=-1).mean().item()

    before = negative_cos()
    losses = []
    for _ in range(30):
        loss = objective(batch, encoder)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3, losses
    # Below the uniform guess over the n views and 2n hard negatives.
    assert max(losses[-3:]) < math.log(3 * n), losses
    assert negative_cos() < before - 0.05
