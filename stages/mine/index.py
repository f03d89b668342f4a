"""FAISS inner-product index over L2-normalised sentence vectors, batched search, recall checks.

On unit vectors the inner product is the cosine, so search scores are the ``cos(h_i, h_j)`` that
DebCSE's band filter and eq. 2 read. Three index kinds:

- ``"flat"``: exact brute force (``IndexFlatIP``). Default up to ``flat_max`` vectors.
- ``"ivf"``: ``IndexIVFFlat`` (or ``IndexIVFScalarQuantizer`` with ``ivf_codec="sq8"``: one byte
  per component, 4x less memory and faster scans on CPU, scores off by ~1e-3, which
  callers can rescore exactly; ``"sq6"`` and ``"sq4"``: 6 and 4 bits, 5.3x and 8x less memory,
  coarser scores, so a neighbour near the k-th may be missed before the rescoring) with
  ``nlist`` k-means cells trained on a seeded sample; a query scans ``nprobe`` cells. Default above ``flat_max`` because it also runs on GPU.
- ``"hnsw"``: ``IndexHNSWFlat`` graph (CPU only in faiss); no training, slower to build, high recall.

Approximate kinds trade recall for speed: check it with :func:`measure_recall` on your data.

Every entry point validates its vectors (float32, 2-D, finite, unit norm within ``norm_tol``) and
raises ValueError / TypeError naming the problem, because FAISS itself accepts NaNs and unnormalised
rows silently and returns meaningless neighbours.

The corpus matrix may be memory-mapped (``pipeline/mining_inputs.MappedVectors``): every full pass
over it (checks, adding, exact search) goes ``BLOCK`` rows at a time and calls ``release`` after
each block, and gathers go ``take_rows``' chunks at a time, so the pages resident at once are a block's,
not the matrix's (a million 384-d vectors are 1.43 GiB); given ``take`` (``MappedVectors.take``),
gathers read their rows with positioned reads and touch no page of the mapping. An IVF index can
be written to disk as it is built and searched mapped (``on_disk``; ``stages/mine/ondisk.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Literal, get_args

import faiss
import numpy as np
from pairforge.pipeline.science.mining_inputs import no_release, take_rows
from pairforge.stages.mine.ondisk import read_mapped, train_ivf, write_ivf

__all__ = [
    "IndexKind",
    "build_index",
    "check_vectors",
    "gpu_available",
    "measure_recall",
    "recall_at_k",
    "search",
]

IndexKind = Literal["auto", "flat", "ivf", "hnsw"]
IvfCodec = Literal["flat", "sq8", "sq6", "sq4"]
IVF_CODECS: tuple[str, ...] = get_args(IvfCodec)
# faiss's scalar quantizer of each codec: every one keeps a per-component [min, max] range.
SQ_TYPES = {"sq8": "QT_8bit", "sq6": "QT_6bit", "sq4": "QT_4bit"}

DEFAULT_NORM_TOL = 1e-3
# Above this many vectors "auto" switches from exact to IVF search: exact all-pairs search costs
# n^2 d flops, about 8e12 (minutes on a few CPU cores) at 1e5 vectors of d=768.
DEFAULT_FLAT_MAX = 100_000
BLOCK = 65_536  # rows per block of a full pass over the corpus (96 MiB at d = 384)


def check_vectors(
    vectors: np.ndarray,
    name: str = "vectors",
    norm_tol: float | None = DEFAULT_NORM_TOL,
    release: Callable[[], None] = no_release,
) -> np.ndarray:
    """Return ``vectors`` as a C-contiguous float32 ``(n, d)`` array after validating it.

    Raises TypeError for a non-array or a dtype other than float32 (no silent cast: a float64
    matrix here usually means an upstream step skipped its own conversion), and ValueError for the
    wrong number of dimensions, an empty array, NaN/inf entries (naming the first bad row) or rows
    whose L2 norm is farther than ``norm_tol`` from 1 (``norm_tol=None`` skips that check). The
    values are read ``BLOCK`` rows at a time, ``release`` after each block.
    """
    if not isinstance(vectors, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(vectors).__name__}")
    if vectors.dtype != np.float32:
        raise TypeError(f"{name} must have dtype float32, got {vectors.dtype}")
    if vectors.ndim != 2:
        raise ValueError(f"{name} must be 2-D (n, d), got shape {vectors.shape}")
    n, d = vectors.shape
    if n == 0 or d == 0:
        raise ValueError(f"{name} is empty, shape {vectors.shape}")
    bad, first_bad = 0, -1
    worst, worst_err, worst_norm = -1, -1.0, 1.0
    for start in range(0, n, BLOCK):
        block = vectors[start : start + BLOCK]  # (b, d)
        finite = np.isfinite(block).all(axis=1)  # (b,)
        if not finite.all():
            if first_bad < 0:
                first_bad = start + int(np.flatnonzero(~finite)[0])
            bad += int((~finite).sum())
        elif norm_tol is not None and not bad:
            norms = np.sqrt(np.einsum("ij,ij->i", block, block))  # (b,)
            err = np.abs(norms - 1.0)
            row = int(np.argmax(err))
            if err[row] > worst_err:
                worst, worst_err, worst_norm = start + row, float(err[row]), float(norms[row])
        release()
    if bad:
        raise ValueError(
            f"{name} contains NaN or infinite values in {bad} of {n} rows (first: row {first_bad})"
        )
    if norm_tol is not None and worst_err > norm_tol:
        raise ValueError(
            f"{name} are not L2-normalised: row {worst} has norm {worst_norm:.6g} "
            f"(tolerance {norm_tol}); normalise them so that inner product equals cosine"
        )
    return np.ascontiguousarray(vectors)


def gpu_available() -> bool:
    """True when this faiss build has GPU support and at least one GPU is visible."""
    return (
        hasattr(faiss, "get_num_gpus")
        and hasattr(faiss, "index_cpu_to_all_gpus")
        and faiss.get_num_gpus() > 0
    )


def _default_nlist(n: int) -> int:
    # The usual 4 sqrt(n) cells, capped so that each cell gets the 39 training points faiss asks for.
    return max(1, min(int(round(4 * math.sqrt(n))), n // 39))


def build_index(
    vectors: np.ndarray,
    kind: IndexKind = "auto",
    *,
    flat_max: int = DEFAULT_FLAT_MAX,
    nlist: int | None = None,
    nprobe: int | None = None,
    train_size: int | None = None,
    hnsw_m: int = 32,
    ef_construction: int = 200,
    ef_search: int = 128,
    use_gpu: bool | Literal["auto"] = "auto",
    seed: int = 0,
    norm_tol: float | None = DEFAULT_NORM_TOL,
    ivf_codec: IvfCodec = "flat",
    train_iterations: int = 25,
    release: Callable[[], None] = no_release,
    take: Callable[[np.ndarray], np.ndarray] | None = None,
    on_disk: str | Path | None = None,
) -> faiss.Index:
    """Build an inner-product index holding ``vectors`` (float32, ``(n, d)``, L2-normalised).

    Ids in search results are row numbers of ``vectors``. ``kind="auto"`` is ``"flat"`` up to
    ``flat_max`` rows, else ``"ivf"``. IVF: ``nlist`` defaults to ``4 sqrt(n)`` (at most ``n / 39``),
    ``nprobe`` to ``max(8, nlist / 32)`` capped at ``nlist``, and k-means trains on a seeded sample of
    ``train_size`` rows (default ``64 * nlist``) for ``train_iterations`` k-means rounds (faiss's
    default 25; fewer rounds cost proportionally less and lose little recall), ``ivf_codec`` stores the vectors in
    full (``flat``) or as 8-, 6- or 4-bit scalars (``sq8``, ``sq6``, ``sq4``). HNSW: ``hnsw_m``
    links per node, ``ef_construction`` and ``ef_search`` beam widths. ``use_gpu="auto"`` moves flat and IVF indexes to all GPUs when
    :func:`gpu_available`; ``True`` demands it (RuntimeError otherwise; ValueError for HNSW, which
    faiss cannot run on GPU); ``False`` stays on CPU. The vectors are read and added ``BLOCK``
    rows at a time, ``release`` after each block (see the module docstring); ``take(rows)``,
    when given, gathers the k-means sample (``MappedVectors.take``) instead of the mapping.
    ``on_disk``: for an IVF index on the CPU, the file its lists are written to as they are
    added (``stages/mine/ondisk.py``: the bytes ``faiss.write_index`` writes for the index built
    in memory); the index returned maps that file read-only instead of holding its lists.
    """
    vectors = check_vectors(vectors, "vectors", norm_tol, release)
    n, d = vectors.shape
    if kind == "auto":
        kind = "flat" if n <= flat_max else "ivf"
    if kind not in ("flat", "ivf", "hnsw"):
        raise ValueError(f"kind must be 'auto', 'flat', 'ivf' or 'hnsw', got {kind!r}")
    on_gpu = _on_gpu(kind, use_gpu)
    if kind == "flat":
        index: faiss.Index = faiss.IndexFlatIP(d)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(d, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = ef_construction
        index.hnsw.efSearch = ef_search
    else:
        index = _trained_ivf(
            vectors, nlist, nprobe, train_size, seed, ivf_codec, train_iterations, release, take
        )
    if kind == "hnsw":
        # One add: HNSW inserts each call's vectors by level with a fresh shuffle, so blocks
        # would build another graph. The graph holds the vectors in memory anyway.
        index.add(vectors)
    elif kind == "ivf" and on_disk is not None and not on_gpu:
        write_ivf(index, vectors, on_disk, release)
        return read_mapped(on_disk)
    else:
        # faiss adds to an IVF index in chunks of 65,536 itself: the same assignments.
        for start in range(0, n, BLOCK):
            index.add(np.ascontiguousarray(vectors[start : start + BLOCK]))
            release()
    release()
    if on_gpu:
        index = faiss.index_cpu_to_all_gpus(index)
    return index


def _on_gpu(kind: str, use_gpu: bool | Literal["auto"]) -> bool:
    """Whether an index of ``kind`` goes to the GPUs under ``use_gpu`` (see :func:`build_index`).

    Raises ValueError for a ``use_gpu`` other than True, False or "auto" and for HNSW with
    ``use_gpu=True``; RuntimeError for ``use_gpu=True`` without a usable GPU.
    """
    if use_gpu not in (True, False, "auto"):
        raise ValueError(f"use_gpu must be True, False or 'auto', got {use_gpu!r}")
    if use_gpu is True:
        if kind == "hnsw":
            raise ValueError(
                "use_gpu=True with kind='hnsw': faiss has no GPU HNSW; use 'flat' or 'ivf'"
            )
        if not gpu_available():
            raise RuntimeError(
                "use_gpu=True but this faiss build has no GPU support or no GPU is visible "
                "(install faiss-gpu, or pass use_gpu='auto' to fall back to CPU)"
            )
        return True
    return use_gpu == "auto" and kind != "hnsw" and gpu_available()


def _ivf_settings(
    n: int,
    nlist: int | None,
    nprobe: int | None,
    train_size: int | None,
    ivf_codec: str,
    train_iterations: int,
) -> tuple[int, int, int]:
    """``(nlist, nprobe, train_size)`` for ``n`` vectors, defaults filled as :func:`build_index`
    says; ValueError naming the first setting out of range."""
    nlist = _default_nlist(n) if nlist is None else nlist
    if not 1 <= nlist <= n:
        raise ValueError(f"nlist must lie in [1, n={n}], got {nlist}")
    nprobe = min(nlist, max(8, nlist // 32)) if nprobe is None else nprobe
    if nprobe < 1:
        raise ValueError(f"nprobe must be >= 1, got {nprobe}")
    train_size = min(n, 64 * nlist) if train_size is None else min(n, train_size)
    if train_size < nlist:
        raise ValueError(
            f"train_size={train_size} is below nlist={nlist}: k-means needs a point per cell"
        )
    if ivf_codec not in IVF_CODECS:
        raise ValueError(f"ivf_codec must be one of {', '.join(IVF_CODECS)}, got {ivf_codec!r}")
    if train_iterations < 1:
        raise ValueError(f"train_iterations must be >= 1, got {train_iterations}")
    return nlist, nprobe, train_size


def _trained_ivf(
    vectors: np.ndarray,
    nlist: int | None,
    nprobe: int | None,
    train_size: int | None,
    seed: int,
    ivf_codec: str,
    train_iterations: int,
    release: Callable[[], None] = no_release,
    take: Callable[[np.ndarray], np.ndarray] | None = None,
) -> faiss.Index:
    """An empty IVF index (``IndexIVFFlat``, or ``IndexIVFScalarQuantizer`` for ``sq*``) whose
    ``nlist`` cells k-means trained on a ``seed``-drawn sample of ``train_size`` rows of
    ``vectors``, searching ``nprobe`` cells (at most ``nlist``)."""
    n, d = vectors.shape
    nlist, nprobe, train_size = _ivf_settings(
        n, nlist, nprobe, train_size, ivf_codec, train_iterations
    )
    quantizer = faiss.IndexFlatIP(d)
    if ivf_codec != "flat":
        qtype = getattr(faiss.ScalarQuantizer, SQ_TYPES[ivf_codec])
        index = faiss.IndexIVFScalarQuantizer(
            quantizer, d, nlist, qtype, faiss.METRIC_INNER_PRODUCT
        )
    else:
        index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
    index.cp.seed = seed
    index.cp.niter = train_iterations
    rows = np.sort(np.random.default_rng(seed).choice(n, size=train_size, replace=False))
    sample = take(rows) if take is not None else take_rows(vectors, rows, release)  # (t, d)
    train_ivf(index, sample)  # index.train(sample), in less memory
    index.nprobe = min(nprobe, nlist)
    return index


def search(
    index: faiss.Index,
    queries: np.ndarray,
    k: int,
    batch_size: int = 8192,
    norm_tol: float | None = DEFAULT_NORM_TOL,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` neighbours of each query by inner product, searched ``batch_size`` rows at a time.

    Batching bounds the temporary memory of the search (faiss allocates per-query heaps and, for
    flat search, score blocks) without changing results. Returns ``(scores, ids)``: float32 and
    int64 arrays of shape ``(n_queries, k)``, best first. Where the index holds fewer than ``k``
    reachable vectors the row is padded with id ``-1`` and score ``-inf``.
    """
    queries = check_vectors(queries, "queries", norm_tol)
    if queries.shape[1] != index.d:
        raise ValueError(
            f"dimension mismatch: queries have d={queries.shape[1]} but the index has d={index.d}"
        )
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    n = queries.shape[0]
    scores = np.empty((n, k), dtype=np.float32)  # (n, k)
    ids = np.empty((n, k), dtype=np.int64)  # (n, k)
    for start in range(0, n, batch_size):
        stop = min(n, start + batch_size)
        scores[start:stop], ids[start:stop] = index.search(queries[start:stop], k)
    scores[ids < 0] = -np.inf  # faiss pads with -FLT_MAX; -inf cannot pass any band test
    return scores, ids


