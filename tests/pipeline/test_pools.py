"""Negative pools: inclusive band, exclusion rules and their counts, fallbacks, FAISS end to end."""

from __future__ import annotations

import numpy as np
import pytest
from pairforge.pipeline.science.pools import EXCLUSION_REASONS, build_negative_pools
from pairforge.pipeline.science.text import match_key
from pairforge.stages.mine.index import build_index, search

F32 = np.float32


def _one_anchor(texts, neighbours, scores, **kwargs):
    """Pools of anchor 0 with the given neighbour rows and cosines."""
    return build_negative_pools(
        np.array([neighbours]), np.array([scores], dtype=F32), np.array([0]), texts, **kwargs
    )


def test_band_edges_are_inclusive():
    texts = ["anchor sentence about cats"] + [f"unrelated sentence number {i}" for i in range(6)]
    below = np.nextafter(F32(0.25), F32(0))
    above = np.nextafter(F32(0.75), F32(1))
    pools = _one_anchor(texts, [1, 2, 3, 4, 5, 6], [0.75, above, 0.5, 0.25, below, 0.9])
    ids, cos = pools.pool(0)
    assert ids.tolist() == [1, 3, 4]
    assert cos.tolist() == [0.75, 0.5, 0.25]
    assert pools.excluded["below_band"].tolist() == [1]
    assert pools.excluded["above_band"].tolist() == [2]


def test_band_is_configurable():
    texts = ["anchor"] + [f"other text {i}" for i in range(3)]
    pools = _one_anchor(texts, [1, 2, 3], [0.1, 0.5, 0.85], low=0.0, high=0.9)
    assert pools.pool(0)[0].tolist() == [1, 2, 3]


def test_each_exclusion_rule_and_its_count():
    texts = [
        "The quick brown fox jumps over the lazy dog.",  # 0 anchor
        "  the QUICK brown fox jumps over the lazy dog. ",  # 1 exact duplicate once normalised
        "The quick brown fox jumped over the lazy dog.",  # 2 near duplicate (ratio ~98)
        "A fast brown fox leaps over a sleepy dog.",  # 3 the anchor's own augmentation
        "Stock markets fell sharply on Monday morning.",  # 4 good negative
        "stock markets fell sharply on monday morning.",  # 5 repeats 4's text
        "Heavy rain is expected across the north tonight.",  # 6 good negative
    ]
    neighbours = [0, 1, 2, 3, 4, 5, 6, -1]
    scores = [1.0, 0.99, 0.5, 0.5, 0.5, 0.5, 0.3, -np.inf]
    augs = {0: ["A fast brown fox leaps over a sleepy dog."]}
    pools = _one_anchor(texts, neighbours, scores, own_augmentations=augs)
    assert pools.pool(0)[0].tolist() == [4, 6]
    counts = {reason: int(pools.excluded[reason][0]) for reason in EXCLUSION_REASONS}
    assert counts == {
        "missing": 1,
        "self": 1,
        "exact_duplicate": 1,
        "own_augmentation": 1,
        "near_duplicate": 1,
        "repeated_text": 1,
        "below_band": 0,
        "above_band": 0,
    }
    # Aligned-sequence form of the augmentations, and a stricter near-duplicate threshold.
    strict = _one_anchor(
        texts, neighbours, scores, own_augmentations=[augs[0]], near_duplicate_threshold=99.5
    )
    assert strict.pool(0)[0].tolist() == [2, 4, 6]
    assert strict.excluded["near_duplicate"].tolist() == [0]


def test_augmentations_belong_to_their_own_anchor():
    texts = ["first anchor text here", "second anchor text there", "shared paraphrase sentence"]
    ids = np.array([[2], [2]])
    scores = np.array([[0.5], [0.5]], dtype=F32)
    pools = build_negative_pools(
        ids, scores, np.array([0, 1]), texts, {0: ["Shared  paraphrase sentence"]}
    )
    assert pools.pool(0)[0].tolist() == []  # anchor 0's augmentation (after normalisation)
    assert pools.pool(1)[0].tolist() == [2]  # a legitimate negative of anchor 1


def test_match_key():
    assert match_key("  Hello\tWORLD \u00a0 again ") == "hello world again"
    assert match_key("ﬁne") == "fine"  # NFKC folds the ligature


