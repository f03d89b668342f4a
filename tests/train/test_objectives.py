"""Tests of the training objectives: hand-computed losses, gradient flow, and short training runs.

Expected loss values are written out with ``math`` on the listed numbers; the inputs are chosen
so that every cosine is 0, ±1 or ±1/√2.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from pairforge.pipeline.science.models.pooling import pool
from pairforge.train.objectives import (
    COLUMNS,
    OBJECTIVES,
    check_columns,
    columns,
    get_objective,
    required_columns,
    trainable_parameters,
)
from pairforge.train.objectives.bsl import (
    BSL,
    BSLPredictor,
    bsl_loss,
    ema_update,
    make_target,
    negative_cosine,
)
from pairforge.train.objectives.combined import Combined
from pairforge.train.objectives.cotbert import CoTBERT
from pairforge.train.objectives.debcse import DebCSE, DebCSEHead, debcse_loss
from pairforge.train.objectives.denosent import (
    DenoSent,
    DenoSentDecoder,
    build_prompt_inputs,
    denoising_loss,
    denosent_loss,
    mask_pool,
    mask_positions,
)
from pairforge.train.objectives.infocse import InfoCSE
from pairforge.train.objectives.simcse import SimCSE, SimCSEPooler, simcse_loss
from pairforge.train.objectives.simcse_bt import SimCSETranslation
from pairforge.train.objectives.simcse_hn import SimCSEHardNegatives
from torch import nn

R = math.sqrt(2.0)  # cos = 1/√2 divided by τ = 0.5


def t(values: list) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


# --- SimCSE -------------------------------------------------------------------------------------


def test_simcse_loss_matches_hand_computed_value():
    z1 = t([[1, 0], [0, 2]])
    z2 = t([[3, 0], [1, 1]])
    # cos rows: [1, 1/√2] and [0, 1/√2]; τ = 0.5 doubles them.
    row0 = -math.log(math.exp(2) / (math.exp(2) + math.exp(R)))
    row1 = -math.log(math.exp(R) / (math.exp(0) + math.exp(R)))
    loss = simcse_loss(z1, z2, temperature=0.5)
    assert loss.item() == pytest.approx((row0 + row1) / 2, rel=1e-12)


def test_simcse_loss_is_small_when_views_agree_and_large_when_swapped():
    z = torch.eye(4, dtype=torch.float64)
    assert simcse_loss(z, z).item() < 1e-6
    assert simcse_loss(z, z.flip(0)).item() > 10


def test_simcse_pooler_is_linear_then_tanh():
    pooler = SimCSEPooler(3)
    x = torch.randn(2, 3)
    assert torch.allclose(pooler(x), torch.tanh(pooler.dense(x)))


# --- DebCSE -------------------------------------------------------------------------------------

# Two anchors, d = 2, m = 1 hard negative each. z (normalised) and h (raw) differ on purpose, so
# a term reading the wrong one gives a different value.
Z_A = [[1, 0], [0, 1]]
H_A = [[2, 2], [0, 3]]
Z_P = [[0, 1], [1, 1]]
H_P = [[1, 0], [-1, 1]]
Z_N = [[[1, -1]], [[0, -1]]]
H_N = [[[1, 0]], [[1, 1]]]


def debcse(**kwargs) -> float:
    args = dict(
        z_anchor=t(Z_A),
        h_anchor=t(H_A),
        z_positive=t(Z_P),
        h_positive=t(H_P),
        z_negatives=t(Z_N),
        h_negatives=t(H_N),
        temperature=0.5,
    )
    args.update(kwargs)
    return debcse_loss(**args).item()


def test_debcse_loss_default_matches_hand_computed_value():
    e = math.exp
    # eq. 8 (query z_a, positive h_p, in-batch z_p of the other row, hard z_n), per anchor:
    eq8 = [-2 + math.log(e(2) + e(R) + e(R)), -R + math.log(e(R) + e(2) + e(-2))]
    # eq. 9 (query z_p, positive h_a, in-batch z_a of the other row, hard z_n):
    eq9 = [-R + math.log(e(R) + e(2) + e(-R)), -R + math.log(e(R) + e(R) + e(-R))]
    expected = (sum(eq8) + sum(eq9)) / 2
    assert debcse() == pytest.approx(expected, rel=1e-12)


def test_debcse_loss_as_printed_drops_the_positive_from_the_denominator():
    e = math.exp
    eq8 = [-2 + math.log(e(R) + e(R)), -R + math.log(e(2) + e(-2))]
    eq9 = [-R + math.log(e(2) + e(-R)), -R + math.log(e(R) + e(-R))]
    expected = (sum(eq8) + sum(eq9)) / 2
    printed = debcse(positive_in_denominator=False)
    assert printed == pytest.approx(expected, rel=1e-12)
    # log(e^p + N) > log(N): the standard form is always the larger.
    assert printed < debcse(positive_in_denominator=True)


def test_debcse_loss_raw_negatives_read_h_not_z():
    e = math.exp
    eq8 = [-2 + math.log(e(2) + e(-R) + e(2)), -R + math.log(e(R) + e(0) + e(R))]
    eq9 = [-R + math.log(e(R) + e(2) + e(0)), -R + math.log(e(R) + e(2) + e(2))]
    expected = (sum(eq8) + sum(eq9)) / 2
    assert debcse(negative_space="raw") == pytest.approx(expected, rel=1e-12)


def test_debcse_hard_negatives_closer_to_the_anchor_raise_the_loss():
    torch.manual_seed(0)
    z_a, h_a, z_p, h_p = (torch.randn(4, 8, dtype=torch.float64) for _ in range(4))
    close = (z_a + 0.05 * torch.randn_like(z_a)).unsqueeze(1)  # (4, 1, 8)
    far = (-z_a).unsqueeze(1)
    for in_denominator in (True, False):
        loss_close = debcse_loss(
            z_a, h_a, z_p, h_p, close, temperature=0.5, positive_in_denominator=in_denominator
        )
        loss_far = debcse_loss(
            z_a, h_a, z_p, h_p, far, temperature=0.5, positive_in_denominator=in_denominator
        )
        assert loss_close > loss_far + 0.1


def test_debcse_without_hard_negatives():
    e = math.exp
    expected = (
        (-2 + math.log(e(2) + e(R)))
        + (-R + math.log(e(R) + e(2)))
        + (-R + math.log(e(R) + e(2)))
        + (-R + math.log(e(R) + e(R)))
    ) / 2
    assert debcse(z_negatives=None, h_negatives=None) == pytest.approx(expected, rel=1e-12)
    empty = torch.zeros(2, 0, 2, dtype=torch.float64)
    assert debcse(z_negatives=empty, h_negatives=empty) == pytest.approx(expected, rel=1e-12)


def test_debcse_raw_without_hard_negatives_is_two_simcse_terms():
    torch.manual_seed(1)
    z_a, h_a, z_p, h_p = (torch.randn(5, 6, dtype=torch.float64) for _ in range(4))
    loss = debcse_loss(z_a, h_a, z_p, h_p, negative_space="raw")
    expected = simcse_loss(z_a, h_p) + simcse_loss(z_p, h_a)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-10)


def test_debcse_printed_form_without_any_negative_is_rejected():
    one = t([[1, 0]])
    with pytest.raises(ValueError, match="needs negatives"):
        debcse_loss(one, one, one, one, positive_in_denominator=False)
    with pytest.raises(ValueError, match="negative_space"):
        debcse_loss(one, one, one, one, negative_space="cosine")


def test_debcse_head_batch_normalises_each_feature():
    head = DebCSEHead(3)
    h = torch.randn(6, 3) * 5 + 7
    z = head(h)
    assert torch.allclose(z.mean(0), torch.zeros(3), atol=1e-5)
    assert torch.allclose(z.var(0, unbiased=False), torch.ones(3), atol=1e-3)
    negatives = torch.randn(4, 2, 3)
    assert head(negatives).shape == (4, 2, 3)


def test_debcse_objective_runs_with_zero_hard_negatives(tiny_mlm, tiny_tokenizer, tiny_sentences):
    tiny_mlm.eval()
    objective = DebCSE(32, negative_space="raw").eval()
    batch = debcse_batch(tiny_tokenizer, tiny_sentences[:4])
    with_two = objective(batch, tiny_mlm.bert)["loss"]
    negatives = batch[columns.NEGATIVE_TEXTS]
    batch[columns.NEGATIVE_TEXTS] = {key: value[:, :0] for key, value in negatives.items()}
    with_none = objective(batch, tiny_mlm.bert)["loss"]
    h = [
        tiny_mlm.bert(**batch[column]).last_hidden_state[:, 0]
        for column in (columns.ANCHOR_TEXT, columns.POSITIVE_TEXTS)
    ]
    z = [objective.head(vectors) for vectors in h]
    expected = simcse_loss(z[0], h[1]) + simcse_loss(z[1], h[0])
    assert with_none.item() == pytest.approx(expected.item(), rel=1e-5)
    assert with_two.item() > with_none.item()


# --- DenoSent -----------------------------------------------------------------------------------


def test_mask_pool_picks_the_vector_at_the_mask():
    hidden = torch.arange(12, dtype=torch.float32).reshape(2, 3, 2)
    # row 0, position 2 -> [4, 5]; row 1, position 0 -> [6, 7]
    assert mask_pool(hidden, torch.tensor([2, 0])).tolist() == [[4.0, 5.0], [6.0, 7.0]]


def test_mask_positions_takes_the_last_mask_and_rejects_rows_without_one():
    ids = torch.tensor([[2, 9, 4, 3, 0], [2, 4, 9, 4, 3]])
    assert mask_positions(ids, mask_token_id=4).tolist() == [2, 3]
    with pytest.raises(ValueError, match="mask token"):
        mask_positions(torch.tensor([[2, 9, 3]]), mask_token_id=4)


def test_build_prompt_inputs_wraps_the_sentence_around_one_mask(tiny_tokenizer):
    inputs = build_prompt_inputs(tiny_tokenizer, ["The cat sat.", "a dog ran in the park ."])
    tokens = tiny_tokenizer.convert_ids_to_tokens(inputs["input_ids"][0])
    assert tokens == [
        "[CLS]", '"', "the", "cat", "sat", ".", '"', "means", "[MASK]", ".", "[SEP]",
        "[PAD]", "[PAD]", "[PAD]",
    ]  # fmt: skip
    assert inputs["attention_mask"][0].tolist() == [1] * 11 + [0] * 3
    mask_id = tiny_tokenizer.mask_token_id
    assert mask_positions(inputs["input_ids"], mask_id).tolist() == [8, 11]


def test_build_prompt_inputs_truncates_the_sentence_to_32_tokens(tiny_tokenizer):
    words = ["one", "two", "three", "four", "five"] * 8  # 40 tokens
    inputs = build_prompt_inputs(tiny_tokenizer, [" ".join(words)])
    tokens = tiny_tokenizer.convert_ids_to_tokens(inputs["input_ids"][0])
    assert tokens[:2] == ["[CLS]", '"']
    assert tokens[2:34] == words[:32]
    assert tokens[34:] == ['"', "means", "[MASK]", ".", "[SEP]"]
    short = build_prompt_inputs(tiny_tokenizer, [" ".join(words)], max_sentence_tokens=3)
    assert tiny_tokenizer.convert_ids_to_tokens(short["input_ids"][0])[2:6] == [
        "one", "two", "three", '"',
    ]  # fmt: skip


def test_denoising_loss_matches_hand_computed_value_and_ignores_padding():
    logits = t([[[0, 0, 0], [2, 0, 0], [5, -5, 9]]])  # (1, 3, vocab 3)
    targets = torch.tensor([[1, 0, 2]])  # the last target is the pad id: ignored
    expected = (math.log(3) + -math.log(math.exp(2) / (math.exp(2) + 2))) / 2
    loss = denoising_loss(logits, targets, pad_token_id=2)
    assert loss.item() == pytest.approx(expected, rel=1e-12)


def test_denosent_loss_weights():
    cl, dn = torch.tensor(0.5), torch.tensor(2.0)
    assert denosent_loss(cl, dn).item() == pytest.approx(5 * 0.5 + 7 * 2.0)
    assert denosent_loss(cl, dn, 1.0, 1.0).item() == pytest.approx(2.5)


def test_denosent_contrastive_is_simcse_on_the_projected_vectors(
    tiny_mlm, tiny_tokenizer, tiny_sentences
):
    torch.manual_seed(0)
    objective = DenoSent(
        32,
        tiny_tokenizer.mask_token_id,
        tiny_tokenizer.pad_token_id,
        vocab_size=len(tiny_tokenizer),
        num_decoder_layers=1,
        temperature=0.03,
        contrastive_weight=1.0,
        denoising_weight=0.0,
    )
    tiny_mlm.eval()
    batch = denosent_batch(tiny_tokenizer, tiny_sentences[:4])
    out = objective(batch, tiny_mlm.bert)
    vectors = []
    for column in (columns.TEXT, columns.POSITIVE_TEXT):
        features = batch[column]
        hidden = tiny_mlm.bert(**features).last_hidden_state
        pooled = mask_pool(hidden, mask_positions(features["input_ids"], objective.mask_token_id))
        vectors.append(objective.projector(pooled))
    expected = simcse_loss(*vectors, temperature=0.03)
    assert out["loss"].item() == pytest.approx(expected.item(), rel=1e-5)
    assert out["denoising"].item() == 0.0


def test_decoder_has_no_causal_mask():
    torch.manual_seed(0)
    decoder = DenoSentDecoder(8, vocab_size=11, num_layers=2, dim_feedforward=16).eval()
    memory = torch.randn(1, 8)
    target = torch.randn(1, 4, 8)
    changed = target.clone()
    changed[0, 3] += 1.0
    # With a causal mask the first position could not see the last one.
    assert not torch.allclose(decoder(memory, target)[0, 0], decoder(memory, changed)[0, 0])


def test_decoder_layers_are_initialised_independently():
    decoder = DenoSentDecoder(8, vocab_size=11, num_layers=3, dim_feedforward=16)
    layers = decoder.layers.layers
    assert len(layers) == 3
    assert layers[0].self_attn.num_heads == 1
    assert not torch.equal(layers[0].linear1.weight, layers[1].linear1.weight)
    assert not torch.equal(layers[1].self_attn.in_proj_weight, layers[2].self_attn.in_proj_weight)


def test_decoder_input_is_detached_and_memory_gets_the_gradient():
    torch.manual_seed(0)
    head = nn.Linear(8, 11)
    decoder = DenoSentDecoder(8, output_head=head, num_layers=2, dim_feedforward=16)
    assert decoder.output_head is head
    memory = torch.randn(2, 8, requires_grad=True)
    target = torch.randn(2, 5, 8, requires_grad=True)
    padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    logits = decoder(memory, target, padding)
    assert logits.shape == (2, 5, 11)
    denoising_loss(logits, torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 0, 0]]), 0).backward()
    assert target.grad is None
    assert memory.grad is not None and memory.grad.abs().sum() > 0


def test_denosent_decoder_path_sends_no_gradient_to_the_target_embeddings(tiny_mlm, tiny_tokenizer):
    # Denoising only, untied output layer: the word embeddings can get gradient only through the
    # sentence vector (anchor tokens) or, were it not detached, through the decoder input
    # (positive tokens). The two sentences share no word.
    anchor, positive = "the cat sat on the mat .", "a dog ran in a park ."
    torch.manual_seed(0)
    objective = DenoSent(
        32,
        tiny_tokenizer.mask_token_id,
        tiny_tokenizer.pad_token_id,
        vocab_size=len(tiny_tokenizer),
        num_decoder_layers=2,
        decoder_feedforward=64,
        contrastive_weight=0.0,
        denoising_weight=1.0,
    )
    encoder = tiny_mlm.bert
    objective(denosent_batch(tiny_tokenizer, [anchor], [positive]), encoder)["loss"].backward()
    grad = encoder.embeddings.word_embeddings.weight.grad
    anchor_only = tiny_tokenizer.convert_tokens_to_ids(["cat", "sat", "mat"])
    positive_only = tiny_tokenizer.convert_tokens_to_ids(["dog", "ran", "park"])
    assert (grad[anchor_only].abs().sum(dim=1) > 0).all()
    assert grad[positive_only].abs().sum() == 0


def test_denosent_with_the_mlm_head_as_output_layer(tiny_mlm, tiny_tokenizer):
    objective = DenoSent(
        32,
        tiny_tokenizer.mask_token_id,
        tiny_tokenizer.pad_token_id,
        output_head=tiny_mlm.cls,
        num_decoder_layers=1,
    )
    assert objective.decoder.output_head is tiny_mlm.cls
    shared = tiny_mlm.cls.predictions.decoder.weight
    params = list(trainable_parameters(tiny_mlm.bert, objective))
    assert sum(p is shared for p in params) == 1
    assert len({id(p) for p in params}) == len(params)
    with pytest.raises(ValueError, match="non-zero"):
        DenoSent(32, 4, 0, vocab_size=10, contrastive_weight=0, denoising_weight=0)


# --- BSL ----------------------------------------------------------------------------------------


def test_bsl_loss_matches_hand_computed_value():
    p1, h2 = t([[1, 0], [0, 3]]), t([[1, 1], [0, 1]])  # cos 1/√2 and 1
    p2, h1 = t([[0, 1], [2, 0]]), t([[0, -2], [1, 0]])  # cos -1 and 1
    expected = 0.5 * -(1 / R + 1) / 2 + 0.5 * -(-1 + 1) / 2
    assert bsl_loss(p1, h2, p2, h1).item() == pytest.approx(expected, rel=1e-12)


def test_negative_cosine_is_half_the_normalised_squared_error_minus_one():
    torch.manual_seed(0)
    p, h = torch.randn(6, 5, dtype=torch.float64), torch.randn(6, 5, dtype=torch.float64)
    squared_error = (F.normalize(p, dim=-1) - F.normalize(h, dim=-1)).pow(2).sum(-1).mean()
    assert squared_error.item() == pytest.approx(2 + 2 * negative_cosine(p, h).item(), rel=1e-12)


def test_bsl_loss_stops_the_gradient_at_the_targets():
    p1, p2 = (torch.randn(3, 4, requires_grad=True) for _ in range(2))
    h1, h2 = (torch.randn(3, 4, requires_grad=True) for _ in range(2))
    bsl_loss(p1, h2, p2, h1).backward()
    assert h1.grad is None and h2.grad is None
    assert p1.grad.abs().sum() > 0 and p2.grad.abs().sum() > 0


def test_mean_pool_ignores_padding():
    hidden = t([[[1, 2], [3, 4], [100, 100]], [[5, 6], [0, 0], [0, 0]]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    outputs = SimpleNamespace(last_hidden_state=hidden)
    assert pool(outputs, mask, "mean").tolist() == [[2.0, 3.0], [5.0, 6.0]]


def test_predictor_shape_d_kd_kd_d_with_batchnorm_and_relu():
    predictor = BSLPredictor(4, k=3)
    linears = [m for m in predictor.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(4, 12), (12, 12), (12, 4)]
    kinds = [type(m) for m in predictor.mlp]
    assert kinds == [nn.Linear, nn.BatchNorm1d, nn.ReLU] * 2 + [nn.Linear]
    assert predictor(torch.randn(5, 4)).shape == (5, 4)
    assert (
        len([m for m in BSLPredictor(4, k=2, num_mlps=3).modules() if isinstance(m, nn.Linear)])
        == 9
    )


def test_ema_update_exact_arithmetic():
    online, target = nn.Linear(2, 1), nn.Linear(2, 1)
    with torch.no_grad():
        target.weight.copy_(torch.tensor([[1.0, -2.0]]))
        target.bias.fill_(0.5)
        online.weight.copy_(torch.tensor([[3.0, 2.0]]))
        online.bias.fill_(-0.5)
    target.requires_grad_(False)
    ema_update(target, online, delta=0.75)
    # 0.75 * 1 + 0.25 * 3 = 1.5; 0.75 * -2 + 0.25 * 2 = -1; 0.75 * 0.5 + 0.25 * -0.5 = 0.25
    assert target.weight.tolist() == [[1.5, -1.0]]
    assert target.bias.tolist() == [0.25]
    assert online.weight.tolist() == [[3.0, 2.0]] and online.bias.tolist() == [-0.5]
    ema_update(target, online, delta=0.0)
    assert target.weight.tolist() == [[3.0, 2.0]]


def test_ema_update_rejects_different_networks():
    with pytest.raises(ValueError):
        ema_update(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2)))


def test_make_target_is_a_frozen_copy():
    online = nn.Linear(3, 2)
    target = make_target(online)
    assert all(not p.requires_grad for p in target.parameters())
    assert all(p.requires_grad for p in online.parameters())
    assert torch.equal(target.weight, online.weight)
    assert target.weight.data_ptr() != online.weight.data_ptr()


def test_bsl_target_changes_only_through_the_ema_update(tiny_mlm, tiny_tokenizer, tiny_sentences):
    torch.manual_seed(0)
    encoder = tiny_mlm.bert
    objective = BSL(encoder, 32, k=2, delta=0.9)
    optimizer = torch.optim.AdamW(trainable_parameters(encoder, objective), lr=1e-2)
    before = {name: p.clone() for name, p in objective.target.named_parameters()}
    objective(bsl_batch(tiny_tokenizer, tiny_sentences), encoder)["loss"].backward()
    assert all(p.grad is None for p in objective.target.parameters())
    optimizer.step()
    after_step = dict(objective.target.named_parameters())
    assert all(torch.equal(before[name], after_step[name]) for name in before)
    online = dict(encoder.named_parameters())
    assert any(not torch.equal(online[name], before[name]) for name in before)
    objective.after_optimizer_step(encoder)
    for name, xi in objective.target.named_parameters():
        expected = 0.9 * before[name] + 0.1 * online[name].detach()
        assert torch.allclose(xi, expected, atol=1e-6), name


# --- registry -----------------------------------------------------------------------------------


def test_registry_maps_names_to_classes_and_columns():
    assert {
        "simcse": SimCSE,
        "simcse_hn": SimCSEHardNegatives,
        "simcse_bt": SimCSETranslation,
        "debcse": DebCSE,
        "denosent": DenoSent,
        "bsl": BSL,
        "infocse": InfoCSE,
        "cotbert": CoTBERT,
        "combined": Combined,
    } == OBJECTIVES
    assert {
        "simcse": [columns.TEXT],
        "simcse_hn": [columns.TEXT, columns.NEGATIVE_TEXTS],
        "simcse_bt": [columns.TEXT, columns.POSITIVE_TEXT],
        "debcse": [columns.ANCHOR_TEXT, columns.POSITIVE_TEXTS, columns.NEGATIVE_TEXTS],
        "denosent": [columns.TEXT, columns.POSITIVE_TEXT],
        "bsl": [columns.VIEW1_TEXT, columns.VIEW2_TEXT],
        "infocse": [columns.TEXT],
        "cotbert": [columns.TEXT],
        "combined": [columns.ANCHOR_TEXT, columns.POSITIVE_TEXTS, columns.NEGATIVE_TEXTS],
    } == COLUMNS
    assert get_objective("bsl") is BSL
    assert required_columns("debcse") == COLUMNS["debcse"]


def test_check_columns_names_the_objective_and_the_missing_columns():
    check_columns("debcse", [columns.ANCHOR_TEXT, columns.POSITIVE_TEXTS, columns.NEGATIVE_TEXTS])
    with pytest.raises(ValueError) as error:
        check_columns("debcse", [columns.ANCHOR_TEXT, "text"])
    message = str(error.value)
    assert "debcse" in message
    assert columns.POSITIVE_TEXTS in message and columns.NEGATIVE_TEXTS in message
    with pytest.raises(
        ValueError,
        match="known objectives: bsl, combined, cotbert, debcse, denosent, infocse, simcse, simcse_bt, simcse_hn",
    ):
        check_columns("diffcse", ["text"])


# --- short training runs on a tiny BERT ---------------------------------------------------------


def tokenize(tokenizer, texts: list[str]) -> dict[str, torch.Tensor]:
    return dict(tokenizer(texts, padding=True, return_tensors="pt"))


def drop_word(sentence: str, index: int) -> str:
    words = sentence.split()
    return " ".join(words[:index] + words[index + 1 :])


def denosent_batch(tokenizer, sentences, positives=None):
    positives = positives or [drop_word(s, 1) for s in sentences]
    return {
        columns.TEXT: dict(build_prompt_inputs(tokenizer, sentences)),
        columns.POSITIVE_TEXT: dict(build_prompt_inputs(tokenizer, positives)),
    }


def bsl_batch(tokenizer, sentences):
    return {
        columns.VIEW1_TEXT: tokenize(tokenizer, [drop_word(s, 1) for s in sentences]),
        columns.VIEW2_TEXT: tokenize(tokenizer, [drop_word(s, -2) for s in sentences]),
    }


def debcse_batch(tokenizer, sentences):
    n = len(sentences)
    negatives = [[sentences[(i + 3) % n], sentences[(i + 5) % n]] for i in range(n)]
    flat = tokenize(tokenizer, [text for row in negatives for text in row])
    return {
        columns.ANCHOR_TEXT: tokenize(tokenizer, sentences),
        columns.POSITIVE_TEXTS: tokenize(tokenizer, [drop_word(s, 1) for s in sentences]),
        columns.NEGATIVE_TEXTS: {k: v.reshape(n, 2, -1) for k, v in flat.items()},
    }


def build(name, model, tokenizer, sentences):
    if name == "simcse":
        return SimCSE(32), {columns.TEXT: tokenize(tokenizer, sentences)}
    if name == "debcse":
        return DebCSE(32), debcse_batch(tokenizer, sentences)
    if name == "denosent":
        objective = DenoSent(
            32,
            tokenizer.mask_token_id,
            tokenizer.pad_token_id,
            output_head=model.cls,
            num_decoder_layers=2,
            decoder_feedforward=64,
        )
        return objective, denosent_batch(tokenizer, sentences)
    return BSL(model.bert, 32, k=2, delta=0.99), bsl_batch(tokenizer, sentences)


@pytest.mark.parametrize("name", ["simcse", "debcse", "denosent", "bsl"])
def test_training_on_a_tiny_bert_lowers_the_loss(name, tiny_mlm, tiny_tokenizer, tiny_sentences):
    torch.manual_seed(0)
    objective, batch = build(name, tiny_mlm, tiny_tokenizer, tiny_sentences)
    check_columns(name, batch)
    encoder = tiny_mlm.bert
    optimizer = torch.optim.AdamW(trainable_parameters(encoder, objective), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = objective(batch, encoder)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        objective.after_optimizer_step(encoder)
        losses.append(loss.item())
    assert all(math.isfinite(value) for value in losses)
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3, losses
    if name == "simcse":
        # Below the uniform guess over the batch: the views are told apart, not collapsed.
        assert max(losses[-3:]) < math.log(len(tiny_sentences)), losses
