"""DebCSE negative candidate pools (section 4.1): kNN neighbours in a cosine band, minus duplicates.

For each anchor, the pool is its retrieved neighbours whose cosine lies in ``[low, high]``
(inclusive; DebCSE's band is [0.25, 0.75]: below it negatives are too easy, above it they are likely
false negatives), after removing candidates that are not real negatives. Each retrieved neighbour is
scored on every rule first, then assigned to the first rule it fails, in this order (the keys of
``NegativePools.excluded``):

1. ``missing``: FAISS returned no neighbour in that slot (id -1).
2. ``self``: the anchor itself (it is usually its own nearest neighbour; search with k + 1).
3. ``exact_duplicate``: same normalised text as the anchor (:func:`normalize_text`).
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

import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from rapidfuzz import fuzz, process

__all__ = [
    "EXCLUSION_REASONS",
    "Fallback",
    "NegativePools",
    "build_negative_pools",
    "normalize_text",
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


def normalize_text(text: str) -> str:
    """Text as compared for duplicates: Unicode NFKC, case-folded, whitespace runs collapsed, trimmed."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


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
    near_duplicate_threshold: float = 90.0,
    m: int = 2,
    fallback: Fallback = "none",
    widen_step: float = 0.05,
    widen_limits: tuple[float, float] = (-1.0, 0.9),
    vectors: np.ndarray | None = None,
    seed: int = 0,
    normalize: Callable[[str], str] = normalize_text,
    workers: int = -1,
) -> NegativePools:
    """Build the negative candidate pool of each anchor from its kNN results (see module doc).

    ``neighbor_ids`` / ``neighbor_scores``: ``(b, k)`` from ``index.search`` (row numbers of the
    corpus, cosines, -1 for a missing slot). ``anchor_ids``: ``(b,)`` corpus rows of the anchors.
    ``texts``: the corpus, ``texts[i]`` a str. ``own_augmentations``: each anchor's augmentation
    texts, as a mapping from anchor id or as a sequence aligned with ``anchor_ids``.
    ``near_duplicate_threshold`` is on fuzz.ratio's 0-100 scale (90 catches one-word edits of a
    ~10-word sentence while keeping sentences that merely share a clause). ``widen_limits`` bounds
    the "widen" fallback; its top (0.9 by default) keeps widening away from paraphrase territory.
    ``vectors`` (the corpus embeddings, float32, L2-normalised) is needed by ``fallback="random"``
    only. ``normalize`` maps a text to the form compared for duplicates; pass the ingest stage's
    normaliser to match its deduplication.
    """
    if not (-1.0 <= low <= high <= 1.0):
        raise ValueError(f"band must satisfy -1 <= low <= high <= 1, got [{low}, {high}]")
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback must be one of {FALLBACKS}, got {fallback!r}")
    if not isinstance(m, (int, np.integer)) or m < 1:
        raise ValueError(f"m must be a positive integer, got {m!r}")
    if not 0.0 <= near_duplicate_threshold <= 100.0:
        raise ValueError(
            f"near_duplicate_threshold is a fuzz.ratio score in [0, 100], got {near_duplicate_threshold}"
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
        if vectors.ndim != 2 or vectors.shape[0] != len(texts):
            raise ValueError(
                f"vectors must be (len(texts)={len(texts)}, d), got shape {np.shape(vectors)}"
            )

    ids, scores, anchors = _check_inputs(neighbor_ids, neighbor_scores, anchor_ids, len(texts))
    b, k = ids.shape
    augs = _augmentation_lists(own_augmentations, anchors)

    # --- score: one integer code per distinct normalised text among the rows involved.
    valid = ids >= 0  # (b, k)
    uniq = np.unique(np.concatenate([anchors, ids[valid]]))
    norm_of_uniq = [normalize(texts[int(i)]) for i in uniq]
    code_of: dict[str, int] = {}
    uniq_codes = np.array(
        [code_of.setdefault(s, len(code_of)) for s in norm_of_uniq], dtype=np.int64
    )
    anchor_code = uniq_codes[np.searchsorted(uniq, anchors)]  # (b,)
    cand_code = np.full((b, k), -1, dtype=np.int64)  # (b, k)
    cand_code[valid] = uniq_codes[np.searchsorted(uniq, ids[valid])]
    aug_norms = [{normalize(t) for t in row} for row in augs]

    is_self = valid & (ids == anchors[:, None])
    is_exact = valid & ~is_self & (cand_code == anchor_code[:, None])
    is_aug = np.zeros((b, k), dtype=bool)
    for r, norms in enumerate(aug_norms):
        codes = [code_of[s] for s in norms if s in code_of]
        if codes:
            is_aug[r] = valid[r] & ~is_self[r] & ~is_exact[r] & np.isin(cand_code[r], codes)
    is_near = np.zeros((b, k), dtype=bool)
    todo = valid & ~is_self & ~is_exact & ~is_aug
    if todo.any():
        rows, cols = np.nonzero(todo)
        anchor_norm = [norm_of_uniq[int(j)] for j in np.searchsorted(uniq, anchors)]
        uniq_pos = np.searchsorted(uniq, ids[rows, cols])
        ratio = process.cpdist(
            [anchor_norm[int(r)] for r in rows],
            [norm_of_uniq[int(j)] for j in uniq_pos],
            scorer=fuzz.ratio,
            score_cutoff=near_duplicate_threshold,
            workers=workers,
        )
        is_near[rows, cols] = ratio >= near_duplicate_threshold
    is_repeat = np.zeros((b, k), dtype=bool)
    todo &= ~is_near
    if todo.any():
        rows, cols = np.nonzero(todo)  # row-major: better-ranked neighbours come first
        key = rows * (len(code_of) + 1) + cand_code[rows, cols]
        first = np.zeros(rows.size, dtype=bool)
        first[np.unique(key, return_index=True)[1]] = True
        is_repeat[rows[~first], cols[~first]] = True
    eligible = todo & ~is_repeat  # (b, k) passes rules 1-6

    # --- decide: band, then fallback.
    s32 = scores  # float32: compare in the scores' own precision so that edges stay inclusive
    band_low = np.full(b, low, dtype=np.float32)
    band_high = np.full(b, high, dtype=np.float32)

    def in_band(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        return eligible & (s32 >= lo[:, None]) & (s32 <= hi[:, None])

    in_pool = in_band(band_low, band_high)
    was_short = in_pool.sum(axis=1) < m
    fallback_used = np.full(b, "none", dtype=object)

    if fallback == "widen" and was_short.any():
        fallback_used[was_short] = "widen"
        active = was_short.copy()
        n_steps = int(np.ceil(max(low - lim_lo, lim_hi - high) / widen_step - 1e-9))
        for step in range(1, n_steps + 1):
            if not active.any():
                break
            # Rounded so that steps land on the decimal grid (0.25 - 0.05 is 0.2, not 0.19999...).
            lo = np.float32(max(lim_lo, round(low - step * widen_step, 9)))
            hi = np.float32(min(lim_hi, round(high + step * widen_step, 9)))
            band_low[active] = lo
            band_high[active] = hi
            in_pool[active] = in_band(band_low, band_high)[active]
            active &= in_pool.sum(axis=1) < m

    extra_rows: list[int] = []
    extra_ids: list[int] = []
    extra_cos: list[float] = []
    if fallback == "random" and was_short.any():
        fallback_used[was_short] = "random"
        for r in np.flatnonzero(was_short):
            picked = _random_fill(
                anchor=int(anchors[r]),
                need=m - int(in_pool[r].sum()),
                taken={normalize(texts[int(j)]) for j in ids[r][in_pool[r]]},
                anchor_norm=norm_of_uniq[int(np.searchsorted(uniq, anchors[r]))],
                aug_norms=aug_norms[r],
                texts=texts,
                vectors=vectors,
                high=np.float32(high),
                threshold=near_duplicate_threshold,
                normalize=normalize,
                seed=seed,
            )
            for j, c in picked:
                extra_rows.append(int(r))
                extra_ids.append(j)
                extra_cos.append(c)

    # --- count exclusions by first failed rule, against the band finally used.
    below = eligible & ~in_pool & (s32 < band_low[:, None])
    above = eligible & ~in_pool & (s32 > band_high[:, None])
    excluded = {
        "missing": (~valid).sum(axis=1),
        "self": is_self.sum(axis=1),
        "exact_duplicate": is_exact.sum(axis=1),
        "own_augmentation": is_aug.sum(axis=1),
        "near_duplicate": is_near.sum(axis=1),
        "repeated_text": is_repeat.sum(axis=1),
        "below_band": below.sum(axis=1),
        "above_band": above.sum(axis=1),
    }
    excluded = {key: val.astype(np.int64) for key, val in excluded.items()}

    # --- assemble ragged output: retrieved neighbours (search order), then random fills.
    rows_knn, cols_knn = np.nonzero(in_pool)
    all_rows = np.concatenate([rows_knn, np.asarray(extra_rows, dtype=np.int64)])
    order = np.argsort(all_rows, kind="stable")
    cand = np.concatenate([ids[rows_knn, cols_knn], np.asarray(extra_ids, dtype=np.int64)])
    cos = np.concatenate([scores[rows_knn, cols_knn], np.asarray(extra_cos, dtype=np.float32)])
    rand = np.concatenate([np.zeros(rows_knn.size, bool), np.ones(len(extra_rows), bool)])
    sizes = np.bincount(all_rows, minlength=b)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return NegativePools(
        anchor_ids=anchors,
        offsets=offsets,
        candidate_ids=cand[order],
        cosines=cos[order],
        from_random=rand[order],
        band_low=band_low,
        band_high=band_high,
        was_short=was_short,
        short=sizes < m,
        fallback=fallback_used.astype(str),
        excluded=excluded,
    )


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
    threshold: float,
    normalize: Callable[[str], str],
    seed: int,
) -> list[tuple[int, float]]:
    """Up to ``need`` random corpus rows passing rules 2-6 and ``cos <= high``: ``(id, cos)`` pairs."""
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
            if fuzz.ratio(anchor_norm, norm) >= threshold:
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