def test_fallback_none_keeps_short_pools_and_reports_them():
    texts = ["anchor one", "anchor two", "neg a", "neg b", "neg c"]
    ids = np.array([[2, 3], [4, 2]])
    scores = np.array([[0.5, 0.9], [0.5, 0.6]], dtype=F32)
    pools = build_negative_pools(ids, scores, np.array([0, 1]), texts, m=2)
    assert pools.sizes.tolist() == [1, 2]
    assert pools.was_short.tolist() == [True, False]
    assert pools.short.tolist() == [True, False]
    assert pools.fallback.tolist() == ["none", "none"]


def test_fallback_widen_records_the_band_it_used():
    texts = ["anchor one", "anchor two", "neg a", "neg b", "neg c", "neg d", "neg e"]
    ids = np.array([[2, 3, 4], [5, 6, 2]])
    scores = np.array([[0.8, 0.85, 0.95], [0.5, 0.6, 0.1]], dtype=F32)
    pools = build_negative_pools(ids, scores, np.array([0, 1]), texts, m=2, fallback="widen")
    assert pools.pool(0)[0].tolist() == [2, 3]  # needed two steps of 0.05 to reach 0.85
    assert pools.band_high.tolist() == [F32(0.85), F32(0.75)]
    assert pools.band_low.tolist() == [F32(0.15), F32(0.25)]
    assert pools.fallback.tolist() == ["widen", "none"]
    assert pools.was_short.tolist() == [True, False]
    assert pools.short.tolist() == [False, False]
    assert pools.excluded["above_band"].tolist() == [1, 0]  # 0.95 stays out of the widened band
    assert pools.excluded["below_band"].tolist() == [0, 1]


def test_widen_stops_at_its_limits():
    texts = ["anchor", "neg a", "neg b"]
    pools = _one_anchor(texts, [1, 2], [0.5, 0.95], m=2, fallback="widen")
    assert pools.pool(0)[0].tolist() == [1]
    assert pools.short.tolist() == [True]
    assert pools.band_high.tolist() == [F32(0.9)]
    assert pools.band_low.tolist() == [F32(-1.0)]
    wider = _one_anchor(texts, [1, 2], [0.5, 0.95], m=2, fallback="widen", widen_limits=(0.0, 1.0))
    assert wider.pool(0)[0].tolist() == [1, 2]
    with pytest.raises(ValueError, match="widen_limits"):
        _one_anchor(texts, [1, 2], [0.5, 0.95], fallback="widen", widen_limits=(0.3, 0.9))


def _random_fill_corpus():
    """Anchor 0, rows that must never fill its pool, and three acceptable fillers (rows 40-42)."""
    rng = np.random.default_rng(0)
    d = 16
    anchor_vec = np.eye(d)[0]
    texts = ["the committee approved the new budget for the city parks"]
    vectors = [anchor_vec]
    bad_rows: dict[str, list[int]] = {}

    def add(kind, text, vec):
        bad_rows.setdefault(kind, []).append(len(texts))
        texts.append(text)
        vectors.append(vec)

    orth = lambda: np.concatenate([[0.0], rng.standard_normal(d - 1)])  # noqa: E731 (cos 0)
    for i in range(10):
        add("exact", "The committee approved the new budget for the city parks" + " " * i, orth())
    for i in range(10):
        add("augmentation", f"the city council passed a fresh budget {i}", orth())
    for i in range(10):
        add(
            "near",
            f"the committee approved the new budget for the city park{'s' * (i % 2)}{i}",
            orth(),
        )
    for i in range(9):
        # Distinct texts, but almost the anchor's direction: cos 0.99 > high, a likely false negative.
        add("too_similar", f"completely different wording number {i}", anchor_vec + 0.1 * orth())
    good = []
    for i in range(3):
        good.append(len(texts))
        texts.append(f"a dog barked at the mail carrier this morning {i}")
        vectors.append(orth())
    vectors = np.array(vectors)
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(F32)
    augs = {0: [texts[j] for j in bad_rows["augmentation"]]}
    return texts, vectors, augs, good


