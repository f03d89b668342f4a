"""DebCSE negative candidate pools (section 4.1): kNN neighbours in a cosine band, minus duplicates.

For each anchor, the pool is its retrieved neighbours whose cosine lies in ``[low, high]``
(inclusive; DebCSE's band is [0.25, 0.75]: below it negatives are too easy, above it they are likely
false negatives), after removing candidates that are not real negatives. All rules are scored
first and the pool decided after; a neighbour that fails several rules is counted once, under the
first it fails in this order (the keys of ``NegativePools.excluded``):

1. ``missing``: FAISS returned no neighbour in that slot (id -1).
2. ``self``: the anchor itself (it is usually its own nearest neighbour; search with k + 1).
3. ``exact_duplicate``: same normalised text as the anchor (:func:`pipeline.science.text.match_key`).
4. ``own_augmentation``: same normalised text as one of the anchor's own augmentations (its positive
   candidates), which must never come back as its negatives.
5. ``near_duplicate``: ``rapidfuzz.fuzz.ratio`` of the normalised texts >= ``near_duplicate_threshold``.
6. ``repeated_text``: same normalised text as a better-ranked candidate of the same pool.
7. ``below_band`` / ``above_band``: outside the band finally used for that anchor.

Anchors left with fewer than ``m`` candidates are ``was_short``; ``fallback`` then decides:

- ``"none"``: keep the short pool as it is.
- ``"widen"``: widen the band by ``widen_step`` on both sides, step by step, within
  ``widen_limits``, until ``m`` retrieved neighbours qualify (rules 1-6 still apply); the band
  reached is recorded in ``band_low``/``band_high``. Only retrieved neighbours can enter.
- ``"random"``: fill up to ``m`` with sentences drawn uniformly from the corpus that pass rules
  2-6 and lie at or below ``high`` (the false-negative guard; an easy negative is acceptable
  filler, a paraphrase is not). Their cosines are computed from ``vectors``; ``from_random`` marks
  them. The draws of an anchor depend only on ``seed`` and its id, not on the batch it came in.

Each anchor's ``fallback`` entry records the fallback that touched its pool ("none" if none did),
and ``short`` says whether it still has fewer than ``m`` candidates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np
from pairforge.pipeline.science.text import match_key

__all__ = [
    "EXCLUSION_REASONS",
    "Fallback",
    "NegativePools",
    "build_negative_pools",
]

Fallback = Literal["none", "widen", "random"]
FALLBACKS: tuple[str, ...] = ("none", "widen", "random")
EXCLUSION_REASONS: tuple[str, ...] = (
    "missing",
    "self",
    "exact_duplicate",
    "own_augmentation",
    "near_duplicate",
    "repeated_text",
    "below_band",
    "above_band",
)

# Rounds of random draws per short anchor before giving up (each round draws several ids).
_RANDOM_ROUNDS = 64


@dataclass(frozen=True)
class NegativePools:
    """Negative candidate pools of a batch of anchors, in ragged (Arrow list) layout.

    Pool ``i`` belongs to ``anchor_ids[i]`` and is ``candidate_ids[offsets[i]:offsets[i + 1]]``
    with cosines ``cosines[...]`` to the anchor, retrieved neighbours first in search order, then
    random fills. ``excluded[reason]`` counts, per anchor, the retrieved neighbours dropped for that
    reason (see the module docstring). Per-anchor arrays have shape ``(b,)``, per-candidate arrays
    ``(N,)`` with ``N == offsets[-1]``.
    """

    anchor_ids: np.ndarray  # (b,) int64
    offsets: np.ndarray  # (b + 1,) int64
    candidate_ids: np.ndarray  # (N,) int64
    cosines: np.ndarray  # (N,) float32
    from_random: np.ndarray  # (N,) bool
    band_low: np.ndarray  # (b,) float32, band actually used
    band_high: np.ndarray  # (b,) float32
    was_short: np.ndarray  # (b,) bool, fewer than m before any fallback
    short: np.ndarray  # (b,) bool, fewer than m after the fallback
    fallback: np.ndarray  # (b,) str, "none" | "widen" | "random"
    excluded: dict[str, np.ndarray]  # reason -> (b,) int64

    def __len__(self) -> int:
        return int(self.anchor_ids.size)

    @property
    def sizes(self) -> np.ndarray:
        """Number of candidates per pool, shape ``(b,)``."""
        return np.diff(self.offsets)

    def pool(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """``(candidate_ids, cosines)`` of pool ``i``."""
        sl = slice(self.offsets[i], self.offsets[i + 1])
        return self.candidate_ids[sl], self.cosines[sl]

    def counts(self) -> dict[str, int]:
        """Batch totals for the stage's metrics: anchors, candidates, shorts, fallbacks, exclusions."""
        out = {
            "anchors": len(self),
            "candidates": int(self.offsets[-1]),
            "random_candidates": int(self.from_random.sum()),
            "was_short": int(self.was_short.sum()),
            "short": int(self.short.sum()),
        }
        for name in FALLBACKS[1:]:
            out[f"fallback_{name}"] = int((self.fallback == name).sum())
        for reason in EXCLUSION_REASONS:
            out[f"excluded_{reason}"] = int(self.excluded[reason].sum())
        return out


