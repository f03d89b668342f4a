"""The model layer (``pipeline.science.models``): one encoder for embed, report, train and evaluate.

The expected vectors were computed by the two encoders the merged one replaced (embed's
``TextEncoder``, the evaluator's ``Embedder``) on the tiny BERT built here, before the merge:
every caller must get the numbers it got then.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from pairforge.pipeline.plumbing.errors import ConfigError
from pairforge.pipeline.science.models import (
    POOLINGS,
    SentenceEncoder,
    load_encoder,
    load_masked_lm,
    load_sentence_encoder,
    load_text_encoder,
    mlm_head_of,
)
from pairforge.pipeline.science.models.encoder import TokenIds

WORDS = ["the", "river", "bank", "is", "quiet", "an", "old", "boat", "on", "a", "long", "day", "."]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", '"', "means"]
TEXTS = [
    "the river is quiet .",
    "an old boat on the river bank .",
    "a long day .",
    "the bank",
    "an old old boat is on a long long river on a quiet day .",
    "quiet",
    "the boat is on the bank .",
]
PROMPT = '"[X]" means [MASK].'


def build_tiny(folder: str | Path) -> Path:
    """A 2-layer, 32-d BERT with a pooler and a word-level vocabulary, saved in ``folder``."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(SPECIALS + WORDS) + "\n")
    tokenizer = BertTokenizerFast.from_pretrained(str(folder))
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(SPECIALS + WORDS),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=0.1,
    )
    BertModel(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


# The first four components of each text's vector, then the sum of all 32.
EXPECTED = {
    "embed/cls": [
        (-0.2291843, 0.3216205, -0.1941527, -0.2627140, -0.8004029),
        (-0.2299502, 0.3226093, -0.1752344, -0.2641097, -0.6654496),
        (-0.2503216, 0.3183401, -0.2033418, -0.2565244, -0.8748632),
        (-0.2492326, 0.3195055, -0.2021957, -0.2545508, -0.8889163),
        (-0.2252164, 0.3177447, -0.1709353, -0.2651813, -0.6520463),
        (-0.2661994, 0.3140274, -0.2105889, -0.2572224, -1.0104191),
        (-0.2389697, 0.3150265, -0.1614050, -0.2630469, -0.5714394),
    ],
    "embed/cls_before_pooler": [
        (-0.0015880, -0.0422632, 0.1108828, -0.1138256, -0.0000001),
        (0.0113433, -0.0378030, 0.1239097, -0.0872061, -0.0000001),
        (0.0389972, -0.0309430, 0.1192791, -0.0824336, -0.0000001),
        (0.0391803, -0.0167875, 0.1384813, -0.1209387, -0.0000000),
        (0.0142446, -0.0494010, 0.1204234, -0.0933439, -0.0000001),
        (0.0241458, -0.0361680, 0.1603345, -0.1213182, 0.0000001),
        (0.0275563, -0.0374256, 0.1466225, -0.0855263, 0.0000000),
    ],
    "embed/mean": [
        (-0.2491470, 0.0037346, -0.0108896, -0.0861014, -0.0000000),
        (-0.3578957, -0.0845704, 0.0371126, 0.0379963, -0.0000001),
        (-0.2168217, -0.0144452, -0.0890661, -0.0603893, -0.0000001),
        (-0.0160099, -0.1351210, -0.1249853, -0.0817362, -0.0000000),
        (-0.3423270, -0.0378918, 0.0471504, -0.0654311, 0.0000000),
        (0.0155412, 0.0325810, -0.1434177, -0.1089568, 0.0000001),
        (-0.3447596, -0.0106181, 0.0642467, -0.0348298, -0.0000000),
    ],
    "embed/mask": [
        (-0.2655844, -0.0754080, 0.2391997, 0.1198678, 0.0000001),
        (-0.2599335, -0.0760175, 0.2524279, 0.1312709, 0.0000001),
        (-0.3573501, -0.0208154, 0.1673404, 0.0523633, -0.0000001),
        (-0.2804645, -0.0839288, 0.2296811, 0.0322299, 0.0000001),
        (-0.2567828, -0.0740690, 0.2438777, 0.1271776, -0.0000000),
        (-0.3305789, -0.1348267, 0.1102969, -0.1543100, -0.0000002),
        (-0.2554170, -0.0763779, 0.2516699, 0.1295455, 0.0000000),
    ],
    "evaluate/cls": [
        (-0.6005231, 0.8427302, -0.5087309, -0.6883798, -2.0972658),
        (-0.5968221, 0.8373134, -0.4548105, -0.6854811, -1.7271352),
        (-0.6683146, 0.8499122, -0.5428869, -0.6848751, -2.3357309),
        (-0.6600361, 0.8461379, -0.5354694, -0.6741199, -2.3540933),
        (-0.6051649, 0.8309242, -0.4478558, -0.6948722, -1.6190207),
        (-0.7127512, 0.8408114, -0.5638539, -0.6887156, -2.7054067),
        (-0.6286045, 0.8286702, -0.4245723, -0.6919389, -1.5031593),
    ],
    "evaluate/cls_before_pooler": [
        (-0.0015880, -0.0422632, 0.1108828, -0.1138256, -0.0000000),
        (0.0113433, -0.0378030, 0.1239097, -0.0872061, 0.0000000),
        (0.0389972, -0.0309430, 0.1192791, -0.0824336, -0.0000001),
        (0.0391803, -0.0167875, 0.1384813, -0.1209387, -0.0000000),
        (0.0051526, -0.0472899, 0.1263280, -0.0945202, 0.0000001),
        (0.0241458, -0.0361680, 0.1603345, -0.1213183, 0.0000001),
        (0.0275562, -0.0374256, 0.1466225, -0.0855262, 0.0000001),
    ],
    "evaluate/mean": [
        (-0.9418008, 0.0141172, -0.0411636, -0.3254719, -0.0000000),
        (-1.2492766, -0.2952028, 0.1295459, 0.1326304, 0.0000001),
        (-0.8319464, -0.0554262, -0.3417472, -0.2317141, -0.0000004),
        (-0.0592460, -0.5000270, -0.4625190, -0.3024721, -0.0000003),
        (-1.2888080, 0.1495531, 0.1069913, -0.1978231, 0.0000006),
        (0.0624173, 0.1308528, -0.5759990, -0.4375962, -0.0000001),
        (-1.1697557, -0.0360268, 0.2179865, -0.1181760, 0.0000003),
    ],
    "evaluate/mask": [
        (-0.3722816, -0.0257121, 0.1726113, 0.0476957, -0.0000000),
        (-0.3631850, -0.0225486, 0.1809465, 0.0551398, 0.0000001),
        (-0.3573501, -0.0208154, 0.1673404, 0.0523633, -0.0000001),
        (-0.2804645, -0.0839288, 0.2296811, 0.0322299, 0.0000001),
        (-0.3600195, -0.0220591, 0.1764674, 0.0481471, 0.0000000),
        (-0.3305789, -0.1348267, 0.1102969, -0.1543100, -0.0000002),
        (-0.3648213, -0.0210948, 0.1799115, 0.0578184, 0.0000001),
    ],
}


def summary(vectors: np.ndarray) -> np.ndarray:
    """What EXPECTED holds of ``vectors``: the first four components, then the row sum."""
    return np.concatenate([vectors[:, :4], vectors.astype(np.float64).sum(1, keepdims=True)], 1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("tiny-models"))


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("pooling", POOLINGS)
def test_embed_encoder_gives_the_previous_numbers(tiny, pooling):
    """Embed's encoder (unit vectors, batches by token count, mask budget from max_length)."""
    encoder = load_text_encoder(str(tiny), pooling, device="cpu", batch_size=3, max_length=12)
    vectors = encoder.encode(TEXTS)
    assert vectors.shape == (len(TEXTS), 32) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(summary(vectors), EXPECTED[f"embed/{pooling}"], rtol=0, atol=1e-6)
    assert encoder.info()["prompt"] == (PROMPT if pooling == "mask" else None)


@pytest.mark.parametrize(
    ("pooling", "prompt", "normalize"),
    [
        ("cls", None, False),
        ("cls_before_pooler", None, True),
        ("mean", None, False),
        ("mask", PROMPT, True),
    ],
)
def test_evaluator_encoder_gives_the_previous_numbers(tiny, pooling, prompt, normalize):
    """The evaluator's and training's encoder (batches longest text first, sentence cut to
    ``sentence_tokens`` before the prompt, unit length only when asked)."""
    tokenizer, model = load_encoder(str(tiny))
    model.train()  # the caller's mode survives encoding
    encoder = SentenceEncoder(
        model,
        tokenizer,
        pooling,
        prompt=prompt,
        sentence_tokens=4,
        batch_size=3,
        normalize=normalize,
        order="chars",
    )
    vectors = encoder(TEXTS)
    assert model.training
    norms = np.linalg.norm(vectors, axis=1)
    assert np.allclose(norms, 1.0, atol=1e-6) == normalize
    expected = EXPECTED[f"evaluate/{pooling}"]
    np.testing.assert_allclose(summary(vectors), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("types", [True, False])
def test_token_ids_pad_as_the_tokenizer_does(tiny, side, types):
    """Embed keeps a shard's token ids as flat arrays and pads each batch itself: the batch is
    the tokenizer's own padding of those texts, on either side, with or without token types
    (RoBERTa-style tokenizers take none)."""
    tokenizer, _ = load_encoder(str(tiny))
    tokenizer.padding_side = side
    if not types:
        tokenizer.model_input_names = ["input_ids", "attention_mask"]
    options = {"truncation": True, "max_length": 9}
    ids = TokenIds.of(tokenizer, TEXTS, options)
    assert ids.flat.dtype == np.int32 and len(ids.lengths) == len(TEXTS)
    assert (ids.type_ids is not None) == types
    rows = np.array([4, 0, 3])  # truncated, middling, short: padding on every row but one
    got = ids.batch(rows, tokenizer)
    want = tokenizer([TEXTS[i] for i in rows], padding=True, return_tensors="pt", **options)
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert torch.equal(got[key], value), key
    assert got["input_ids"].shape == (3, 9)


def test_batch_tokens_bounds_each_batch_and_keeps_the_vectors(tiny):
    """``max_batch_tokens`` caps a batch's padded tokens (longest texts first, so a batch's first
    text sets its width); every text is encoded once, and the vectors are the unbudgeted
    encoder's up to float rounding."""
    plain = load_text_encoder(str(tiny), "mean", device="cpu", batch_size=4, max_length=12)
    capped = load_text_encoder(
        str(tiny), "mean", device="cpu", batch_size=4, max_length=12, max_batch_tokens=20
    )
    shapes, seen, widths = [], [], []
    for rows, batch in capped._batches(list(TEXTS)):
        shapes.append(tuple(batch["input_ids"].shape))
        seen.extend(rows.tolist())
        widths.append(int(batch["attention_mask"].sum(1).max()))
    assert sorted(seen) == list(range(len(TEXTS)))
    assert widths == sorted(widths, reverse=True)  # longest first
    assert all(b * w <= 20 or b == 1 for b, w in shapes)
    assert len(shapes) > len(range(0, len(TEXTS), 4))  # the cap split the long batches
    assert [b for b, _ in shapes][-1] <= 4
    np.testing.assert_allclose(capped.encode(TEXTS), plain.encode(TEXTS), rtol=0, atol=1e-6)
    # One text longer than the budget still goes, alone.
    alone = load_text_encoder(str(tiny), "mean", device="cpu", batch_size=4, max_batch_tokens=2)
    assert [len(rows) for rows, _ in alone._batches(list(TEXTS))] == [1] * len(TEXTS)
    with pytest.raises(ConfigError, match="max_batch_tokens=0"):
        load_text_encoder(str(tiny), "mean", device="cpu", max_batch_tokens=0)


def test_free_heap_is_released_every_few_batches_and_after_the_last(tiny, monkeypatch):
    """glibc's malloc_trim after every TRIM_EVERY-th batch and once after the last: each call
    costs a re-fault of the next batch's pages, so not after every batch
    (benchmarks/results/embed_trim-2026-11-26.md)."""
    from pairforge.pipeline.science.models import encoder as module

    calls = []
    monkeypatch.setattr(module, "_MALLOC_TRIM", calls.append)
    monkeypatch.setattr(module, "TRIM_EVERY", 3)
    enc = load_text_encoder(str(tiny), "mean", device="cpu", batch_size=1, max_length=12)
    batches = [len(rows) for rows, _ in enc._batches(list(TEXTS))]
    assert batches == [1] * len(TEXTS) and len(TEXTS) == 7
    assert calls == [0] * 3  # after batches 3 and 6, and after the 7th (the last)


def test_sentence_encoder_reads_the_folder(tiny):
    """A plain Hugging Face folder declares nothing: raw [CLS], not normalised, as evaluated."""
    encoder, described = load_sentence_encoder(str(tiny), batch_size=3)
    assert described["from"] == "default" and encoder.pooling == "cls_before_pooler"
    assert not encoder.normalize and encoder.order == "chars"


def test_empty_input_and_bad_settings_are_clear(tiny):
    encoder = load_text_encoder(str(tiny), "mean", device="cpu")
    assert encoder.encode([]).shape == (0, 32)
    with pytest.raises(ConfigError, match="pooling 'max'"):
        load_text_encoder(str(tiny), "max", device="cpu")
    with pytest.raises(ConfigError, match="leaves no room for a sentence"):
        load_text_encoder(str(tiny), "mask", device="cpu", max_length=4)
    with pytest.raises(ConfigError, match="order 'random'"):
        SentenceEncoder(
            encoder.model,
            encoder.tokenizer,
            "mean",
            order="random",  # type: ignore[arg-type]
        )


def test_mlm_loader_names_the_head_weights_it_initialised(tmp_path, tiny):
    """An encoder-only checkpoint (like MiniLM) gets a fresh head, reported; one with a head
    reports nothing missing; the same seed initialises the same head."""
    _, model, missing = load_masked_lm(str(tiny), seed=3)
    assert missing and all(key.startswith("cls.") for key in missing)
    assert any(key.endswith("dense.weight") for key in missing)
    head = mlm_head_of(model, required=True)
    assert head is model.cls
    model.save_pretrained(tmp_path / "with_head")
    _, again, missing_again = load_masked_lm(str(tiny), seed=3)
    torch.testing.assert_close(
        mlm_head_of(again).predictions.transform.dense.weight,
        head.predictions.transform.dense.weight,
    )
    (tmp_path / "with_head" / "vocab.txt").write_text((tiny / "vocab.txt").read_text())
    _, _, none_missing = load_masked_lm(str(tmp_path / "with_head"))
    assert none_missing == []
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"^pretrain.model '.*empty' could not be loaded"):
        load_masked_lm(str(tmp_path / "empty"), key="pretrain.model")


def test_mlm_head_finder_without_a_head():
    """A bare encoder has no head: None, or a ConfigError naming its children when required."""
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=20,
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=1,
        intermediate_size=16,
    )
    model = BertModel(config)
    assert mlm_head_of(model) is None
    with pytest.raises(ConfigError, match="cannot tell the MLM head of BertModel"):
        mlm_head_of(model, required=True)
