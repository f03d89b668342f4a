"""DebCSE inverse-propensity-weighted (IPW) sampling probabilities, eqs. 1-6 of section 4.

Every score function works on one pool (a 1-D array, ``offsets=None``) or on many pools at once in
ragged form: flat arrays holding the pools back to back, and ``offsets`` of shape
``(n_pools + 1,)`` with ``offsets[0] == 0`` and ``offsets[-1] == len(flat)``; pool ``i`` is
``flat[offsets[i]:offsets[i + 1]]``. That is the layout of an Arrow list column
(``pa.ListArray.from_arrays(offsets, values)``), so pools go to and from Parquet without copies,
and every per-pool reduction is a ``ufunc.reduceat`` over the flat array, fast for millions of pairs.

Single-pool functions reject an empty pool; in ragged form empty pools are allowed (a short pool
kept by the "none" fallback is one) and contribute nothing, see each function.

Temperature: every softmax divides its logits by ``temperature``; ``1.0`` is the paper as printed.
As printed the softmaxes barely move away from ``1/n`` (normalised edits lie in [0, 1] and band
cosines within 0.5 of each other, so logits differ by less than 1), and P_neg / P_pos come out
nearly uniform: METHODS.md's
3-candidate example gives 0.319 / 0.342 / 0.339. A temperature below 1 sharpens all three softmaxes
of a distribution (eqs. 1, 2 and 4, or 1, 2 and 6); :func:`entropy_ratio` measures the result.

Calibrated form (:func:`calibrated_probs`, ``sample.ipw: calibrated``). The paper's softmaxes act on
raw scores whose spread within a pool is small and varies from pool to pool, so no single
temperature sharpens every pool by the same amount. The calibrated form standardises each score
within its pool first, then takes one softmax::

    z_e(i,j) = (edit(i,j) - mean_k edit(i,k)) / std_k edit(i,k)          (0 when std = 0)
    z_c(i,j) = (cos(i,j)  - mean_k cos(i,k))  / std_k cos(i,k)
    P_neg(j|i) = softmax_j( -((1 - λn) z_e + λn z_c) / τ )     (eqs. 3-4 with z-scores)
    P_pos(j|i) = softmax_j(  ((1 - λp) z_e + λp z_c) / τ )     (eqs. 5-6 with z-scores)

It keeps the paper's directions (negatives: small edit, low cosine; positives: large edit, high
cosine) and its λ weighting, and makes the sharpening a property of τ alone: a candidate one
standard deviation harder than the pool's mean gets e^(1/τ) times the weight of an average one,
whatever the pool's raw spread. For Gaussian-like scores the effective number of candidates
exp(H) is about n·exp(-σ²/τ²), σ² the variance of the mixed z-score (≤ λ² + (1-λ)²).
"""

from __future__ import annotations

from typing import Literal, NamedTuple, get_args

import numpy as np

__all__ = [
    "IPW_FORMS",
    "PoolSample",
    "calibrated_probs",
    "effective_numbers",
    "Sample",
    "entropy_ratio",
    "keyed_exponentials",
    "negative_probs",
    "pool_entropy_ratios",
    "positive_probs",
    "sample_pools",
    "sample_without_replacement",
    "segment_ids",
    "semantic_scores",
    "surface_scores",
]


# ----------------------------------------------------------------------------- ragged helpers


def check_offsets(offsets: np.ndarray, n_flat: int) -> np.ndarray:
    """Return ``offsets`` as int64 after checking it describes ``n_flat`` elements, else ValueError."""
    offsets = np.asarray(offsets)
    if offsets.ndim != 1 or offsets.size == 0:
        raise ValueError(f"offsets must be 1-D with n_pools + 1 entries, got shape {offsets.shape}")
    if not np.issubdtype(offsets.dtype, np.integer):
        raise ValueError(f"offsets must be integers, got dtype {offsets.dtype}")
    offsets = offsets.astype(np.int64, copy=False)
    if offsets[0] != 0 or offsets[-1] != n_flat:
        raise ValueError(
            f"offsets must start at 0 and end at the flat length {n_flat}, "
            f"got {int(offsets[0])} .. {int(offsets[-1])}"
        )
    if np.any(np.diff(offsets) < 0):
        raise ValueError("offsets must be non-decreasing")
    return offsets


