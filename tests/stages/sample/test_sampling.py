"""Seeded sampling without replacement: frequencies follow P (chi-square), edge cases, determinism,
and the keyed draws (each candidate's number hashed from its anchor and itself)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from pairforge.stages.sample.ipw import (
    keyed_exponentials,
    negative_probs,
    sample_pools,
    sample_without_replacement,
)
from scipy.stats import chisquare, kstest

P = np.array([0.4, 0.3, 0.2, 0.1])
N_DRAWS = 20_000
ALPHA = 1e-3


def _draws(p: np.ndarray, m: int, seed: int, keyed: bool = False) -> np.ndarray:
    """Draw m from N_DRAWS independent copies of the pool; (N_DRAWS, m) local indices. ``keyed``:
    with :func:`keyed_exponentials` (copy i is anchor i, its candidates keyed 0..n-1)."""
    n = p.size
    offsets = np.arange(N_DRAWS + 1) * n
    rng = np.random.default_rng(seed)
    if keyed:
        anchors, cands = np.repeat(np.arange(N_DRAWS), n), np.tile(np.arange(n), N_DRAWS)
        rng = keyed_exponentials(seed, 0, anchors, cands)
    drawn = sample_pools(np.tile(p, N_DRAWS), offsets, m, rng)
    assert np.all(np.diff(drawn.offsets) == m)
    return (drawn.indices - offsets[:-1].repeat(m)).reshape(N_DRAWS, m)


def _first_draw_pvalue(expected_p: np.ndarray, draws: np.ndarray) -> float:
    observed = np.bincount(draws[:, 0], minlength=expected_p.size)
    return chisquare(observed, N_DRAWS * expected_p).pvalue


@pytest.mark.parametrize("keyed", [False, True])
def test_first_draw_frequencies_match_p(keyed):
    draws = _draws(P, 2, seed=11, keyed=keyed)
    assert _first_draw_pvalue(P, draws) > ALPHA


def test_the_same_check_rejects_a_wrong_distribution():
    draws = _draws(P, 2, seed=11)
    wrong = np.array([0.37, 0.32, 0.2, 0.11])  # off by 3 points on two candidates
    assert _first_draw_pvalue(wrong, draws) < ALPHA
    assert _first_draw_pvalue(np.full(4, 0.25), draws) < ALPHA


@pytest.mark.parametrize("keyed", [False, True])
def test_second_draw_follows_p_renormalised_over_the_rest(keyed):
    draws = _draws(P, 2, seed=12, keyed=keyed)
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
    with pytest.raises(ValueError, match="shape"):
        sample_pools(np.ones(4), np.array([0, 4]), 1, np.ones(3))
    with pytest.raises(ValueError, match="1-D of one length"):
        keyed_exponentials(0, 0, np.arange(3), np.arange(4))


def test_keyed_exponentials_are_exp1_and_a_function_of_their_key_alone():
    anchors, cands = np.repeat(np.arange(200), 50), np.tile(np.arange(50), 200)
    e = keyed_exponentials(3, 0, anchors, cands)
    assert np.all(np.isfinite(e)) and np.all(e > 0)
    assert kstest(e, "expon").pvalue > ALPHA
    assert kstest(e * 1.1, "expon").pvalue < ALPHA  # the check can tell a wrong scale
    # Reordered, subset or alone: each pair keeps its number.
    order = np.random.default_rng(0).permutation(e.size)
    np.testing.assert_array_equal(keyed_exponentials(3, 0, anchors[order], cands[order]), e[order])
    np.testing.assert_array_equal(keyed_exponentials(3, 0, anchors[7:8], cands[7:8]), e[7:8])
    # Seed, stream, and which side of the pair a key is on each give other numbers.
    for other in (
        keyed_exponentials(4, 0, anchors, cands),
        keyed_exponentials(3, 1, anchors, cands),
        keyed_exponentials(3, 0, cands, anchors),
    ):
        assert np.mean(other == e) < 0.01
    assert not np.array_equal(
        keyed_exponentials(0, 1, [5], [7]), keyed_exponentials(1, 0, [5], [7])
    )


def _pools_drawn(pools: list[list[int]], rng) -> list[list[int]]:
    """Draw 2 of each pool (candidate keys, uniform P); the drawn keys per pool."""
    flat = np.array([c for pool in pools for c in pool])
    offsets = np.concatenate([[0], np.cumsum([len(pool) for pool in pools])])
    if rng == "keyed":
        anchors = np.repeat(np.arange(len(pools)), np.diff(offsets))
        rng = keyed_exponentials(0, 0, anchors, flat)
    drawn = sample_pools(np.ones(flat.size), offsets, 2, rng)
    return [flat[drawn.indices[a:b]].tolist() for a, b in itertools.pairwise(drawn.offsets)]


def test_keyed_draws_change_only_where_a_pool_changed():
    """What another machine's last bits do to pools (a neighbour in or out at the band's edge,
    two near-equal cosines in the other order): keyed, only that anchor's draw may change; from
    one generator, every later pool's draw shifts with the first pool whose length changed."""
    rng = np.random.default_rng(1)
    pools = [
        rng.choice(1000, size=rng.integers(20, 40), replace=False).tolist() for _ in range(300)
    ]
    changed = [list(pool) for pool in pools]
    changed[10] = changed[10][:-1]  # one neighbour fewer
    changed[20] = changed[20][::-1]  # the same neighbours in another order
    a, b = _pools_drawn(pools, "keyed"), _pools_drawn(changed, "keyed")
    assert [i for i in range(300) if a[i] != b[i]] in ([], [10])
    a, b = (
        _pools_drawn(pools, np.random.default_rng(5)),
        _pools_drawn(changed, np.random.default_rng(5)),
    )
    assert sum(a[i] != b[i] for i in range(11, 300)) > 250
