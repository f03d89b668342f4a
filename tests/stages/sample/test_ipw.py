"""DebCSE eqs. 1-6 against hand-computed numbers, ragged vs per-pool agreement, entropy ratios."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pairforge.stages.sample.ipw import (
    entropy_ratio,
    negative_probs,
    pool_entropy_ratios,
    positive_probs,
    semantic_scores,
    surface_scores,
)

# A 3-candidate pool: normalised edit distances and cosines inside the [0.25, 0.75] band.
EDIT = [0.3, 0.7, 0.5]
COS = [0.7, 0.35, 0.45]


def _hand_softmax(xs: list[float]) -> list[float]:
    z = sum(math.exp(x) for x in xs)
    return [math.exp(x) / z for x in xs]


def test_eq1_eq2_hand_computed():
    z_edit = math.exp(0.3) + math.exp(0.7) + math.exp(0.5)
    z_cos = math.exp(0.7) + math.exp(0.35) + math.exp(0.45)
    want_sur = [1 - math.exp(0.3) / z_edit, 1 - math.exp(0.7) / z_edit, 1 - math.exp(0.5) / z_edit]
    want_sem = [math.exp(0.7) / z_cos, math.exp(0.35) / z_cos, math.exp(0.45) / z_cos]
    np.testing.assert_allclose(surface_scores(np.array(EDIT)), want_sur, rtol=0, atol=1e-12)
    np.testing.assert_allclose(semantic_scores(np.array(COS)), want_sem, rtol=0, atol=1e-12)


def test_negative_probs_hand_computed_and_nearly_uniform():
    s_sur = [1 - v for v in _hand_softmax(EDIT)]
    s_sem = _hand_softmax(COS)
    p_tilde = [
        0.2 * a + 0.8 * (1 - b) for a, b in zip(s_sur, s_sem, strict=True)
    ]  # eq. 3, lambda_n = 0.8
    want = _hand_softmax(p_tilde)  # eq. 4
    got = negative_probs(np.array(EDIT), np.array(COS))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    # METHODS.md's example: as printed the equations give P_neg = 0.319, 0.342, 0.339.
    assert np.round(got, 3).tolist() == [0.319, 0.342, 0.339]
    assert np.abs(got - 1 / 3).max() < 0.02
    assert entropy_ratio(got) > 0.999
    # Candidate 0 is the most similar in meaning (cos 0.7): the least likely negative.
    assert got.argmin() == 0


def test_positive_probs_hand_computed():
    s_sur = [1 - v for v in _hand_softmax(EDIT)]
    s_sem = _hand_softmax(COS)
    p_tilde = [
        0.2 * (1 - a) + 0.8 * b for a, b in zip(s_sur, s_sem, strict=True)
    ]  # eq. 5, lambda_p = 0.8
    want = _hand_softmax(p_tilde)  # eq. 6
    got = positive_probs(np.array(EDIT), np.array(COS))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    assert got.argmax() == 0  # closest in meaning: the most likely positive


def test_lambda_extremes_pick_the_right_signal():
    edit = np.array([0.1, 0.5, 0.9])
    cos = np.array([0.3, 0.5, 0.7])
    # Only semantics: negatives prefer low cos, positives high cos.
    assert np.all(np.diff(negative_probs(edit, cos, lambda_n=1.0)) < 0)
    assert np.all(np.diff(positive_probs(edit, cos, lambda_p=1.0)) > 0)
    # Only surface: negatives prefer small edits, positives large ones.
    assert np.all(np.diff(negative_probs(edit, cos, lambda_n=0.0)) < 0)
    assert np.all(np.diff(positive_probs(edit, cos, lambda_p=0.0)) > 0)


def test_temperature_sharpens_and_one_is_the_paper():
    edit = np.array(EDIT)
    cos = np.array(COS)
    np.testing.assert_array_equal(
        negative_probs(edit, cos), negative_probs(edit, cos, lambda_n=0.8, temperature=1.0)
    )
    sharp = negative_probs(edit, cos, temperature=0.05)
    assert entropy_ratio(sharp) < 0.8
    assert sharp.argmin() == 0
    # Temperature applies to eq. 4 too: P~ from the hand computation, divided by T.
    s_sur = [1 - v for v in _hand_softmax([e / 0.05 for e in EDIT])]
    s_sem = _hand_softmax([c / 0.05 for c in COS])
    p_tilde = [0.2 * a + 0.8 * (1 - b) for a, b in zip(s_sur, s_sem, strict=True)]
    np.testing.assert_allclose(sharp, _hand_softmax([p / 0.05 for p in p_tilde]), atol=1e-12)


def test_raw_distances_collapse_the_surface_softmax():
    # Raw character distances 12 and 25 are far apart, yet S_sur barely tells them apart:
    # the softmax puts almost all its mass on the 30, the reason edits.py normalises by default.
    s_sur = surface_scores(np.array([12.0, 30.0, 25.0]))
    assert s_sur[0] - s_sur[2] < 0.01
    assert s_sur[1] < 0.01


def test_ragged_matches_per_pool():
    rng = np.random.default_rng(3)
    sizes = [1, 4, 0, 7, 2, 0, 5]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    edit = rng.uniform(0, 1, offsets[-1])
    cos = rng.uniform(0.25, 0.75, offsets[-1])
    p_neg = negative_probs(edit, cos, offsets, lambda_n=0.6, temperature=0.3)
    p_pos = positive_probs(edit, cos, offsets, lambda_p=0.7, temperature=0.3)
    ratios = pool_entropy_ratios(p_neg, offsets)
    for i, n in enumerate(sizes):
        sl = slice(offsets[i], offsets[i + 1])
        if n == 0:
            assert math.isnan(ratios[i])
            continue
        want_neg = negative_probs(edit[sl], cos[sl], lambda_n=0.6, temperature=0.3)
        want_pos = positive_probs(edit[sl], cos[sl], lambda_p=0.7, temperature=0.3)
        np.testing.assert_allclose(p_neg[sl], want_neg, atol=1e-12)
        np.testing.assert_allclose(p_pos[sl], want_pos, atol=1e-12)
        assert p_neg[sl].sum() == pytest.approx(1.0)
        assert ratios[i] == pytest.approx(entropy_ratio(want_neg))


def test_single_candidate_pool():
    assert surface_scores(np.array([0.4])).tolist() == [0.0]
    assert negative_probs(np.array([0.4]), np.array([0.5])).tolist() == [1.0]
    assert entropy_ratio(np.array([1.0])) == 1.0


def test_entropy_ratio_values():
    assert entropy_ratio(np.full(4, 0.25)) == pytest.approx(1.0)
    assert entropy_ratio(np.array([1.0, 0.0, 0.0])) == 0.0
    assert entropy_ratio(np.array([0.5, 0.5, 0.0])) == pytest.approx(math.log(2) / math.log(3))


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="empty pool"):
        negative_probs(np.array([]), np.array([]))
    with pytest.raises(ValueError, match="empty pool"):
        entropy_ratio(np.array([]))
    with pytest.raises(ValueError, match="NaN"):
        negative_probs(np.array([0.1, np.nan]), np.array([0.3, 0.4]))
    with pytest.raises(ValueError, match="same shape"):
        positive_probs(np.array([0.1, 0.2]), np.array([0.3]))
    with pytest.raises(ValueError, match="lambda_n"):
        negative_probs(np.array([0.1]), np.array([0.3]), lambda_n=1.5)
    with pytest.raises(ValueError, match="temperature"):
        semantic_scores(np.array([0.3]), temperature=0.0)
    with pytest.raises(ValueError, match="offsets"):
        surface_scores(np.array([0.1, 0.2]), offsets=np.array([0, 3]))
