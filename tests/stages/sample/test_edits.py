"""The reference edit distances (edit_oracle.py, rapidfuzz over strings): char vs word, raw vs
normalised, by hand; vectorised paths vs per-pair loops."""

from __future__ import annotations

import numpy as np
import pairforge.stages.sample.edits as edits
import pytest
from rapidfuzz.distance import Indel, Levenshtein

from tests.stages.sample.edit_oracle import (
    cross_distances,
    encode_words,
    pair_distances,
    pool_distances,
    tokenize_words,
)


@pytest.mark.parametrize(
    ("a", "b", "kind", "normalized", "want"),
    [
        ("kitten", "sitting", "char", False, 3),
        ("kitten", "sitting", "char", True, 3 / 7),
        ("the cat sat", "the dog sat", "char", False, 3),  # c->d, a->o, t->g
        ("the cat sat", "the dog sat", "char", True, 3 / 11),
        ("the cat sat", "the dog sat", "word", False, 1),  # one word substituted
        ("the cat sat", "the dog sat", "word", True, 1 / 3),
        ("Hello, world!", "Hello world", "word", False, 2),  # "," and "!" are tokens
        ("Hello, world!", "Hello world", "word", True, 2 / 4),
        ("a b c d", "d c b a", "word", False, 4),  # word order matters
        ("", "", "char", True, 0.0),
    ],
)
def test_hand_examples(a, b, kind, normalized, want):
    got = pair_distances([a], [b], kind=kind, normalized=normalized)
    assert got.dtype == (np.float32 if normalized else np.int32)
    assert got[0] == pytest.approx(want, abs=1e-6)


def test_indel_metric():
    # LCS("kitten", "sitting") = "ittn": 2 deletions + 3 insertions.
    assert pair_distances(["kitten"], ["sitting"], normalized=False, metric="indel")[0] == 5
    assert pair_distances(["kitten"], ["sitting"], metric="indel")[0] == pytest.approx(5 / 13)


def test_tokenize_words():
    assert tokenize_words("Don't stop, 3.5 times!") == [
        "Don",
        "'",
        "t",
        "stop",
        ",",
        "3",
        ".",
        "5",
        "times",
        "!",
    ]


def _sentences(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    words = np.array(
        [
            "the",
            "a",
            "cat",
            "dog",
            "sat",
            "on",
            "mat",
            ",",
            ".",
            "quickly",
            "über",
            "naïve",
            "東京",
            "run",
            "ran",
        ]
    )
    return [" ".join(rng.choice(words, rng.integers(1, 25))) for _ in range(n)]


@pytest.mark.parametrize("kind", ["char", "word"])
@pytest.mark.parametrize("normalized", [True, False])
@pytest.mark.parametrize("metric", ["levenshtein", "indel"])
def test_vectorised_paths_match_a_per_pair_loop(kind, normalized, metric):
    a = _sentences(300, 0)
    b = _sentences(300, 1)
    module = Levenshtein if metric == "levenshtein" else Indel
    fn = module.normalized_distance if normalized else module.distance
    unit = (lambda s: s) if kind == "char" else tokenize_words
    want = np.array([fn(unit(x), unit(y)) for x, y in zip(a, b, strict=True)])
    kw = dict(kind=kind, normalized=normalized, metric=metric)
    np.testing.assert_allclose(pair_distances(a, b, **kw), want, atol=1e-6)
    np.testing.assert_allclose(pair_distances(a, b, workers=1, **kw), want, atol=1e-6)
    cross = cross_distances(a[:20], b[:30], **kw)
    want_cross = np.array([[fn(unit(x), unit(y)) for y in b[:30]] for x in a[:20]])
    assert cross.shape == (20, 30)
    np.testing.assert_allclose(cross, want_cross, atol=1e-6)


@pytest.mark.parametrize("kind", ["char", "word"])
def test_pool_distances_pair_each_candidate_with_its_anchor(kind):
    anchors = _sentences(5, 2)
    sizes = [3, 0, 1, 4, 2]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    candidates = _sentences(int(offsets[-1]), 3)
    got = pool_distances(anchors, candidates, offsets, kind=kind)
    unit = (lambda s: s) if kind == "char" else tokenize_words
    want = [
        Levenshtein.normalized_distance(unit(anchors[i]), unit(c))
        for i in range(5)
        for c in candidates[offsets[i] : offsets[i + 1]]
    ]
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_word_encoding_falls_back_to_id_lists(monkeypatch):
    a = _sentences(50, 4)
    b = _sentences(50, 5)
    fast = pair_distances(a, b, kind="word", normalized=False)
    monkeypatch.setattr(edits, "_MAX_CODES", 3)
    encoded = encode_words(a[:2])
    assert isinstance(encoded[0][0], list)
    np.testing.assert_array_equal(pair_distances(a, b, kind="word", normalized=False), fast)
    sizes = [10, 0, 40]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    slow = pool_distances(a[:3], b, offsets, kind="word", normalized=False)
    monkeypatch.undo()
    np.testing.assert_array_equal(
        slow, pool_distances(a[:3], b, offsets, kind="word", normalized=False)
    )


def test_word_codes_skip_surrogates():
    assert edits._code(0xD7FF) == "\ud7ff"
    assert edits._code(0xD800) == "\ue000"


def test_bad_edit_inputs():
    with pytest.raises(ValueError, match="aligned"):
        pair_distances(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="kind"):
        pair_distances(["a"], ["b"], kind="byte")
    with pytest.raises(ValueError, match="metric"):
        pair_distances(["a"], ["b"], metric="hamming")
    with pytest.raises(ValueError, match="offsets"):
        pool_distances(["a"], ["b", "c"], np.array([0, 1]))