def test_fallback_random_fills_only_with_acceptable_sentences():
    texts, vectors, augs, good = _random_fill_corpus()
    assert len(texts) == 43
    for seed in range(10):
        pools = _one_anchor(
            texts,
            [0, 1],
            [1.0, 0.99],
            own_augmentations=augs,
            m=2,
            fallback="random",
            vectors=vectors,
            seed=seed,
        )
        ids, cos = pools.pool(0)
        assert len(ids) == 2 and len(set(ids.tolist())) == 2
        assert set(ids.tolist()) <= set(good), f"seed {seed} filled with {ids}"
        np.testing.assert_allclose(cos, vectors[ids] @ vectors[0], atol=1e-6)
        assert pools.from_random.tolist() == [True, True]
        assert pools.fallback.tolist() == ["random"]
        assert pools.was_short.tolist() == [True] and pools.short.tolist() == [False]


def test_random_fill_tops_up_after_retrieved_candidates():
    texts, vectors, augs, good = _random_fill_corpus()
    kwargs = dict(own_augmentations=augs, m=3, fallback="random", vectors=vectors, seed=3)
    pools = _one_anchor(texts, [good[0]], [0.4], **kwargs)
    got = pools.pool(0)[0].tolist()
    assert got[0] == good[0]  # the retrieved candidate keeps its place, fills come after
    assert sorted(got) == good
    assert pools.from_random.tolist() == [False, True, True]


def test_random_fill_depends_on_seed_and_anchor_not_on_the_batch():
    rng = np.random.default_rng(9)
    n = 300
    texts = [" ".join(rng.choice(list("abcdefghij"), 12)) + f" {i}" for i in range(n)]
    x = rng.standard_normal((n, 32))
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(F32)
    kwargs = dict(m=6, fallback="random", vectors=x, near_duplicate_threshold=None)
    empty = np.full((1, 1), -1)
    no_score = np.full((1, 1), -np.inf, dtype=F32)
    alone = build_negative_pools(empty, no_score, np.array([7]), texts, seed=1, **kwargs)
    # Two other short anchors draw before anchor 7 in this batch.
    batched = build_negative_pools(
        np.full((3, 1), -1),
        np.full((3, 1), -np.inf, dtype=F32),
        np.array([3, 5, 7]),
        texts,
        seed=1,
        **kwargs,
    )
    other_seed = build_negative_pools(empty, no_score, np.array([7]), texts, seed=2, **kwargs)
    assert alone.sizes.tolist() == [6]
    assert batched.pool(2)[0].tolist() == alone.pool(0)[0].tolist()
    assert other_seed.pool(0)[0].tolist() != alone.pool(0)[0].tolist()
    assert batched.pool(0)[0].tolist() != batched.pool(2)[0].tolist()


def test_random_fallback_needs_vectors():
    with pytest.raises(ValueError, match="needs the corpus vectors"):
        _one_anchor(["a", "b"], [1], [0.5], fallback="random")


def test_bad_pool_inputs():
    texts = ["a", "b", "c"]
    with pytest.raises(ValueError, match=r"must both be \(b, k\)"):
        build_negative_pools(np.array([[1, 2]]), np.array([[0.5]]), np.array([0]), texts)
    with pytest.raises(ValueError, match="NaN"):
        build_negative_pools(np.array([[1]]), np.array([[np.nan]]), np.array([0]), texts)
    with pytest.raises(ValueError, match="row numbers"):
        build_negative_pools(np.array([[7]]), np.array([[0.5]]), np.array([0]), texts)
    with pytest.raises(ValueError, match="fallback"):
        build_negative_pools(np.array([[1]]), np.array([[0.5]]), np.array([0]), texts, fallback="x")


def test_end_to_end_with_faiss():
    rng = np.random.default_rng(5)
    n, d = 400, 8
    x = rng.standard_normal((n, d))
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(F32)
    texts = [f"sentence {i} " + "word " * (i % 7) for i in range(n)]
    scores, ids = search(build_index(x), x[:50], 40)
    pools = build_negative_pools(
        ids, scores, np.arange(50), texts, m=2, near_duplicate_threshold=None
    )
    assert pools.excluded["self"].tolist() == [1] * 50
    assert np.all((pools.cosines >= 0.25) & (pools.cosines <= 0.75))
    for i in range(50):
        cand, cos = pools.pool(i)
        assert i not in cand.tolist()
        np.testing.assert_allclose(cos, x[cand] @ x[i], atol=1e-5)
        # Every in-band neighbour retrieved is in the pool.
        want = ids[i][(scores[i] >= 0.25) & (scores[i] <= 0.75)]
        assert cand.tolist() == want.tolist()
    assert pools.counts()["candidates"] == pools.offsets[-1]
