"""CoT-BERT: the extended InfoNCE by hand, the token-level templates, the [PAD] template
denoising on a tiny BERT, and a short training run.

The tiny tokenizer here extends the shared one (``tests.tiny_models.vocabulary``) with the templates'
words, so no template token is [UNK]; the tiny BERT is built for it once per module.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from pairforge.train.objectives import check_columns, columns, get_objective, trainable_parameters
from pairforge.train.objectives.base import BuildContext
from pairforge.train.objectives.cotbert import (
    BERT_TEMPLATES,
    ROBERTA_TEMPLATES,
    CoTBERT,
    build_pad_template_inputs,
    build_template_inputs,
    extended_infonce,
    prepare_templates,
    resolve_templates,
    sentence_token_ids,
)
from pairforge.train.objectives.prompts import build_prompt_inputs
from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

from tests.tiny_models import vocabulary

R = math.sqrt(2.0)  # cos = 1/√2 divided by τ = 0.5
TEMPLATE_WORDS = [
    "sentence", "of", "so", "it", "can", "be", "summarized", "as", ":", "does", "not", "mean",
    "cannot", "'",
]  # fmt: skip


def t(values: list) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


@pytest.fixture(scope="module")
def prompt_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> BertTokenizerFast:
    words = vocabulary()
    folder = tmp_path_factory.mktemp("cotbert_tokenizer")
    (folder / "vocab.txt").write_text(
        "\n".join(words + [w for w in TEMPLATE_WORDS if w not in words])
    )
    return BertTokenizerFast.from_pretrained(str(folder))


@pytest.fixture(scope="module")
def _prompt_bert_once(prompt_tokenizer: BertTokenizerFast) -> BertForMaskedLM:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(prompt_tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=96,
        pad_token_id=prompt_tokenizer.pad_token_id,
        initializer_range=0.1,  # as tiny_models' tiny BERT: keeps random sentences apart
        # CoT-BERT's views differ by template, not by dropout; at this size dropout noise on the
        # two passes swamps the small sentence-minus-template difference the loss works on.
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertForMaskedLM(config)


@pytest.fixture
def prompt_bert(_prompt_bert_once: BertForMaskedLM) -> BertForMaskedLM:
    model = copy.deepcopy(_prompt_bert_once)
    model.train()
    return model


def tokens(tokenizer, ids) -> list[str]:
    return tokenizer.convert_ids_to_tokens([int(i) for i in ids])


# --- the loss -----------------------------------------------------------------------------------

Z1 = [[1, 0], [0, 1]]
Z2 = [[1, 0], [1, 1]]
Z3 = [[0, 1], [-1, 0]]


def test_extended_infonce_matches_hand_computed_value():
    e = math.exp
    # Row i: [sim(z1_i, z2_j)]_j, [sim(z1_i, z3_j)]_j, [sim(z2_i, z3_j)]_j, each divided by τ = 0.5.
    row0 = -2 + math.log(e(2) + e(R) + e(0) + e(-2) + e(0) + e(-2))
    row1 = -R + math.log(e(0) + e(R) + e(2) + e(0) + e(R) + e(-R))
    loss = extended_infonce(t(Z1), t(Z2), t(Z3), temperature=0.5)
    assert loss.item() == pytest.approx((row0 + row1) / 2, rel=1e-12)


def test_extended_infonce_without_the_positive_negative_term():
    e = math.exp
    row0 = -2 + math.log(e(2) + e(R) + e(0) + e(-2))
    row1 = -R + math.log(e(0) + e(R) + e(2) + e(0))
    loss = extended_infonce(t(Z1), t(Z2), t(Z3), temperature=0.5, positive_negative=False)
    assert loss.item() == pytest.approx((row0 + row1) / 2, rel=1e-12)


def test_extended_infonce_rises_when_the_positive_nears_the_negatives():
    torch.manual_seed(0)
    z1 = torch.randn(6, 8, dtype=torch.float64)
    z3 = torch.randn(6, 8, dtype=torch.float64)
    apart = extended_infonce(z1, z1, -z1)
    close = extended_infonce(z1, z1, z1 + 0.01 * z3)
    assert close.item() > apart.item() + 0.5


# --- templates ----------------------------------------------------------------------------------


def test_resolve_templates():
    assert resolve_templates("bert") == BERT_TEMPLATES
    assert resolve_templates("auto", "roberta") == ROBERTA_TEMPLATES
    assert resolve_templates("auto", "bert") == BERT_TEMPLATES
    custom = ["[X] a [MASK]", "[X] b [MASK]", "[X] c [MASK]"]
    assert resolve_templates(custom) == tuple(custom)
    with pytest.raises(ValueError, match="allowed auto, bert, roberta"):
        resolve_templates("gpt")
    with pytest.raises(ValueError, match="needs 3 templates"):
        resolve_templates(custom[:2])
    with pytest.raises(ValueError, match=r"\[MASK\] after \[X\]"):
        resolve_templates(["[MASK] [X]", *custom[1:]])


def test_template_inputs_hold_the_sentence_tokens_between_prefix_and_suffix(prompt_tokenizer):
    templates = prepare_templates(prompt_tokenizer, BERT_TEMPLATES)
    ids = sentence_token_ids(prompt_tokenizer, ["The cat sat.", "a dog ran in the park ."], 32)
    built = build_template_inputs(ids, templates, prompt_tokenizer.pad_token_id)
    assert built["input_ids"].shape == (2, 3, 27)
    assert built["sentence_lengths"].tolist() == [4, 7]
    anchor, positive, negative = (
        tokens(prompt_tokenizer, built["input_ids"][0, k]) for k in range(3)
    )
    assert anchor[:19] == [
        "[CLS]", "the", "sentence", "of", '"', "the", "cat", "sat", ".", '"', "means", "[MASK]",
        ",", "so", "it", "can", "be", "summarized", "as",
    ]  # fmt: skip
    assert anchor[19:] == ["[MASK]", ".", "[SEP]"] + ["[PAD]"] * 5
    assert positive[2:4] == ["sentence", ":"]
    assert negative[10:14] == ["does", "not", "mean", "[MASK]"]
    assert negative[17] == "cannot"
    # Each mask position is the input's last [MASK]; attention ends at [SEP].
    for b in range(2):
        for k in range(3):
            row = tokens(prompt_tokenizer, built["input_ids"][b, k])
            position = int(built["mask_positions"][b, k])
            assert row[position] == "[MASK]" and "[MASK]" not in row[position + 1 :]
            length = int(built["attention_mask"][b, k].sum())
            assert row[length - 1] == "[SEP]" and set(row[length:]) <= {"[PAD]"}


def test_sentence_is_cut_to_max_length_and_the_template_kept(prompt_tokenizer):
    objective = CoTBERT(32, prompt_tokenizer, templates="bert")
    words = ["one", "two", "three", "four", "five"] * 8  # 40 tokens
    built = objective.tokenize(prompt_tokenizer, columns.TEXT, [" ".join(words)], max_length=32)
    anchor = tokens(prompt_tokenizer, built["input_ids"][0, 0])
    anchor = anchor[: int(built["attention_mask"][0, 0].sum())]
    assert anchor[5:37] == words[:32] and anchor[37] == '"'
    assert anchor[-3:] == ["[MASK]", ".", "[SEP]"]
    assert built["sentence_lengths"].tolist() == [32]


def test_token_level_inputs_equal_the_string_prompt_the_evaluator_uses(prompt_tokenizer):
    objective = CoTBERT(32, prompt_tokenizer, templates="bert")
    assert objective.pooling == "mask" and objective.prompt == BERT_TEMPLATES[0]
    sentences = ["the cat sat on the mat .", "Birds fly over the blue sea."]
    built = objective.tokenize(prompt_tokenizer, columns.TEXT, sentences, 32)
    wrapped = build_prompt_inputs(prompt_tokenizer, sentences, objective.prompt, 32)
    for b in range(2):
        length = int(wrapped["attention_mask"][b].sum())
        assert (
            built["input_ids"][b, 0, :length].tolist() == wrapped["input_ids"][b, :length].tolist()
        )


def test_roberta_templates_tokenize_as_the_wrapped_string(tmp_path):
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaTokenizerFast

    texts = ["the cat sat on the mat .", *ROBERTA_TEMPLATES]
    bpe = ByteLevelBPETokenizer()
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    bpe.train_from_iterator(texts * 5, vocab_size=400, min_frequency=1, special_tokens=specials)
    bpe.save_model(str(tmp_path))
    tokenizer = RobertaTokenizerFast.from_pretrained(str(tmp_path))
    config = BertConfig(hidden_size=8, num_attention_heads=2, model_type="roberta")
    config.model_type = "roberta"
    objective = CoTBERT(8, tokenizer, config=config)
    assert objective.template_texts == ROBERTA_TEMPLATES
    assert objective.templates[0].space_before_sentence
    built = objective.tokenize(tokenizer, columns.TEXT, ["the cat sat"], 32)
    for k, template in enumerate(ROBERTA_TEMPLATES):
        text = template.replace("[MASK]", tokenizer.mask_token).replace("[X]", "the cat sat")
        expected = tokenizer(text)["input_ids"]
        assert built["input_ids"][0, k, : len(expected)].tolist() == expected
    assert tokens(tokenizer, built["input_ids"][0, 0])[:7] == [
        "<s>", "The", "Ġsentence", "Ġof", "Ġ'", "Ġthe", "Ġcat",
    ]  # fmt: skip


def test_pad_template_has_attention_on_its_pads_and_not_on_the_tail(prompt_tokenizer):
    anchor = prepare_templates(prompt_tokenizer, BERT_TEMPLATES)[0]
    built = build_pad_template_inputs([2, 4], anchor, prompt_tokenizer.pad_token_id)
    short = tokens(prompt_tokenizer, built["input_ids"][0])
    assert short[:8] == ["[CLS]", "the", "sentence", "of", '"', "[PAD]", "[PAD]", '"']
    assert built["attention_mask"][0].tolist() == [1] * 20 + [0] * 2
    assert built["attention_mask"][1].tolist() == [1] * 22
    assert short[int(built["mask_positions"][0])] == "[MASK]"
    assert built["mask_positions"].tolist() == [17, 19]


# --- denoising on a tiny model ------------------------------------------------------------------


def test_denoising_subtracts_the_pad_template_vector(prompt_bert, prompt_tokenizer):
    encoder = prompt_bert.bert.eval()
    objective = CoTBERT(32, prompt_tokenizer, templates="bert", mlp=False).eval()
    plain = CoTBERT(32, prompt_tokenizer, templates="bert", mlp=False, denoise=False).eval()
    sentences = ["the cat sat .", "a dog ran in the park .", "she reads ."]
    features = objective.tokenize(prompt_tokenizer, columns.TEXT, sentences, 32)
    assert features["sentence_lengths"].tolist() == [4, 7, 3]
    with torch.no_grad():
        denoised = objective.sentence_vectors(features, encoder)  # (3, 3, 32)
        raw = plain.sentence_vectors(features, encoder)
        for b, n in enumerate(features["sentence_lengths"].tolist()):
            for k, template in enumerate(objective.templates):
                # Built by hand: the template around n [PAD]s, attention 1 on all of them.
                ids = [*template.prefix, *[prompt_tokenizer.pad_token_id] * n, *template.suffix]
                out = encoder(
                    input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids))
                ).last_hidden_state
                noise = out[0, template.mask_position(n)]
                assert torch.allclose(denoised[b, k], raw[b, k] - noise, atol=1e-5)
                # The raw vector is the real input's last-[MASK] state.
                row = {key: features[key][b : b + 1, k] for key in ("input_ids", "attention_mask")}
                real = encoder(**row).last_hidden_state[0, features["mask_positions"][b, k]]
                assert torch.allclose(raw[b, k], real, atol=1e-5)
    # The template vector depends on the sentence length (positions line up with the sentence).
    assert not torch.allclose(raw[0, 0] - denoised[0, 0], raw[2, 0] - denoised[2, 0])


def test_denoise_grad_switch_keeps_the_template_pass_out_of_the_graph(
    prompt_bert, prompt_tokenizer
):
    encoder = prompt_bert.bert
    calls: list[bool] = []

    def recording(**inputs):
        calls.append(torch.is_grad_enabled())
        return encoder(**inputs)

    batch = {columns.TEXT: CoTBERT(32, prompt_tokenizer).tokenize(
        prompt_tokenizer, columns.TEXT, ["the cat sat .", "a dog ran ."], 32
    )}  # fmt: skip
    for denoise_grad, expected in ((True, [True, True]), (False, [True, False])):
        calls.clear()
        CoTBERT(32, prompt_tokenizer, denoise_grad=denoise_grad)(batch, recording)
        assert calls == expected
    calls.clear()
    CoTBERT(32, prompt_tokenizer, denoise=False)(batch, recording)
    assert calls == [True]


def test_forward_rejects_a_batch_without_the_template_inputs(prompt_bert, prompt_tokenizer):
    plain = dict(prompt_tokenizer(["the cat sat ."], return_tensors="pt"))
    with pytest.raises(ValueError, match="CoTBERT.tokenize"):
        CoTBERT(32, prompt_tokenizer)({columns.TEXT: plain}, prompt_bert.bert)


def test_built_from_the_trainer_context(prompt_bert, prompt_tokenizer):
    cls = get_objective("cotbert")
    assert cls is CoTBERT and not cls.wants_mlm_head()
    context = BuildContext(encoder=prompt_bert.bert, tokenizer=prompt_tokenizer)
    objective = cls.build(context, {"temperature": 0.1, "positive_negative": False})
    assert objective.temperature == 0.1 and not objective.positive_negative
    assert objective.template_texts == BERT_TEMPLATES  # "auto" on a BERT config
    with pytest.raises(ValueError, match="unknown option"):
        cls.build(context, {"template": "x"})


# --- training -----------------------------------------------------------------------------------


def test_training_on_a_tiny_bert_lowers_the_loss(prompt_bert, prompt_tokenizer, tiny_sentences):
    torch.manual_seed(0)
    objective = CoTBERT(32, prompt_tokenizer, templates="bert")
    batch = {columns.TEXT: objective.tokenize(prompt_tokenizer, columns.TEXT, tiny_sentences, 32)}
    check_columns("cotbert", batch)
    encoder = prompt_bert.bert
    optimizer = torch.optim.AdamW(trainable_parameters(encoder, objective), lr=1e-3)

    losses = []
    for _ in range(25):
        loss = objective(batch, encoder)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(math.isfinite(value) for value in losses)
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 / 2, losses
    # Below the uniform guess over the 3B candidates: anchors pick their positives.
    assert max(losses[-3:]) < math.log(3 * len(tiny_sentences)) / 2, losses
