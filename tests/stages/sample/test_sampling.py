"""Seeded sampling without replacement: frequencies follow P (chi-square), edge cases, determinism."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from pairforge.stages.sample.ipw import negative_probs, sample_pools, sample_without_replacement
from scipy.stats import chisquare

P = np.array([0.4, 0.3, 0.2, 0.1])
N_DRAWS = 20_000
ALPHA = 1e-3


def _draws(p: np.ndarray, m: int, seed: int) -> np.ndarray:
    """Draw m from N_DRAWS independent copies of the pool; (N_DRAWS, m) local indices."""
    n = p.size
    offsets = np.arange(N_DRAWS + 1) * n
    drawn = sample_pools(np.tile(p, N_DRAWS), offsets, m, np.random.default_rng(seed))
    assert np.all(np.diff(drawn.offsets) == m)
    return (drawn.indices - offsets[:-1].repeat(m)).reshape(N_DRAWS, m)


def _first_draw_pvalue(expected_p: np.ndarray, draws: np.ndarray) -> float:
    observed = np.bincount(draws[:, 0], minlength=expected_p.size)
    return chisquare(observed, N_DRAWS * expected_p).pvalue


def test_first_draw_frequencies_match_p():
    draws = _draws(P, 2, seed=11)
    assert _first_draw_pvalue(P, draws) > ALPHA


def test_the_same_check_rejects_a_wrong_distribution():
    draws = _draws(P, 2, seed=11)
    wrong = np.array([0.37, 0.32, 0.2, 0.11])  # off by 3 points on two candidates
    assert _first_draw_pvalue(wrong, draws) < ALPHA
    assert _first_draw_pvalue(np.full(4, 0.25), draws) < ALPHA


def test_second_draw_follows_p_renormalised_over_the_rest():
    draws = _draws(P, 2, seed=12)
    pairs = list(itertools.permutations(range(P.size), 2))
    expected = np.array([P[i] * P[j] / (1 - P[i]) for i, j in pairs])
    code = {pair: c for c, pair in enumerate(pairs)}
    observed = np.bincount([code[(a, b)] for a, b in draws.tolist()], minlength=len(pairs))
    assert chisquare(observed, N_DRAWS * expected).pvalue > ALPHA
    # With replacement (or a scheme that ignores the first draw) this expectation is wrong.
    with_replacement = np.array([P[i] * P[j] for i, j in pairs])
    with_replacement /= with_replacement.sum()
    assert chisquare(observed, N_DRAWS * with_replacement).pvalue < ALPHA


def test_ipw_probabilities_drive_the_draws():
    edit = np.array([0.3, 0.7, 0.5])
    cos = np.array([0.7, 0.35, 0.45])
    p = negative_probs(edit, cos, temperature=0.1)
    draws = _draws(p, 1, seed=13)
    assert _first_draw_pvalue(p, draws) > ALPHA


@pytest.mark.parametrize("m", [1, 2, 5])
def test_draws_are_distinct_and_inside_their_pool(m):
    sizes = np.array([3, 0, 1, 6, 2, 9])
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    p = np.random.default_rng(0).uniform(0.1, 1.0, offsets[-1])
    drawn = sample_pools(p, offsets, m, 5)
    np.testing.assert_array_equal(np.diff(drawn.offsets), np.minimum(sizes, m))
    np.testing.assert_array_equal(drawn.short, sizes < m)
    for i in range(sizes.size):
        got = drawn.indices[drawn.offsets[i] : drawn.offsets[i + 1]]
        assert len(set(got.tolist())) == got.size
        assert np.all((got >= offsets[i]) & (got < offsets[i + 1]))


def test_short_pool_returns_everything_and_says_so():
    sample = sample_without_replacement(np.array([0.7, 0.3]), 3, np.random.default_rng(0))
    assert sorted(sample.indices.tolist()) == [0, 1]
    assert sample.short is True
    full = sample_without_replacement(np.array([0.2, 0.3, 0.5]), 2, np.random.default_rng(0))
    assert full.indices.size == 2 and full.short is False


def test_zero_weight_candidates_are_never_drawn():
    p = np.array([0.0, 0.5, 0.0, 0.5])
    for seed in range(50):
        sample = sample_without_replacement(p, 3, seed)
        assert sorted(sample.indices.tolist()) == [1, 3]
        assert sample.short


def test_seeded_and_reproducible():
    p = np.tile(P, 100)
    offsets = np.arange(101) * 4
    a = sample_pools(p, offsets, 2, np.random.default_rng(42))
    b = sample_pools(p, offsets, 2, np.random.default_rng(42))
    c = sample_pools(p, offsets, 2, np.random.default_rng(43))
    np.testing.assert_array_equal(a.indices, b.indices)
    assert not np.array_equal(a.indices, c.indices)


def test_bad_sampling_inputs():
    with pytest.raises(ValueError, match="empty pool"):
        sample_without_replacement(np.array([]), 2, 0)
    with pytest.raises(ValueError, match="m must be a positive integer"):
        sample_without_replacement(np.array([1.0]), 0, 0)
    with pytest.raises(ValueError, match="non-negative"):
        sample_without_replacement(np.array([0.5, -0.1]), 1, 0)
    with pytest.raises(TypeError, match="Generator"):
        sample_without_replacement(np.array([1.0]), 1, "seed")
