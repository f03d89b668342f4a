"""Calibrated IPW (z-scored edit and cosine, one softmax at temperature tau) against the paper's
equations, the per-pool effective number of candidates, and distinct texts per anchor."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.science.dataset_card import NEAR_UNIFORM, effective_number
from pairforge.pipeline.science.mining_inputs import ArrowTexts
from pairforge.stages.sample.edits import edit_scorer
from pairforge.stages.sample.ipw import (
    calibrated_probs,
    effective_numbers,
    entropy_ratio,
    negative_probs,
    pool_entropy_ratios,
    positive_probs,
)
from pairforge.stages.sample.pairs import score_pools
from pairforge.stages.sample.sampling import EDIT_INDEX, first_of_text, sample_shard
from pairforge.stages.sample.stage import SampleConfig

# One pool of 8 with a known ordering: candidate j has edit j/10 and cosine 0.3 + j/20, so the
# paper's negative direction (small edit, low cosine) ranks them 0 > 1 > ... > 7 and the
# positive direction the reverse.
EDIT = np.arange(8) / 10
COS = 0.3 + np.arange(8) / 20


def test_calibrated_is_sharper_than_the_paper_on_the_same_pool():
    paper = negative_probs(EDIT, COS)
    calibrated = calibrated_probs(EDIT, COS, side="negative", lam=0.8, temperature=0.5)
    assert entropy_ratio(paper) > NEAR_UNIFORM  # as printed: near-uniform
    assert entropy_ratio(calibrated) < 0.8
    assert np.all(np.diff(calibrated) < 0)  # the known ordering, strictly
    assert calibrated[0] / calibrated[-1] > 100  # and by a real amount
    pos = calibrated_probs(EDIT, COS, side="positive", lam=0.8, temperature=0.5)
    assert np.all(np.diff(pos) > 0)
    np.testing.assert_allclose(pos, calibrated[::-1], atol=1e-12)  # mirror image here
    # A lower temperature sharpens further; a higher one tends to uniform.
    h = [entropy_ratio(calibrated_probs(EDIT, COS, temperature=t)) for t in (0.25, 0.5, 1.0, 100.0)]
    assert h == sorted(h) and h[-1] > 0.9999


def test_calibrated_equation_by_hand_and_scale_invariance():
    ze = (EDIT - EDIT.mean()) / EDIT.std()
    zc = (COS - COS.mean()) / COS.std()
    logits = -(0.2 * ze + 0.8 * zc) / 0.5
    want = np.exp(logits - logits.max())
    want /= want.sum()
    got = calibrated_probs(EDIT, COS, side="negative", lam=0.8, temperature=0.5)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    # Standardised within the pool: a pool whose raw scores spread 10x less samples the same.
    small = calibrated_probs(EDIT / 10 + 0.2, COS / 10 + 0.5, side="negative", temperature=0.5)
    np.testing.assert_allclose(small, got, atol=1e-12)
    # A pool of equal scores has nothing to prefer: uniform, not NaN.
    flat = calibrated_probs(np.full(4, 0.5), np.full(4, 0.4), side="negative")
    np.testing.assert_allclose(flat, 0.25)


def test_ragged_calibrated_equals_per_pool():
    edit = np.concatenate([EDIT, [0.2, 0.9], [0.4]])
    cos = np.concatenate([COS, [0.5, 0.3], [0.6]])
    offsets = np.array([0, 8, 8, 10, 11])  # one empty pool
    got = calibrated_probs(edit, cos, offsets, "negative", 0.8, 0.5)
    for a, b in zip(offsets[:-1], offsets[1:], strict=True):
        if b > a:
            one = calibrated_probs(edit[a:b], cos[a:b], None, "negative", 0.8, 0.5)
            np.testing.assert_allclose(got[a:b], one, atol=1e-12)


def test_paper_option_is_exactly_the_old_equations():
    offsets = np.array([0, 5, 8])
    edit, cos = EDIT, COS
    for side, lam, old in (("negative", 0.8, negative_probs), ("positive", 0.7, positive_probs)):
        for t in (1.0, 0.3):
            scored = score_pools(edit, cos, offsets, side, lam, t, ipw="paper")
            np.testing.assert_array_equal(scored.prob, old(edit, cos, offsets, lam, t))
            assert score_pools(edit, cos, offsets, side, lam, t).prob.tolist() == (
                scored.prob.tolist()
            )  # the default is the paper's form
    with pytest.raises(ValueError, match="ipw must be"):
        score_pools(edit, cos, offsets, "negative", 0.8, 1.0, ipw="sharp")


def test_effective_numbers():
    p = np.array([0.25, 0.25, 0.25, 0.25, 1.0, 0.0, 0.5, 0.5, 1.0])
    offsets = np.array([0, 4, 6, 8, 9, 9])
    eff = effective_numbers(p, offsets)
    np.testing.assert_allclose(eff[:4], [4.0, 1.0, 2.0, 1.0])
    assert np.isnan(eff[4])
    ratio, eff2, share = effective_number(pool_entropy_ratios(p, offsets), np.diff(offsets))
    # Pools of fewer than 2 candidates are left out of the sharpness figures.
    np.testing.assert_allclose(ratio, [1.0, 0.0, 1.0])
    np.testing.assert_allclose(eff2, [4.0, 1.0, 2.0])
    np.testing.assert_allclose(share, [1.0, 0.5, 1.0])


# --- distinct texts per anchor -------------------------------------------------------------------


def test_first_of_text_groups_by_anchor_and_normalised_text():
    group = np.array([0, 0, 0, 0, 1, 1])
    texts = ["A cat sat.", "a  CAT sat.", "A dog sat.", "A cat sat.", "A cat sat.", "x"]
    assert first_of_text(group, texts).tolist() == [0, 0, 2, 0, 4, 5]


def _one_anchor_shard(texts: list[str]):
    """Anchor 0 with a two-sentence negative pool and the positive candidates ``texts``."""
    corpus = pa.array(["w1 w2 w3 w4", "n1 w2 n3 w4", "n5 n6 w3 w4"])
    ids = pa.array(["a0", "a1", "a2"])
    pools = pa.table(
        {
            S.ID: pa.array(["a0"]),
            S.ROW: pa.array([0], pa.int64()),
            S.POOL_ROWS: pa.array([[1, 2]], pa.list_(pa.int64())),
            S.POOL_IDS: pa.array([["a1", "a2"]], pa.list_(pa.string())),
            S.POOL_COS: pa.array([[0.4, 0.5]], pa.list_(pa.float32())),
            S.POOL_RANDOM: pa.array([[False, False]], pa.list_(pa.bool_())),
            S.BAND_LOW: pa.array([0.25], pa.float32()),
            S.BAND_HIGH: pa.array([0.75], pa.float32()),
            S.FALLBACK: pa.array(["none"]),
        }
    )
    n = len(texts)
    positives = pa.table(
        {
            S.ROW: pa.array([0] * n, pa.int64()),
            S.CANDIDATE_ID: pa.array([f"c{i}" for i in range(n)]),
            S.TEXT: pa.array(texts),
            S.ROUTE: pa.array(["en-zh-en", "en-de-en", "en-fr-en", "en-zh-en", "en-de-en"][:n]),
            S.NOISE: pa.array(["none"] * n),
            S.IDENTICAL: pa.array([False] * n),
            "cos": pa.array([0.8] * n, pa.float32()),
            EDIT_INDEX: pa.array(np.arange(n), pa.int64()),
        }
    )
    scorer = edit_scorer(corpus, pa.array(texts), backend="rapidfuzz", threads=1)
    return pools, positives, ArrowTexts(corpus), ids, scorer


@pytest.mark.parametrize("ipw", ["paper", "calibrated"])
def test_a_repeated_text_is_one_candidate_drawn_no_more_often(ipw):
    # A is produced by three routes (once in other casing); A, B and C are one word edit each
    # from the anchor at the same cosine, so each distinct text should be drawn 1/3 of the time.
    texts = ["x1 w2 w3 w4", "X1  w2 w3 w4", "w1 x2 w3 w4", "x1 w2 w3 w4", "w1 w2 x3 w4"]
    pools, positives, corpus, ids, scorer = _one_anchor_shard(texts)
    drawn_a = 0
    trials = 300
    for seed in range(trials):
        cfg = SampleConfig(m=2, m_positive=1, ipw=ipw, temperature=0.5, seed=seed)
        table, counts, _ = sample_shard(pools, positives, corpus, ids, scorer, cfg, 0)
        row = table.to_pylist()[0]
        assert row["positive_pool_size"] == 3 and counts["repeated_positive_text"] == 2
        drawn_a += row[S.POSITIVE_TEXTS][0].lower().split() == ["x1", "w2", "w3", "w4"]
    # Drawn per copy it would be 3/5; per distinct text it is 1/3 (binomial sd ~0.027).
    assert abs(drawn_a / trials - 1 / 3) < 0.07


def test_no_anchor_gets_the_same_text_twice():
    texts = ["x1 w2 w3 w4", "x1 w2 w3 w4", "w1 x2 w3 w4", "X1 w2 w3 w4", "w1 w2 x3 w4"]
    pools, positives, corpus, ids, scorer = _one_anchor_shard(texts)
    for seed in range(50):
        cfg = SampleConfig(m=2, m_positive=3, ipw="calibrated", temperature=0.5, seed=seed)
        row = sample_shard(pools, positives, corpus, ids, scorer, cfg, 0)[0].to_pylist()[0]
        got = [" ".join(t.lower().split()) for t in row[S.POSITIVE_TEXTS]]
        assert len(got) == 3 and len(set(got)) == 3
        assert len(set(row[S.NEGATIVE_TEXTS])) == len(row[S.NEGATIVE_TEXTS]) == 2
        # The single views keep their route's candidate even when its text repeats another's.
        assert row[S.VIEW2_ID] == "c2" and row[S.VIEW1_ID] in ("c1", "c4")