def _check_inputs(
    neighbor_ids: np.ndarray,
    neighbor_scores: np.ndarray,
    anchor_ids: np.ndarray,
    n_texts: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ids = np.asarray(neighbor_ids)
    scores = np.asarray(neighbor_scores)
    anchors = np.asarray(anchor_ids)
    if ids.ndim != 2 or scores.shape != ids.shape:
        raise ValueError(
            f"neighbor_ids and neighbor_scores must both be (b, k), got {ids.shape} and {scores.shape}"
        )
    if anchors.shape != (ids.shape[0],):
        raise ValueError(f"anchor_ids must have shape ({ids.shape[0]},), got {anchors.shape}")
    if not np.issubdtype(ids.dtype, np.integer) or not np.issubdtype(anchors.dtype, np.integer):
        raise TypeError("neighbor_ids and anchor_ids must be integer arrays (corpus row numbers)")
    ids = ids.astype(np.int64, copy=False)
    anchors = anchors.astype(np.int64, copy=False)
    if anchors.size and (anchors.min() < 0 or anchors.max() >= n_texts):
        raise ValueError(f"anchor_ids must be row numbers in [0, {n_texts})")
    if ids.size and (ids.min() < -1 or ids.max() >= n_texts):
        raise ValueError(f"neighbor_ids must be row numbers in [0, {n_texts}) or -1 (missing)")
    scores = scores.astype(np.float32, copy=False)
    if np.isnan(scores).any() or np.isposinf(scores).any():
        raise ValueError("neighbor_scores contain NaN or +inf (check the embeddings)")
    return ids, scores, anchors


def _augmentation_lists(
    own_augmentations: Mapping[int, Iterable[str]] | Sequence[Iterable[str]] | None,
    anchors: np.ndarray,
) -> list[list[str]]:
    if own_augmentations is None:
        return [[] for _ in range(anchors.size)]
    if isinstance(own_augmentations, Mapping):
        return [list(own_augmentations.get(int(a), ())) for a in anchors]
    if len(own_augmentations) != anchors.size:
        raise ValueError(
            f"own_augmentations as a sequence must align with anchor_ids: "
            f"got {len(own_augmentations)} entries for {anchors.size} anchors"
        )
    return [list(augs) for augs in own_augmentations]


def build_negative_pools(
    neighbor_ids: np.ndarray,
    neighbor_scores: np.ndarray,
    anchor_ids: np.ndarray,
    texts: Sequence[str],
    own_augmentations: Mapping[int, Iterable[str]] | Sequence[Iterable[str]] | None = None,
    *,
    low: float = 0.25,
    high: float = 0.75,
    near_duplicate_threshold: float | None = 90.0,
    m: int = 2,
    fallback: Fallback = "none",
    widen_step: float = 0.05,
    widen_limits: tuple[float, float] = (-1.0, 0.9),
    vectors: np.ndarray | None = None,
    seed: int = 0,
    normalize: Callable[[str], str] = match_key,
    workers: int = -1,
    searched: np.ndarray | None = None,
) -> NegativePools:
    """Build the negative candidate pool of each anchor from its kNN results (see module doc).

    ``neighbor_ids`` / ``neighbor_scores``: ``(b, k)`` from ``index.search`` (row numbers of the
    corpus, cosines, -1 for a missing slot). ``anchor_ids``: ``(b,)`` corpus rows of the anchors.
    ``texts``: the corpus, ``texts[i]`` a str. ``own_augmentations``: each anchor's augmentation
    texts, as a mapping from anchor id or as a sequence aligned with ``anchor_ids``.
    ``near_duplicate_threshold`` is on fuzz.ratio's 0-100 scale (90 catches one-word edits of a
    ~10-word sentence while keeping sentences that merely share a clause); None skips rule 5.
    ``widen_limits`` bounds the "widen" fallback; its top (0.9 by default) keeps widening away from
    paraphrase territory.
    ``vectors`` (the corpus embeddings, float32, L2-normalised) is needed by ``fallback="random"``
    only. ``normalize`` maps a text to the form compared for duplicates; pass the ingest stage's
    normaliser to match its deduplication. ``searched`` ``(b,)``: how many slots of each row
    the search filled (a search grown for some rows pads the others with -1 past their width;
    those slots are not ``missing``); None: every slot.
    """
    n = len(texts)
    _check_settings(
        low, high, near_duplicate_threshold, m, fallback, widen_step, widen_limits, vectors, n
    )
    ids, scores, anchors = _check_inputs(neighbor_ids, neighbor_scores, anchor_ids, n)
    aug_norms = [
        {normalize(t) for t in row} for row in _augmentation_lists(own_augmentations, anchors)
    ]
    # Score: every rule on every retrieved neighbour.
    rules = _score_rules(
        ids, anchors, texts, aug_norms, near_duplicate_threshold, normalize, workers
    )
    # Decide: the band, then the fallback for short pools.
    band = _decide_band(rules.eligible, scores, (low, high), m, fallback, widen_step, widen_limits)
    extra: list[tuple[int, int, float]] = []  # (row, id, cos) of random fills
    if fallback == "random":
        extra = _random_fills(
            rules,
            ids,
            anchors,
            band,
            aug_norms,
            texts=texts,
            vectors=vectors,
            high=high,
            m=m,
            threshold=near_duplicate_threshold,
            normalize=normalize,
            seed=seed,
        )
    offsets, cand, cos, rand = _ragged(ids, scores, band.in_pool, extra)
    return NegativePools(
        anchor_ids=anchors,
        offsets=offsets,
        candidate_ids=cand,
        cosines=cos,
        from_random=rand,
        band_low=band.low,
        band_high=band.high,
        was_short=band.was_short,
        short=np.diff(offsets) < m,
        fallback=band.fallback.astype(str),
        excluded=_exclusions(rules, scores, band, searched),
    )


def _check_settings(
    low: float,
    high: float,
    near_duplicate_threshold: float | None,
    m: int,
    fallback: str,
    widen_step: float,
    widen_limits: tuple[float, float],
    vectors: np.ndarray | None,
    n_texts: int,
) -> None:
    """Raise ValueError naming the first of ``build_negative_pools``'s settings that is out of
    range: the band, the fallback and what it needs (widen limits and step, corpus vectors)."""
    if not (-1.0 <= low <= high <= 1.0):
        raise ValueError(f"band must satisfy -1 <= low <= high <= 1, got [{low}, {high}]")
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback must be one of {FALLBACKS}, got {fallback!r}")
    if not isinstance(m, (int, np.integer)) or m < 1:
        raise ValueError(f"m must be a positive integer, got {m!r}")
    if near_duplicate_threshold is not None and not 0.0 <= near_duplicate_threshold <= 100.0:
        raise ValueError(
            "near_duplicate_threshold is a fuzz.ratio score in [0, 100] (or None to skip the rule), "
            f"got {near_duplicate_threshold}"
        )
    lim_lo, lim_hi = widen_limits
    if fallback == "widen":
        if not (-1.0 <= lim_lo <= low and high <= lim_hi <= 1.0):
            raise ValueError(
                f"widen_limits {widen_limits} must contain the band [{low}, {high}] within [-1, 1]"
            )
        if not widen_step > 0:
            raise ValueError(f"widen_step must be positive, got {widen_step}")
    if fallback == "random":
        if vectors is None:
            raise ValueError(
                "fallback='random' needs the corpus vectors to compute the fills' cosines"
            )
        if vectors.ndim != 2 or vectors.shape[0] != n_texts:
            raise ValueError(
                f"vectors must be (len(texts)={n_texts}, d), got shape {np.shape(vectors)}"
            )


class _Band(NamedTuple):
    """The band each anchor's pool was decided with, and what it holds of the neighbours."""

    low: np.ndarray  # (b,) float32, band actually used
    high: np.ndarray  # (b,) float32
    in_pool: np.ndarray  # (b, k) bool, eligible and inside the anchor's band
    was_short: np.ndarray  # (b,) bool, fewer than m in the first band
    fallback: np.ndarray  # (b,) object, the fallback that touched the pool, "none" if none did


def _decide_band(
    eligible: np.ndarray,
    scores: np.ndarray,
    band: tuple[float, float],
    m: int,
    fallback: str,
    step: float,
    limits: tuple[float, float],
) -> _Band:
    """Each anchor's pool among its ``eligible`` ``(b, k)`` neighbours: those inside ``band``,
    the band widened for the short anchors when ``fallback`` is "widen". Short anchors are marked
    with the fallback that will touch them (the random fills are added after, by the caller)."""
    b = eligible.shape[0]
    band_low = np.full(b, band[0], dtype=np.float32)  # (b,)
    band_high = np.full(b, band[1], dtype=np.float32)  # (b,)
    in_pool = _in_band(eligible, scores, band_low, band_high)  # (b, k)
    was_short = in_pool.sum(axis=1) < m
    fallback_used = np.full(b, "none", dtype=object)
    if fallback != "none" and was_short.any():
        fallback_used[was_short] = fallback
    if fallback == "widen" and was_short.any():
        _widen(eligible, scores, in_pool, band_low, band_high, band, m, step, limits)
    return _Band(band_low, band_high, in_pool, was_short, fallback_used)


def _random_fills(
    rules: _Rules,
    ids: np.ndarray,
    anchors: np.ndarray,
    band: _Band,
    aug_norms: list[set[str]],
    *,
    texts: Sequence[str],
    vectors: np.ndarray,
    high: float,
    m: int,
    threshold: float | None,
    normalize: Callable[[str], str],
    seed: int,
) -> list[tuple[int, int, float]]:
    """The random fills of every short anchor: ``(row, id, cos)``, rows ascending, each row's
    fills in draw order (see ``_random_fill``); a fill never repeats a text of its pool."""
    extra: list[tuple[int, int, float]] = []
    for r in np.flatnonzero(band.was_short):
        fills = _random_fill(
            anchor=int(anchors[r]),
            need=m - int(band.in_pool[r].sum()),
            taken={rules.norm_of(j) for j in ids[r][band.in_pool[r]]},
            anchor_norm=rules.norm_of(anchors[r]),
            aug_norms=aug_norms[r],
            texts=texts,
            vectors=vectors,
            high=np.float32(high),
            threshold=threshold,
            normalize=normalize,
            seed=seed,
        )
        extra.extend((int(r), j, c) for j, c in fills)
    return extra


def _exclusions(
    rules: _Rules, scores: np.ndarray, band: _Band, searched: np.ndarray | None
) -> dict[str, np.ndarray]:
    """Per anchor, the retrieved neighbours dropped for each reason (``EXCLUSION_REASONS``, in
    that order), each by its first failed rule, against the band finally used: reason -> (b,)
    int64. A slot past ``searched`` is padding, not ``missing``."""
    outside = rules.eligible & ~band.in_pool
    slots = np.ones(scores.shape, dtype=bool)
    if searched is not None:
        slots = np.arange(scores.shape[1])[None, :] < np.asarray(searched)[:, None]  # (b, k)
    excluded = {
        "missing": ~rules.valid & slots,
        "self": rules.is_self,
        "exact_duplicate": rules.is_exact,
        "own_augmentation": rules.is_aug,
        "near_duplicate": rules.is_near,
        "repeated_text": rules.is_repeat,
        "below_band": outside & (scores < band.low[:, None]),
        "above_band": outside & (scores > band.high[:, None]),
    }
    return {key: mask.sum(axis=1).astype(np.int64) for key, mask in excluded.items()}


def _ragged(
    ids: np.ndarray, scores: np.ndarray, in_pool: np.ndarray, extra: list[tuple[int, int, float]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The pools in ragged layout, ``(offsets (b + 1,) int64, candidate ids (N,) int64, cosines
    (N,) float32, from_random (N,) bool)``: each pool's retrieved neighbours in search order,
    then its random fills (``extra``: ``(row, id, cos)``)."""
    rows_knn, cols_knn = np.nonzero(in_pool)
    rows_extra = np.array([e[0] for e in extra], dtype=np.int64)
    all_rows = np.concatenate([rows_knn, rows_extra])
    order = np.argsort(all_rows, kind="stable")
    cand = np.concatenate([ids[rows_knn, cols_knn], np.array([e[1] for e in extra], np.int64)])
    cos = np.concatenate([scores[rows_knn, cols_knn], np.array([e[2] for e in extra], np.float32)])
    rand = np.concatenate([np.zeros(rows_knn.size, bool), np.ones(rows_extra.size, bool)])
    sizes = np.bincount(all_rows, minlength=in_pool.shape[0])
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return offsets, cand[order], cos[order], rand[order]


class _Rules(NamedTuple):
    """Rule masks over the retrieved neighbours, each ``(b, k)`` bool, first failed rule only."""

    valid: np.ndarray
    is_self: np.ndarray
    is_exact: np.ndarray
    is_aug: np.ndarray
    is_near: np.ndarray
    is_repeat: np.ndarray
    eligible: np.ndarray  # passes rules 1-6; the band decides the rest
    uniq: np.ndarray  # (u,) sorted corpus rows involved
    uniq_norm: list[str]  # (u,) their normalised texts

    def norm_of(self, row: int) -> str:
        return self.uniq_norm[int(np.searchsorted(self.uniq, row))]


def _score_rules(
    ids: np.ndarray,
    anchors: np.ndarray,
    texts: Sequence[str],
    aug_norms: list[set[str]],
    threshold: float | None,
    normalize: Callable[[str], str],
    workers: int,
) -> _Rules:
    """Apply rules 1-6 to every neighbour; a neighbour is flagged by the first rule it fails."""
    from rapidfuzz import fuzz, process

    b, k = ids.shape
    valid = ids >= 0  # (b, k)
    # One integer code per distinct normalised text among the rows involved (exact, no hashing).
    uniq = np.unique(np.concatenate([anchors, ids[valid]]))  # (u,)
    take = getattr(texts, "take", None)  # a columnar corpus hands over many rows at once
    raw = take(uniq) if take is not None else [texts[int(i)] for i in uniq]
    uniq_norm = [normalize(t) for t in raw]
    norm_arr = np.empty(len(uniq_norm), dtype=object)  # (u,) for C-speed gathers below
    norm_arr[:] = uniq_norm
    code_of: dict[str, int] = {}
    uniq_code = np.array([code_of.setdefault(t, len(code_of)) for t in uniq_norm], dtype=np.int64)
    anchor_pos = np.searchsorted(uniq, anchors)  # (b,)
    cand_pos = np.zeros((b, k), dtype=np.int64)  # (b, k) index into uniq
    cand_pos[valid] = np.searchsorted(uniq, ids[valid])
    cand_code = np.where(valid, uniq_code[cand_pos], -1)  # (b, k)

    is_self = valid & (ids == anchors[:, None])
    is_exact = valid & ~is_self & (cand_code == uniq_code[anchor_pos][:, None])
    # One key per (row, code); an invalid slot's code -1 gives a key no real pair can have.
    stride = len(code_of) + 1
    aug_keys = [
        r * stride + code_of[t] for r, norms in enumerate(aug_norms) for t in norms if t in code_of
    ]
    is_aug = np.zeros((b, k), dtype=bool)
    if aug_keys:
        row_key = np.arange(b, dtype=np.int64)[:, None] * stride + cand_code  # (b, k)
        is_aug = valid & ~is_self & ~is_exact & np.isin(row_key, np.array(aug_keys, np.int64))
    todo = valid & ~is_self & ~is_exact & ~is_aug

    is_near = np.zeros((b, k), dtype=bool)
    if threshold is not None and todo.any():
        rows, cols = np.nonzero(todo)
        ratio = process.cpdist(
            norm_arr[anchor_pos[rows]].tolist(),
            norm_arr[cand_pos[rows, cols]].tolist(),
            scorer=fuzz.ratio,
            score_cutoff=threshold,
            workers=workers,
        )
        is_near[rows, cols] = ratio >= threshold
    todo &= ~is_near

    is_repeat = np.zeros((b, k), dtype=bool)
    if todo.any():
        rows, cols = np.nonzero(todo)  # row-major: better-ranked neighbours come first
        key = rows * (len(code_of) + 1) + cand_code[rows, cols]
        first = np.zeros(rows.size, dtype=bool)
        first[np.unique(key, return_index=True)[1]] = True
        is_repeat[rows[~first], cols[~first]] = True
    eligible = todo & ~is_repeat
    return _Rules(valid, is_self, is_exact, is_aug, is_near, is_repeat, eligible, uniq, uniq_norm)


def _in_band(
    eligible: np.ndarray, scores: np.ndarray, low: np.ndarray, high: np.ndarray
) -> np.ndarray:
    # float32 on both sides: a cosine stored as float32(0.25) passes a band edge of 0.25.
    return eligible & (scores >= low[:, None]) & (scores <= high[:, None])


def _widen(
    eligible: np.ndarray,
    scores: np.ndarray,
    in_pool: np.ndarray,
    band_low: np.ndarray,
    band_high: np.ndarray,
    band: tuple[float, float],
    m: int,
    step: float,
    limits: tuple[float, float],
) -> None:
    """Widen ``band`` for each short row step by step until m neighbours qualify (in place)."""
    low, high = band
    active = in_pool.sum(axis=1) < m  # (b,)
    n_steps = int(np.ceil(max(low - limits[0], limits[1] - high) / step - 1e-9))
    for i in range(1, n_steps + 1):
        if not active.any():
            break
        # Rounded so that steps land on the decimal grid (0.25 - 0.05 is 0.2, not 0.19999...).
        band_low[active] = np.float32(max(limits[0], round(low - i * step, 9)))
        band_high[active] = np.float32(min(limits[1], round(high + i * step, 9)))
        in_pool[active] = _in_band(eligible, scores, band_low, band_high)[active]
        active &= in_pool.sum(axis=1) < m


def _random_fill(
    *,
    anchor: int,
    need: int,
    taken: set[str],
    anchor_norm: str,
    aug_norms: set[str],
    texts: Sequence[str],
    vectors: np.ndarray,
    high: np.float32,
    threshold: float | None,
    normalize: Callable[[str], str],
    seed: int,
) -> list[tuple[int, float]]:
    """Up to ``need`` random corpus rows passing rules 2-6 and ``cos <= high``: ``(id, cos)`` pairs."""
    from rapidfuzz import fuzz

    rng = np.random.default_rng([seed, anchor])  # per anchor: independent of batch composition
    n = len(texts)
    picked: list[tuple[int, float]] = []
    seen: set[int] = {anchor}
    for _ in range(_RANDOM_ROUNDS):
        for j in rng.integers(0, n, size=2 * need + 8):
            j = int(j)
            if j in seen:
                continue
            seen.add(j)
            norm = normalize(texts[j])
            if norm == anchor_norm or norm in aug_norms or norm in taken:
                continue
            if threshold is not None and fuzz.ratio(anchor_norm, norm) >= threshold:
                continue
            c = np.float32(vectors[anchor] @ vectors[j])
            if c > high:
                continue
            picked.append((j, float(c)))
            taken.add(norm)
            if len(picked) == need:
                return picked
        if len(seen) >= n:
            break
    return picked