def segment_ids(offsets: np.ndarray) -> np.ndarray:
    """Pool index of every flat element, shape ``(offsets[-1],)`` int64."""
    offsets = np.asarray(offsets, dtype=np.int64)
    return np.repeat(np.arange(offsets.size - 1, dtype=np.int64), np.diff(offsets))


class _Layout(NamedTuple):
    """Ragged layout, computed once per call: offsets, pool of each element, non-empty starts."""

    offsets: np.ndarray  # (n_pools + 1,) int64
    seg: np.ndarray  # (N,) int64
    nonempty: np.ndarray  # (n_pools,) bool
    starts: np.ndarray  # (n_nonempty,) int64


def _layout(offsets: np.ndarray) -> _Layout:
    counts = np.diff(offsets)
    nonempty = counts > 0
    return _Layout(offsets, segment_ids(offsets), nonempty, offsets[:-1][nonempty])


def _segment_reduce(ufunc: np.ufunc, x: np.ndarray, lay: _Layout, empty: float) -> np.ndarray:
    """``ufunc.reduce`` of each pool, ``empty`` for empty pools; shape ``(n_pools,)``."""
    out = np.full(lay.nonempty.size, empty, dtype=x.dtype)
    if x.size:
        # reduceat over the starts of the non-empty pools only: the next non-empty start is exactly
        # where the current pool ends, so empty pools (repeated offsets) cannot leak values.
        out[lay.nonempty] = ufunc.reduceat(x, lay.starts)
    return out


def _as_scores(x: np.ndarray, name: str) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one pool or flat ragged pools), got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return x


def _prepare(x: np.ndarray, offsets: np.ndarray | None, name: str) -> tuple[np.ndarray, _Layout]:
    x = _as_scores(x, name)
    if offsets is None:
        if x.size == 0:
            raise ValueError(f"empty pool: {name} has no candidates")
        return x, _layout(np.array([0, x.size], dtype=np.int64))
    return x, _layout(check_offsets(offsets, x.size))


