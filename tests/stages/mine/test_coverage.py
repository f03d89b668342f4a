"""Band coverage: the search grows past k until the band ends or the cap, on constructed vectors
whose band holds far more sentences than k."""

from __future__ import annotations

import numpy as np
import pytest
from pairforge.stages.mine.index import build_index
from pairforge.stages.mine.searcher import Searcher, band_sizes


def _constructed(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Row 0 is the anchor e0; 300 rows at cosines spread over [0.3, 0.7] (the band), 40 above
    it (0.9) and 300 below it (0.05). Returns the vectors and each row's cosine to the anchor."""
    rng = np.random.default_rng(seed)
    d = 16
    cos = np.concatenate([[1.0], rng.uniform(0.3, 0.7, 300), np.full(40, 0.9), np.full(300, 0.05)])
    rest = rng.standard_normal((cos.size, d - 1))
    rest /= np.linalg.norm(rest, axis=1, keepdims=True)
    v = np.concatenate([cos[:, None], np.sqrt(1 - cos[:, None] ** 2) * rest], axis=1)
    return v.astype(np.float32), cos


def _in_band(found, low=0.25, high=0.75):
    ids = found.ids[0]
    keep = (ids > 0) & (found.scores[0] >= low) & (found.scores[0] <= high)
    return set(ids[keep].tolist())


def test_the_whole_band_is_reachable_up_to_the_cap():
    v, cos = _constructed()
    band = set(np.flatnonzero((cos >= 0.25) & (cos <= 0.75)).tolist())
    assert len(band) == 300
    assert band_sizes(v, np.array([0]), 0.25, 0.75).tolist() == [300]
    searcher = Searcher(build_index(v, "flat", use_gpu=False), v, k=64, batch=64)
    rows = np.array([0])

    fixed = searcher.band_neighbours(rows, 0.25, None)  # k only: the top of the band
    assert fixed.ids.shape == (1, 64) and fixed.capped.tolist() == [True]
    # The anchor and the 40 rows above the band come first: 23 of the 300 are reached.
    assert _in_band(fixed) == set(sorted(band, key=lambda j: -cos[j])[:23])

    grown = searcher.band_neighbours(rows, 0.25, 1000)  # the band ends before the cap
    assert _in_band(grown) == band and grown.capped.tolist() == [False]
    assert grown.searched[0] < len(v)  # stopped once a neighbour fell below the band

    capped = searcher.band_neighbours(rows, 0.25, 129)  # the cap ends the search first
    reached = _in_band(capped)
    assert capped.capped.tolist() == [True] and capped.searched.tolist() == [129]
    # The 129 nearest: the anchor, the 40 above the band, then the top 88 of the band.
    top88 = set(sorted(band, key=lambda j: -cos[j])[:88])
    assert reached == top88


def test_rows_grow_independently_and_padding_is_not_a_neighbour():
    v, cos = _constructed()
    searcher = Searcher(build_index(v, "flat", use_gpu=False), v, k=8, batch=64)
    # Band [0.6, 1]: row 0 (the anchor) has over 100 rows in it, row 400 (cos 0.05 to it) few.
    found = searcher.band_neighbours(np.array([0, 400]), 0.6, 1000)
    assert found.searched[0] > found.searched[1]
    assert _in_band(found, 0.6, 1.0) == set(np.flatnonzero(cos[1:] >= 0.6) + 1)
    width = found.ids.shape[1]
    for r in range(2):
        past = np.arange(width) >= found.searched[r]
        assert (found.ids[r, past] == -1).all() and np.isneginf(found.scores[r, past]).all()
        assert (found.ids[r, ~past] >= 0).all()


@pytest.mark.parametrize("block_bytes", [64, 1 << 26])
def test_band_sizes_are_exact_in_any_block_size(block_bytes):
    v, _ = _constructed(1)
    rows = np.array([0, 5, 300, 439])
    sims = v.astype(np.float64) @ v.astype(np.float64).T
    np.fill_diagonal(sims, np.nan)
    want = ((sims[rows] >= 0.25) & (sims[rows] <= 0.75)).sum(axis=1)
    assert band_sizes(v, rows, 0.25, 0.75, block_bytes).tolist() == want.tolist()
