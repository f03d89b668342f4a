"""WordCodes: one frequency-ranked vocabulary per run; encoded distances equal token distances."""

from __future__ import annotations

import numpy as np
import pairforge.stages.sample.edits as edits
import pyarrow as pa
import pytest
from pairforge.stages.sample.edits import EditCodes, WordCodes, encoded_distances
from rapidfuzz.distance import Indel, Levenshtein

from tests.stages.sample.edit_oracle import pair_distances, tokenize_words

TEXTS = [
    "The cat sat on the mat.",
    "the dog sat on a mat!",
    "Über naïve 東京 cats, quickly.",
    "A cat; a dog; the end",
    "",
]


@pytest.mark.parametrize("normalized", [True, False])
@pytest.mark.parametrize("metric", ["levenshtein", "indel"])
def test_encoded_distances_equal_token_list_distances(normalized, metric):
    rng = np.random.default_rng(0)
    a = [TEXTS[i] for i in rng.integers(0, len(TEXTS), 200)]
    b = [TEXTS[i] for i in rng.integers(0, len(TEXTS), 200)]
    codes = WordCodes(TEXTS)
    got = encoded_distances(codes.encode(a), codes.encode(b), normalized, 1, metric)
    module = Levenshtein if metric == "levenshtein" else Indel
    scorer = module.normalized_distance if normalized else module.distance
    want = [scorer(tokenize_words(x), tokenize_words(y)) for x, y in zip(a, b, strict=True)]
    np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose(got, pair_distances(a, b, "word", normalized, 1, metric), atol=1e-6)


def test_codes_are_ranked_by_frequency_and_unseen_tokens_still_work():
    codes = WordCodes(["b a a", "a c b", "a"])
    assert codes.table["a"] == chr(0) and codes.table["b"] == chr(1) and codes.table["c"] == chr(2)
    # Tokens unseen at fit time get a (hashed) code of their own, equal for equal tokens.
    enc = codes.encode(["zebra a", "zebra a", "yak a"])
    assert enc[0] == enc[1] != enc[2]
    assert encoded_distances(enc[:1], enc[2:], normalized=False)[0] == 1


def test_hashed_tail_when_the_code_space_is_full(monkeypatch):
    monkeypatch.setattr(edits, "_MAX_CODES", 65536 + 2)  # room for two ranked tokens only
    codes = WordCodes(["a a a b b c d"])
    assert set(codes.table) == {"a", "b"}
    c, d = codes.encode(["c", "d"])
    assert ord(c) >= 2 and ord(d) >= 2 and len(c) == len(d) == 1


def test_encoded_distances_checks_alignment():
    with pytest.raises(ValueError, match="aligned"):
        encoded_distances(["a"], [], True)
    assert encoded_distances([], [], True).shape == (0,)


def _string_codes(words: WordCodes, texts: list[str]) -> EditCodes:
    return EditCodes.from_strings(words.encode(texts))


@pytest.mark.parametrize("limit", [None, 65536 + 3])
def test_integer_codes_equal_the_string_codes(monkeypatch, limit):
    if limit is not None:  # room for three ranked tokens: the rest share hashed codes
        monkeypatch.setattr(edits, "_MAX_CODES", limit)
    rng = np.random.default_rng(3)
    # More texts than one tokenising chunk (4096), some holding the chunk separator U+FFFF.
    texts = [TEXTS[i] for i in rng.integers(0, len(TEXTS), 4200)]
    texts[10] = "a \uffff b"
    texts[4150] = "\uffff"
    extra = ["zebra \uffff quickly", "", "The cat"]
    words, (codes, more) = WordCodes.fit_codes(texts, pa.array(extra))
    fitted = WordCodes(texts + extra)
    assert words.table == fitted.table and words.size == fitted.size
    for got, group in ((codes, texts), (more, extra)):
        want = _string_codes(fitted, group)
        np.testing.assert_array_equal(got.codes, want.codes)
        np.testing.assert_array_equal(got.offsets, want.offsets)
    # Texts unseen at fit time: the same hashed codes as the strings.
    unseen = ["yak zebra a", "\uffff yak"]
    np.testing.assert_array_equal(fitted.codes(unseen).codes, _string_codes(fitted, unseen).codes)
    assert WordCodes.fit_codes([])[1][0].offsets.tolist() == [0]