def _check_temperature(temperature: float) -> None:
    if not (np.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a positive finite number, got {temperature}")


def _check_lambda(lam: float, name: str) -> None:
    if not (0.0 <= lam <= 1.0):
        raise ValueError(f"{name} must lie in [0, 1], got {lam}")


def _softmax(x: np.ndarray, lay: _Layout, temperature: float) -> np.ndarray:
    """Softmax of ``x / temperature`` within each pool; flat, same shape as ``x``."""
    z = x / temperature  # (N,)
    z -= _segment_reduce(np.maximum, z, lay, 0.0)[lay.seg]  # stable: each pool's max logit is 0
    e = np.exp(z, out=z)
    return e / _segment_reduce(np.add, e, lay, 1.0)[lay.seg]


# ----------------------------------------------------------------------------- eqs. 1-6


def surface_scores(
    edit: np.ndarray, offsets: np.ndarray | None = None, temperature: float = 1.0
) -> np.ndarray:
    """Surface-similarity score S_sur of each candidate (eq. 1), same shape as ``edit``.

    ``edit`` is the edit distance of each candidate to its anchor (see ``edits.py``; normalised
    distances in [0, 1] by default). A larger distance gives a smaller S_sur. Values lie in
    [0, 1); a one-candidate pool scores 0.
    """
    _check_temperature(temperature)
    edit, lay = _prepare(edit, offsets, "edit")
    return 1.0 - _softmax(edit, lay, temperature)  # eq. 1


def semantic_scores(
    cos: np.ndarray, offsets: np.ndarray | None = None, temperature: float = 1.0
) -> np.ndarray:
    """Semantic-similarity score S_sem of each candidate (eq. 2): softmax of the cosines per pool."""
    _check_temperature(temperature)
    cos, lay = _prepare(cos, offsets, "cos")
    return _softmax(cos, lay, temperature)  # eq. 2


def _prepare_pair(
    edit: np.ndarray,
    cos: np.ndarray,
    offsets: np.ndarray | None,
    lam: float,
    lam_name: str,
    t: float,
) -> tuple[np.ndarray, np.ndarray, _Layout]:
    _check_lambda(lam, lam_name)
    _check_temperature(t)
    if np.shape(edit) != np.shape(cos):
        raise ValueError(
            f"edit and cos must have the same shape, got {np.shape(edit)} and {np.shape(cos)}"
        )
    edit, lay = _prepare(edit, offsets, "edit")
    cos = _as_scores(cos, "cos")
    return edit, cos, lay


def negative_probs(
    edit: np.ndarray,
    cos: np.ndarray,
    offsets: np.ndarray | None = None,
    lambda_n: float = 0.8,
    temperature: float = 1.0,
) -> np.ndarray:
    """P_neg(j|i), the probability of drawing each negative candidate (eqs. 3-4), float64.

    Favours candidates close in surface form (small edit) and far in meaning (small cos).
    ``lambda_n`` weighs semantics against surface (paper's best: 0.8, Table 6). Sums to 1 per pool.
    """
    edit, cos, lay = _prepare_pair(edit, cos, offsets, lambda_n, "lambda_n", temperature)
    s_sur = 1.0 - _softmax(edit, lay, temperature)  # (N,) eq. 1
    s_sem = _softmax(cos, lay, temperature)  # (N,) eq. 2
    p_tilde = (1.0 - lambda_n) * s_sur + lambda_n * (1.0 - s_sem)  # eq. 3
    return _softmax(p_tilde, lay, temperature)  # eq. 4


def positive_probs(
    edit: np.ndarray,
    cos: np.ndarray,
    offsets: np.ndarray | None = None,
    lambda_p: float = 0.8,
    temperature: float = 1.0,
) -> np.ndarray:
    """P_pos(j|i), the probability of drawing each positive candidate (eqs. 5-6), float64.

    Favours augmentations far in surface form (large edit) and close in meaning (large cos).
    ``lambda_p`` weighs semantics against surface (paper's best: 0.8, Table 6). Sums to 1 per pool.
    """
    edit, cos, lay = _prepare_pair(edit, cos, offsets, lambda_p, "lambda_p", temperature)
    s_sur = 1.0 - _softmax(edit, lay, temperature)  # (N,) eq. 1
    s_sem = _softmax(cos, lay, temperature)  # (N,) eq. 2
    p_tilde = (1.0 - lambda_p) * (1.0 - s_sur) + lambda_p * s_sem  # eq. 5
    return _softmax(p_tilde, lay, temperature)  # eq. 6


def _zscore(x: np.ndarray, lay: _Layout) -> np.ndarray:
    """``x`` standardised within each pool (population std); 0 where a pool's std is 0."""
    counts = np.maximum(np.diff(lay.offsets), 1).astype(np.float64)
    mean = _segment_reduce(np.add, x, lay, 0.0) / counts  # (n_pools,)
    dev = x - mean[lay.seg]  # (N,)
    std = np.sqrt(_segment_reduce(np.add, dev * dev, lay, 0.0) / counts)  # (n_pools,)
    # A pool whose scores are all equal (to rounding) carries no signal: z = 0, uniform over it.
    flat = std <= 1e-12 * np.maximum(1.0, np.abs(mean))
    return np.where(flat[lay.seg], 0.0, dev / np.where(flat, 1.0, std)[lay.seg])


# uniform: P = 1/n within each pool, the debiasing off (a control: the band alone decides).
IpwForm = Literal["paper", "calibrated", "uniform"]
IPW_FORMS: tuple[str, ...] = get_args(IpwForm)


def calibrated_probs(
    edit: np.ndarray,
    cos: np.ndarray,
    offsets: np.ndarray | None = None,
    side: str = "negative",
    lam: float = 0.8,
    temperature: float = 1.0,
) -> np.ndarray:
    """P_neg or P_pos in the calibrated form (module doc): a softmax over z-scored edit and
    cosine with ``lam`` (λn or λp) weighing semantics, at ``temperature`` τ. Sums to 1 per pool."""
    if side not in ("negative", "positive"):
        raise ValueError(f"side must be 'negative' or 'positive', got {side!r}")
    edit, cos, lay = _prepare_pair(edit, cos, offsets, lam, f"lambda ({side})", temperature)
    mixed = (1.0 - lam) * _zscore(edit, lay) + lam * _zscore(cos, lay)  # (N,)
    return _softmax(-mixed if side == "negative" else mixed, lay, temperature)


# ----------------------------------------------------------------------------- entropy


def effective_numbers(p: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """exp(H(p)) of each pool: how many equally likely candidates the draw is worth, shape
    ``(n_pools,)``; n for a uniform pool of n, 1 for a point mass, NaN for an empty pool."""
    ratio = pool_entropy_ratios(p, offsets)
    counts = np.diff(np.asarray(offsets, dtype=np.int64)).astype(np.float64)
    with np.errstate(invalid="ignore"):
        return np.where(counts > 0, counts**ratio, np.nan)


def _as_probs(p: np.ndarray) -> np.ndarray:
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 1:
        raise ValueError(f"p must be 1-D, got shape {p.shape}")
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        raise ValueError("p must be finite and non-negative")
    return p


def pool_entropy_ratios(p: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """H(p) / log(n) of each pool, shape ``(n_pools,)`` float64.

    1.0 means uniform sampling, 0.0 a point mass. ``p`` is renormalised within each pool first.
    Defined as 1.0 for a one-candidate pool (the only distribution there is, hence uniform) and NaN
    for an empty pool or one whose weights are all zero (no distribution at all).
    """
    p = _as_probs(p)
    lay = _layout(check_offsets(offsets, p.size))
    counts = np.diff(lay.offsets)
    totals = _segment_reduce(np.add, p, lay, 0.0)  # (n_pools,)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = p / totals[lay.seg]
        terms = np.where(q > 0, -q * np.log(np.where(q > 0, q, 1.0)), 0.0)  # 0 log 0 = 0
        h = _segment_reduce(np.add, terms, lay, 0.0)
        ratio = h / np.log(counts)
    ratio = np.where(counts == 1, 1.0, ratio)
    ratio[(counts == 0) | (totals <= 0)] = np.nan
    return ratio


def entropy_ratio(p: np.ndarray) -> float:
    """H(p) / log(n) of one pool: 1.0 uniform, 0.0 a point mass; 1.0 when n == 1.

    Raises ValueError for an empty pool or all-zero weights.
    """
    p = _as_probs(p)
    if p.size == 0:
        raise ValueError("empty pool: cannot compute the entropy of no candidates")
    if p.sum() <= 0:
        raise ValueError("p has no positive weight")
    return float(pool_entropy_ratios(p, np.array([0, p.size]))[0])


# ----------------------------------------------------------------------------- sampling


class Sample(NamedTuple):
    """Draw from one pool: positions into ``p`` in draw order, and whether fewer than m existed."""

    indices: np.ndarray  # (min(m, n_positive),) int64
    short: bool


class PoolSample(NamedTuple):
    """Draws from ragged pools.

    ``indices`` are flat positions into the pools' flat arrays (so ``ids[indices]`` are the chosen
    ids), grouped per pool by ``offsets`` (shape ``(n_pools + 1,)``) and in draw order within a pool.
    ``short[i]`` is True where pool ``i`` had fewer than m candidates of positive probability, in
    which case all of them were returned.
    """

    offsets: np.ndarray  # (n_pools + 1,) int64
    indices: np.ndarray  # (n_drawn,) int64
    short: np.ndarray  # (n_pools,) bool


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over a uint64 array (wrapping arithmetic): a bijection whose
    output bits each depend on every input bit."""
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def keyed_exponentials(
    seed: int, stream: int, anchors: np.ndarray, candidates: np.ndarray
) -> np.ndarray:
    """One Exp(1) number per (anchor, candidate) pair, a function of ``(seed, stream, anchor,
    candidate)`` alone: counter-based, as the keys of :func:`sample_pools`.

    ``anchors`` and ``candidates`` are (N,) integer keys (corpus rows, or 64-bit hashes of a
    text), ``stream`` tells the draws of one run apart (negatives 0, positives 1). A candidate's
    number does not depend on its place in the pool, on the other pools, on how anchors are
    batched or sharded, nor on the machine (integer arithmetic, then one ``log``): two runs whose
    pools differ in a few anchors draw differently for those anchors only.
    """
    a = np.asarray(anchors).astype(np.uint64, copy=False)
    c = np.asarray(candidates).astype(np.uint64, copy=False)
    if a.shape != c.shape or a.ndim != 1:
        raise ValueError(
            f"anchors and candidates must be 1-D of one length, got {a.shape}, {c.shape}"
        )
    seed_, stream_ = np.array([seed, stream], dtype=np.int64).astype(np.uint64)
    base = _mix64(_mix64(np.array([seed_])) ^ stream_)  # (1,): (seed, stream) in order
    h = _mix64(_mix64(base ^ a) ^ c)  # (N,) uint64
    u = ((h >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53  # (N,) in (0, 1)
    return -np.log(u)


def _exponentials(rng: np.random.Generator | int | np.ndarray, n: int) -> np.ndarray:
    """``n`` Exp(1) numbers: drawn from a generator (or an int seed), or given (keyed)."""
    if isinstance(rng, np.ndarray):
        if rng.shape != (n,) or not np.issubdtype(rng.dtype, np.floating):
            raise ValueError(f"the given exponentials must be a float array of shape ({n},)")
        return rng
    if isinstance(rng, np.random.Generator):
        return rng.exponential(size=n)
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        return np.random.default_rng(int(rng)).exponential(size=n)
    raise TypeError(
        f"rng must be a numpy Generator, an int seed or the Exp(1) draws, got {type(rng).__name__}"
    )


def sample_pools(
    p: np.ndarray, offsets: np.ndarray, m: int, rng: np.random.Generator | int | np.ndarray
) -> PoolSample:
    """Draw up to ``m`` distinct candidates per pool, without replacement, with probability ``p``.

    Successive draws follow ``p`` renormalised over the candidates not drawn yet (so the first draw
    of each pool is distributed exactly as ``p``). Implemented as Gumbel-top-m: keep the m largest
    ``log p - log E``, E ~ Exp(1), which is that sequential scheme with all randomness drawn up
    front; the top m are taken by m passes of a per-pool max, linear in the number of candidates.
    ``p`` need not be normalised; zero-weight candidates are never drawn. Deterministic for a given
    seed and input; empty pools give no draws and ``short=True``. ``rng`` is a generator, an int
    seed, or the (N,) E themselves (:func:`keyed_exponentials`: each candidate's own number, so a
    pool's draw depends on that pool alone).
    """
    if not isinstance(m, (int, np.integer)) or m < 1:
        raise ValueError(f"m must be a positive integer, got {m!r}")
    p = _as_probs(p)
    lay = _layout(check_offsets(offsets, p.size))
    with np.errstate(divide="ignore"):
        keys = np.log(p) - np.log(_exponentials(rng, p.size))  # (N,) -inf where p == 0
    passes = []
    for _ in range(min(m, int(np.diff(lay.offsets).max(initial=0)))):
        best = _segment_reduce(np.maximum, keys, lay, -np.inf)  # (n_pools,)
        pos = np.flatnonzero((keys == best[lay.seg]) & np.isfinite(keys))  # pool-major order
        if pos.size == 0:
            break  # every pool is exhausted (only zero-weight candidates left)
        pool = lay.seg[pos]
        pos = pos[np.concatenate([[True], pool[1:] != pool[:-1]])]  # one per pool, even on ties
        keys[pos] = -np.inf  # drawn: out of the later passes
        passes.append(pos)
    drawn = np.concatenate(passes) if passes else np.empty(0, dtype=np.int64)
    indices = drawn[np.argsort(lay.seg[drawn], kind="stable")]  # per pool, in draw order
    counts = np.bincount(lay.seg[indices], minlength=lay.nonempty.size)
    new_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return PoolSample(new_offsets, indices.astype(np.int64), counts < m)


def sample_without_replacement(p: np.ndarray, m: int, rng: np.random.Generator | int) -> Sample:
    """Draw up to ``m`` distinct positions of one pool with probability ``p`` (see sample_pools).

    When the pool has fewer than ``m`` candidates of positive weight, all of them are returned and
    ``short`` is True. Raises ValueError for an empty pool.
    """
    p = _as_probs(p)
    if p.size == 0:
        raise ValueError("empty pool: nothing to sample from")
    drawn = sample_pools(p, np.array([0, p.size]), m, rng)
    return Sample(drawn.indices, bool(drawn.short[0]))
