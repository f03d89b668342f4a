"""SimCSE with a back-translation as the positive (train/objectives/simcse_bt.py): the loss is
SimCSE's InfoNCE over (sentence, translation) pairs, and a short run on the tiny BERT pulls each
sentence towards its own translation more than towards the others'."""

from __future__ import annotations

import math

import pytest
import torch
from pairforge.train.objective_options import check_options
from pairforge.train.objectives import check_columns, columns, trainable_parameters
from pairforge.train.objectives.simcse import simcse_loss
from pairforge.train.objectives.simcse_bt import SimCSETranslation


def tokenize(tokenizer, texts):
    return dict(tokenizer(texts, padding=True, return_tensors="pt"))


def translations(sentences: list[str]) -> list[str]:
    """Stand-in round trips: each sentence with its words rotated by one (same words, new order)."""
    return [" ".join(s.split()[1:] + s.split()[:1]) for s in sentences]


def test_the_loss_is_infonce_over_the_sentence_and_its_translation(tiny_mlm, tiny_tokenizer,
                                                                  tiny_sentences):  # fmt: skip
    encoder = tiny_mlm.bert.eval()  # no dropout: the views are deterministic
    objective = SimCSETranslation(32, pooling="mean", temperature=0.1)
    text, positive = tiny_sentences[:6], translations(tiny_sentences[:6])
    batch = {columns.TEXT: tokenize(tiny_tokenizer, text),
             columns.POSITIVE_TEXT: tokenize(tiny_tokenizer, positive)}  # fmt: skip
    check_columns("simcse_bt", batch)
    with torch.no_grad():
        loss = objective(batch, encoder)["loss"]
        a = objective.embed(batch[columns.TEXT], encoder)
        b = objective.embed(batch[columns.POSITIVE_TEXT], encoder)
        assert loss.item() == pytest.approx(simcse_loss(a, b, 0.1).item(), rel=1e-6)
        # Not SimCSE's dropout views: with the translation replaced by the sentence itself, the
        # loss (eval mode: identical views) is another number.
        same = {columns.TEXT: batch[columns.TEXT], columns.POSITIVE_TEXT: batch[columns.TEXT]}
        assert objective(same, encoder)["loss"].item() != pytest.approx(loss.item(), rel=1e-3)
    with pytest.raises(ValueError, match="positive_text"):
        check_columns("simcse_bt", {columns.TEXT: batch[columns.TEXT]})


def test_options_are_simcses():
    assert check_options("simcse_bt", {"temperature": 0.05, "pooling": "mean"}, "k").pooling == (
        "mean"
    )
    with pytest.raises(Exception, match="unknown option 'negative_space'"):
        check_options("simcse_bt", {"negative_space": "raw"}, "k")
    objective = SimCSETranslation(32, start_pooling="mean")
    assert objective.pooling == "mean" and isinstance(objective.pooler, torch.nn.Identity)


def test_training_on_a_tiny_bert_pulls_each_sentence_to_its_translation(
    tiny_mlm, tiny_tokenizer, tiny_sentences
):
    torch.manual_seed(0)
    n = len(tiny_sentences)
    batch = {columns.TEXT: tokenize(tiny_tokenizer, tiny_sentences),
             columns.POSITIVE_TEXT: tokenize(tiny_tokenizer, translations(tiny_sentences))}  # fmt: skip
    objective = SimCSETranslation(32, pooling="mean")
    encoder = tiny_mlm.bert.train()
    optimizer = torch.optim.AdamW(trainable_parameters(encoder, objective), lr=3e-3)

    def margin() -> float:
        """Mean cosine of each sentence to its own translation minus to the others'."""
        encoder.eval()
        with torch.no_grad():
            a = encoder(**batch[columns.TEXT]).last_hidden_state.mean(1)
            b = encoder(**batch[columns.POSITIVE_TEXT]).last_hidden_state.mean(1)
        encoder.train()
        cos = torch.nn.functional.normalize(a, dim=-1) @ torch.nn.functional.normalize(b, dim=-1).T
        own = cos.diagonal().mean().item()
        return own - (cos.sum().item() - cos.diagonal().sum().item()) / (n * (n - 1))

    before = margin()
    losses = []
    for _ in range(30):
        loss = objective(batch, encoder)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)
    assert max(losses[-3:]) < losses[0] / 10, losses
    assert margin() > before + 0.1
