"""Score, then draw: the DebCSE positive and negative pools of a batch of anchors, as Arrow columns.

``score_pools`` computes every score of eqs. 1-6 for every candidate of ragged pools (the edit
distance to the anchor, the cosine, S_sur, S_sem and P); ``draw`` samples ``m`` per pool without
replacement from P; ``gather`` turns the draws into the list columns of the ``pairs`` schema.
``pick_route`` chooses the one candidate per anchor that the single-view objectives read
(DenoSent's back-translation, BSL's two views). Nothing here touches files.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pairforge.stages.sample.ipw import (
    IPW_FORMS,
    PoolSample,
    calibrated_probs,
    negative_probs,
    pool_entropy_ratios,
    positive_probs,
    sample_pools,
    semantic_scores,
    surface_scores,
)

__all__ = ["ScoredPools", "draw", "gather", "pick_route", "ragged_list", "score_pools"]


@dataclass(frozen=True)
class ScoredPools:
    """Every candidate of ragged pools with its scores; per-candidate arrays have shape ``(N,)``."""

    offsets: np.ndarray  # (b + 1,) int64
    edit: np.ndarray  # (N,) edit distance to the anchor
    cos: np.ndarray  # (N,) cosine to the anchor
    s_sur: np.ndarray  # (N,) eq. 1
    s_sem: np.ndarray  # (N,) eq. 2
    prob: np.ndarray  # (N,) eq. 4 (negatives) or eq. 6 (positives)

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def entropy(self) -> np.ndarray:
        """H(P) / log(n) per pool, ``(b,)``; NaN for an empty pool, 1.0 for a single candidate."""
        return pool_entropy_ratios(self.prob, self.offsets)


def score_pools(
    edit: np.ndarray,
    cos: np.ndarray,
    offsets: np.ndarray,
    side: str,
    lam: float,
    temperature: float = 1.0,
    ipw: str = "paper",
) -> ScoredPools:
    """Scores of ragged pools: ``side`` is ``negative`` (eqs. 1-4, ``lam`` = λn) or ``positive``
    (eqs. 1, 2, 5, 6, ``lam`` = λp). ``ipw="paper"``: the equations as printed, ``temperature``
    dividing every softmax's logits (1 = paper). ``ipw="calibrated"``: P from z-scored edit and
    cosine at temperature τ (``ipw.calibrated_probs``); ``ipw="uniform"``: P = 1/n within each
    pool, the debiasing off (the band still chose the pool; benchmarks/quality.py's control).
    For both, ``s_sur``/``s_sem`` stay eqs. 1-2 at temperature 1, for the audit."""
    if ipw not in IPW_FORMS:
        raise ValueError(f"ipw must be one of {', '.join(IPW_FORMS)}, got {ipw!r}")
    edit = np.asarray(edit, dtype=np.float64)
    cos = np.asarray(cos, dtype=np.float64)
    offsets = np.asarray(offsets, dtype=np.int64)
    paper_t = temperature if ipw == "paper" else 1.0
    s_sur = surface_scores(edit, offsets, paper_t)  # eq. 1
    s_sem = semantic_scores(cos, offsets, paper_t)  # eq. 2
    if ipw == "uniform":
        sizes = np.diff(offsets)  # (n_pools,)
        prob = np.repeat(1.0 / np.maximum(sizes, 1), sizes)  # (N,)
    elif ipw == "calibrated":
        prob = calibrated_probs(edit, cos, offsets, side, lam, temperature)
    elif side == "negative":
        prob = negative_probs(edit, cos, offsets, lam, temperature)  # eqs. 3-4
    elif side == "positive":
        prob = positive_probs(edit, cos, offsets, lam, temperature)  # eqs. 5-6
    else:
        raise ValueError(f"side must be 'negative' or 'positive', got {side!r}")
    return ScoredPools(offsets, edit, cos, s_sur, s_sem, prob)


def draw(scored: ScoredPools, m: int, rng: np.random.Generator | np.ndarray) -> PoolSample:
    """Up to ``m`` candidates per pool, without replacement, with probability P (draw order)."""
    return sample_pools(scored.prob, scored.offsets, m, rng)


def ragged_list(offsets: np.ndarray, values: pa.Array) -> pa.ListArray:
    return pa.ListArray.from_arrays(pa.array(np.asarray(offsets, dtype=np.int32)), values)


def gather(scored: ScoredPools, drawn: PoolSample, side: str) -> dict[str, pa.Array]:
    """The ``<side>_<score>`` list columns of the drawn candidates, plus pool size and entropy."""
    idx = drawn.indices
    cols: dict[str, pa.Array] = {}
    for name in ("cos", "edit", "s_sur", "s_sem", "prob"):
        values = getattr(scored, name)[idx].astype(np.float32)
        cols[f"{side}_{name}"] = ragged_list(drawn.offsets, pa.array(values, pa.float32()))
    cols[f"{side}_pool_size"] = pa.array(scored.sizes.astype(np.int32), pa.int32())
    entropy = scored.entropy().astype(np.float32)
    cols[f"{side}_entropy"] = pa.array(entropy, pa.float32(), mask=np.isnan(entropy))
    return cols


def pick_route(
    anchor: np.ndarray,
    routes: np.ndarray,
    noises: np.ndarray,
    prob: np.ndarray,
    route: str,
    n_anchors: int,
) -> np.ndarray:
    """For each anchor, the position of its best candidate of ``route``, or -1 when it has none.

    Candidates are given flat with their anchor (``anchor``, ints in ``[0, n_anchors)``). Best:
    a candidate without injected noise first (the plain back-translation the single-view papers
    trained on), then the highest ``prob`` (P_pos), then the earliest. Shape ``(n_anchors,)``.
    """
    out = np.full(n_anchors, -1, dtype=np.int64)
    pos = np.flatnonzero(routes == route)
    if not pos.size:
        return out
    plain = noises[pos] == "none"
    # lexsort: last key first; earliest position breaks the remaining ties.
    order = np.lexsort((pos, -prob[pos], ~plain, anchor[pos]))
    ranked = pos[order]
    first = np.concatenate([[True], anchor[ranked][1:] != anchor[ranked][:-1]])
    out[anchor[ranked[first]]] = ranked[first]
    return out