def recall_at_k(approx_ids: np.ndarray, exact_ids: np.ndarray) -> float:
    """Fraction of the exact neighbours that the approximate search also returned, over all rows.

    ``approx_ids`` ``(n, k_a)`` and ``exact_ids`` ``(n, k)`` are id matrices from :func:`search`;
    ``-1`` entries of ``exact_ids`` (no neighbour) are not counted. Returns a float in [0, 1]
    (1.0 when there is nothing to find).
    """
    approx_ids = np.asarray(approx_ids)
    exact_ids = np.asarray(exact_ids)
    if approx_ids.ndim != 2 or exact_ids.ndim != 2 or approx_ids.shape[0] != exact_ids.shape[0]:
        raise ValueError(
            f"expected two (n, k) id matrices with the same n, got {approx_ids.shape} and {exact_ids.shape}"
        )
    found = 0
    wanted = 0
    chunk = max(1, 4_000_000 // max(1, exact_ids.shape[1] * approx_ids.shape[1]))
    for start in range(0, exact_ids.shape[0], chunk):
        ex = exact_ids[start : start + chunk]  # (c, k)
        ap = approx_ids[start : start + chunk]  # (c, k_a)
        hit = (ex[:, :, None] == ap[:, None, :]).any(axis=2) & (ex >= 0)  # (c, k)
        found += int(hit.sum())
        wanted += int((ex >= 0).sum())
    return 1.0 if wanted == 0 else found / wanted


def measure_recall(
    vectors: np.ndarray,
    index: faiss.Index,
    k: int = 10,
    sample_size: int = 1000,
    seed: int = 0,
    norm_tol: float | None = DEFAULT_NORM_TOL,
    release: Callable[[], None] = no_release,
    take: Callable[[np.ndarray], np.ndarray] | None = None,
) -> float:
    """Recall@k of ``index`` against exact search, on a seeded sample of ``vectors`` as queries.

    ``index`` must have been built from exactly ``vectors`` (ids are row numbers). Exact neighbours
    come from brute force over ``vectors``, ``BLOCK`` rows at a time (``release`` after each), so
    no second index is built; ``take(rows)``, when given, gathers the queries.
    """
    vectors = check_vectors(vectors, "vectors", norm_tol, release)
    if index.ntotal != vectors.shape[0]:
        raise ValueError(
            f"index holds {index.ntotal} vectors but {vectors.shape[0]} were given: "
            "measure recall against the vectors the index was built from"
        )
    n = vectors.shape[0]
    rows = np.sort(np.random.default_rng(seed).choice(n, size=min(sample_size, n), replace=False))
    queries = take(rows) if take is not None else take_rows(vectors, rows, release)  # (s, d)
    _, approx = search(index, queries, k, norm_tol=None)
    return recall_at_k(approx, exact_knn(queries, vectors, k, release))


def exact_knn(
    queries: np.ndarray, vectors: np.ndarray, k: int, release: Callable[[], None] = no_release
) -> np.ndarray:
    """Ids ``(len(queries), k)`` of the exact top-``k`` inner products of ``queries`` over
    ``vectors``, by brute force ``BLOCK`` corpus rows at a time (``release`` after each)."""
    heap = faiss.ResultHeap(len(queries), k, keep_max=True)
    for start in range(0, len(vectors), BLOCK):
        block = np.ascontiguousarray(vectors[start : start + BLOCK])  # (b, d)
        scores, ids = faiss.knn(
            queries, block, min(k, len(block)), metric=faiss.METRIC_INNER_PRODUCT
        )
        heap.add_result(scores, np.where(ids >= 0, ids + start, -1))
        release()
    heap.finalize()
    return heap.I
