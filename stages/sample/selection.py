"""Which pool candidates may be drawn as negatives, and how they are drawn.

Two rules narrow each anchor's negative pool before the draw, each counted:

- **rank window** (``range_min``, ``range_max``, as sentence-transformers' ``mine_hard_negatives``):
  a candidate's rank is its place in the pool by cosine to the anchor, most similar first (0);
  only ranks in ``[range_min, range_max)`` stay (``range_max`` None: no upper bound);
- **positive-aware ceiling** (NV-Retriever's TopK-PercPos; sentence-transformers' margins): with
  ``s+`` the anchor's positive score, a candidate stays only if ``cos <= s+ - absolute_margin``
  and ``cos <= s+ * (1 - relative_margin)``. ``s+`` is the cosine of the anchor's best positive
  candidate (its most similar back-translation) under ``positive_reference: best``, and
  ``positive_score`` for an anchor without one, or for every anchor under ``fixed`` (dropout
  positives: the anchor itself, cosine 1).

Then the sampler draws ``m`` of what is left:

- ``ipw``: P from ``ipw`` (``paper``, ``calibrated`` or ``uniform``; ``stages/sample/ipw.py``);
- ``top``: the ``m`` most similar (no randomness);
- ``simans``: SimANS (Zhou et al. 2022), ``p ∝ exp(-a (cos - s+ - b)²)``: most weight on
  candidates whose cosine is near the positive's shifted by ``b``, the ambiguous zone between
  easy negatives and likely false ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pairforge.stages.sample.ipw import PoolSample, segment_ids


@dataclass(frozen=True)
class Selection:
    """What the rules kept of ragged pools: ``keep`` (N,) bool over the flat candidates, the
    kept ones' ``offsets`` (b + 1,) and the removals per rule."""

    keep: np.ndarray
    offsets: np.ndarray
    outside_window: int
    above_ceiling: int

    @property
    def kept(self) -> np.ndarray:
        """Flat positions of the kept candidates, (N_kept,)."""
        return np.flatnonzero(self.keep)


def pool_ranks(cos: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Each candidate's rank in its pool by cosine, most similar 0 (ties: earlier first), (N,)."""
    seg = segment_ids(offsets)
    order = np.lexsort((np.arange(cos.size), -cos, seg))
    ranks = np.empty(cos.size, dtype=np.int64)
    ranks[order] = np.arange(cos.size) - offsets[seg[order]]
    return ranks


def positive_scores(
    pos_cos: np.ndarray, pos_offsets: np.ndarray, reference: str, fixed: float
) -> np.ndarray:
    """Per anchor, ``s+``: its best positive's cosine (``best``; ``fixed`` where it has none),
    or ``fixed`` for every anchor. Shape ``(b,)`` float64."""
    b = len(pos_offsets) - 1
    out = np.full(b, fixed, dtype=np.float64)
    if reference == "fixed" or not pos_cos.size:
        return out
    sizes = np.diff(pos_offsets)
    has = sizes > 0
    best = np.maximum.reduceat(np.asarray(pos_cos, dtype=np.float64), pos_offsets[:-1][has])
    out[has] = best
    return out


def select(
    cos: np.ndarray,
    offsets: np.ndarray,
    s_pos: np.ndarray,
    range_min: int = 0,
    range_max: int | None = None,
    absolute_margin: float | None = None,
    relative_margin: float | None = None,
) -> Selection:
    """Apply the rank window, then the positive-aware ceiling (see the module docstring)."""
    cos = np.asarray(cos, dtype=np.float64)
    offsets = np.asarray(offsets, dtype=np.int64)
    seg = segment_ids(offsets)
    window = np.ones(cos.size, dtype=bool)
    if range_min or range_max is not None:  # ranks cost a sort: only when a window is set
        ranks = pool_ranks(cos, offsets)
        window = ranks >= range_min
        if range_max is not None:
            window &= ranks < range_max
    ceiling = np.full(cos.size, np.inf)
    ref = np.asarray(s_pos, dtype=np.float64)[seg]  # (N,) each candidate's anchor's s+
    if absolute_margin is not None:
        ceiling = np.minimum(ceiling, ref - absolute_margin)
    if relative_margin is not None:
        ceiling = np.minimum(ceiling, ref * (1.0 - relative_margin))
    under = cos <= ceiling
    keep = window & under
    counts = np.bincount(seg[keep], minlength=len(offsets) - 1)
    new_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return Selection(
        keep=keep,
        offsets=new_offsets,
        outside_window=int((~window).sum()),
        above_ceiling=int((window & ~under).sum()),
    )


def simans_probs(
    cos: np.ndarray, offsets: np.ndarray, s_pos: np.ndarray, a: float, b: float
) -> np.ndarray:
    """SimANS's weights within each pool, normalised per pool: ``exp(-a (cos - s+ - b)²)``."""
    seg = segment_ids(offsets)
    logits = -a * (np.asarray(cos, dtype=np.float64) - s_pos[seg] - b) ** 2  # (N,)
    if not logits.size:
        return logits
    sizes = np.diff(offsets)
    starts = offsets[:-1][sizes > 0]
    peak = np.full(len(sizes), 0.0)
    peak[sizes > 0] = np.maximum.reduceat(logits, starts)
    w = np.exp(logits - peak[seg])
    total = np.zeros(len(sizes))
    total[sizes > 0] = np.add.reduceat(w, starts)
    return w / total[seg]


def top_of_pools(cos: np.ndarray, offsets: np.ndarray, m: int) -> PoolSample:
    """The ``m`` most similar candidates of each pool (ties: earlier first), most similar
    first; ``short`` where a pool has fewer than ``m``."""
    ranks = pool_ranks(np.asarray(cos, dtype=np.float64), offsets)
    seg = segment_ids(offsets)
    chosen = np.flatnonzero(ranks < m)
    chosen = chosen[np.lexsort((ranks[chosen], seg[chosen]))]
    counts = np.bincount(seg[chosen], minlength=len(offsets) - 1)
    new_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return PoolSample(new_offsets, chosen.astype(np.int64), counts < m)
