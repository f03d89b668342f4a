"""The ``mine`` stage's index: built (or reloaded after a kill) from the stage's settings, and
searched in batches, with exact rescoring when the index stores approximate vectors."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import faiss
import numpy as np
from pairforge.pipeline.plumbing.errors import ConfigError
from pairforge.pipeline.science.mining_inputs import RowsRead, no_release
from pairforge.stages.mine.index import BLOCK, _default_nlist, build_index, gpu_available, search
from pairforge.stages.mine.ondisk import read_mapped

if TYPE_CHECKING:  # the index reads the stage's frozen config (no import at run time)
    from pairforge.stages.mine.stage import MineConfig

INDEX_FILE = "index.faiss"
# Queries per chunk of the exact rescoring from a matrix in memory: a chunk touches k scattered
# corpus rows per query, and ``release`` follows each chunk.
RESCORE_CHUNK = 512
# Corpus rows per range of the exact rescoring with positioned reads (``take``): at most this
# many rows are held at a time (48 MiB at d = 384), the range's span read whole when at least
# one row in RESCORE_DENSE is a neighbour (copying a row costs less than a read call of its own).
RESCORE_ROWS = 32_768
RESCORE_DENSE = 8
# Present where an NVIDIA driver is loaded: checked before torch is imported to ask for a GPU.
NVIDIA_DEVICE = Path("/dev/nvidiactl")


class Searcher:
    """Batched top-k search of corpus rows against an index built from exactly ``vectors``.

    ``rescore`` replaces the index's scores by exact cosines from ``vectors`` and re-sorts: an
    8-bit IVF index returns scores off by ~1e-3, and the band and eq. 2 need the real cosine.
    ``release`` is called whenever a step has touched ``vectors`` (``MappedVectors.release``
    for a memory-mapped matrix: the resident pages stay those of a chunk). ``take``, when
    given, reads the queries' and the rescored neighbours' rows instead of the mapping
    (``MappedVectors.take``: positioned reads, no mapped page enters the resident set).
    """

    def __init__(
        self,
        index: faiss.Index,
        vectors: np.ndarray,
        k: int,
        batch: int,
        rescore: bool = False,
        release: Callable[[], None] = no_release,
        take: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> None:
        self.index = index
        self.vectors = vectors  # (n, d) float32, row i is corpus row i
        self.k = k
        self.batch = batch
        self.rescore = rescore
        self.release = release
        self.take = take
        self._buffer: np.ndarray | None = None  # the rescoring's reads, (RESCORE_ROWS, d)

    @property
    def rows(self) -> np.ndarray | RowsRead:
        """What single rows are read from: ``vectors``, or with ``take`` a ``RowsRead`` of the
        mapped matrix (a row touched through the mapping maps a large folio of the file)."""
        return self.vectors if self.take is None else RowsRead(self.take, self.vectors.shape)

    def neighbours(self, rows: np.ndarray, k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(scores, ids)`` of shape ``(len(rows), k)``, best first, -1 / -inf padded;
        ``k`` defaults to the searcher's."""
        k = self.k if k is None else k
        if self.take is not None:
            queries = self.take(rows)  # (b, d)
        else:
            queries = np.ascontiguousarray(self.vectors[rows])  # (b, d)
            self.release()
        scores, ids = search(self.index, queries, k, self.batch, norm_tol=None)
        if not self.rescore:
            return scores, ids
        if self.take is not None:
            if self._buffer is None:  # kept: a fresh one would be faulted in at every search
                self._buffer = np.empty((RESCORE_ROWS, queries.shape[1]), dtype=np.float32)
            exact = _rescored(queries, ids, self.take, self._buffer)
        else:
            exact = self._rescored_in_memory(queries, ids)
        order = np.argsort(-exact, axis=1, kind="stable")
        return np.take_along_axis(exact, order, axis=1), np.take_along_axis(ids, order, axis=1)

    def _rescored_in_memory(self, queries: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Exact cosines ``(b, k)`` of ``queries`` to their neighbours ``ids`` read from
        ``vectors`` itself, ``RESCORE_CHUNK`` queries at a time; -inf where ``ids`` is -1."""
        safe = np.ascontiguousarray(np.maximum(ids, 0))  # (b, k)
        exact = np.empty(ids.shape, dtype=np.float32)  # (b, k)
        for lo in range(0, len(queries), RESCORE_CHUNK):
            hi = min(len(queries), lo + RESCORE_CHUNK)
            # q_i . v_ids[i, j] in faiss's C++, without numpy's (b, k, d) gather.
            faiss.fvec_inner_products_by_idx(
                faiss.swig_ptr(exact[lo:hi]),
                faiss.swig_ptr(queries[lo:hi]),
                faiss.swig_ptr(self.vectors),
                faiss.swig_ptr(safe[lo:hi]),
                queries.shape[1],
                hi - lo,
                ids.shape[1],
            )
            self.release()
        exact[ids < 0] = -np.inf
        return exact

    def band_neighbours(self, rows: np.ndarray, low: float, cap: int | None) -> BandSearch:
        """Neighbours of ``rows`` down to the bottom of the band: the search starts at ``k`` and
        doubles, for the rows whose last neighbour still has a cosine >= ``low``, until every
        row's band is exhausted or it holds ``cap`` slots (``cap`` None or <= k: ``k`` only).

        Rows are searched afresh at each width (a FAISS search cannot resume), so the work is
        at most twice that of one search at the final width; only open rows are searched again.
        Result arrays are ``(len(rows), width)``, padded with -1 / -inf past a row's ``searched``.
        """
        n = len(self.vectors)
        scores, ids = self.neighbours(rows)
        k = min(self.k, n)
        cap = k if cap is None else min(max(cap, k), n)
        searched = np.full(len(rows), k, dtype=np.int64)  # (b,)
        open_ = _band_open(scores, ids, low)  # (b,)
        while open_.any() and k < cap:
            k = min(2 * k, cap)
            grown_s, grown_i = self.neighbours(rows[open_], k)  # (b_open, k)
            pad = k - scores.shape[1]
            scores = np.pad(scores, ((0, 0), (0, pad)), constant_values=-np.inf)
            ids = np.pad(ids, ((0, 0), (0, pad)), constant_values=-1)
            scores[open_], ids[open_] = grown_s, grown_i
            searched[open_] = k
            open_[open_] = _band_open(grown_s, grown_i, low)
        # Still open at the cap (and not at the whole corpus): part of the band was not reached.
        capped = open_ & (searched < n)
        return BandSearch(scores, ids, searched, capped)


def _rescored(
    queries: np.ndarray,
    ids: np.ndarray,
    take: Callable[..., np.ndarray],
    buffer: np.ndarray | None = None,
) -> np.ndarray:
    """Exact cosines ``(b, k)`` of ``queries`` to their neighbours ``ids``, the neighbours'
    rows read by ``take(rows, out)`` range by range (``RESCORE_ROWS`` corpus rows each, into
    ``buffer``, float32 ``(RESCORE_ROWS, d)``, allocated when not given): a range dense in
    neighbours is read whole, a sparse one row by row, so the rows held at once are a range's
    whatever ``b``. -inf where ``ids`` is -1. Each cosine is faiss's ``fvec_inner_product`` of
    the same two rows as ``_rescored_in_memory``'s: the same bits."""
    b, k = ids.shape
    d = queries.shape[1]
    if buffer is None:
        buffer = np.empty((RESCORE_ROWS, d), dtype=np.float32)
    flat = ids.reshape(-1)  # (b k,)
    # The pairs grouped by range (a stable radix sort of small keys; range 0: no neighbour).
    key = np.where(flat >= 0, flat // RESCORE_ROWS + 1, 0)  # (b k,)
    key = key.astype(np.uint16 if key.max(initial=0) < 2**16 else np.int64)
    order = np.argsort(key, kind="stable")  # (b k,)
    bounds = np.concatenate([[0], np.cumsum(np.bincount(key))])
    exact = np.full(b * k, -np.inf, dtype=np.float32)  # (b k,)
    local = np.full(b * k, -1, dtype=np.int64)  # (b k,): row in the range read; -1 skipped
    part = np.empty(b * k, dtype=np.float32)
    for r in range(1, len(bounds) - 1):
        pairs = order[bounds[r] : bounds[r + 1]]
        if not len(pairs):
            continue
        got = flat[pairs]
        rows = np.unique(got)  # (u,) ascending
        first, span = int(rows[0]), int(rows[-1] - rows[0]) + 1
        if span <= RESCORE_DENSE * len(rows):  # one read of the whole range
            block = take(np.arange(first, first + span), buffer)  # (span, d)
            local[pairs] = got - first
        else:
            block = take(rows, buffer)  # (u, d)
            local[pairs] = np.searchsorted(rows, got)
        faiss.fvec_inner_products_by_idx(
            faiss.swig_ptr(part),
            faiss.swig_ptr(queries),
            faiss.swig_ptr(block),
            faiss.swig_ptr(local),
            d,
            b,
            k,
        )
        exact[pairs] = part[pairs]
        local[pairs] = -1
    return exact.reshape(b, k)


class BandSearch(NamedTuple):
    """What ``Searcher.band_neighbours`` found: ``(b, width)`` scores and ids, per row the slots
    searched and whether the cap stopped the search before the band ended."""

    scores: np.ndarray  # (b, width) float32, -inf padded
    ids: np.ndarray  # (b, width) int64, -1 padded
    searched: np.ndarray  # (b,) int64
    capped: np.ndarray  # (b,) bool


def _band_open(scores: np.ndarray, ids: np.ndarray, low: float) -> np.ndarray:
    """Rows whose last retrieved neighbour is real and still inside the band from below."""
    return (ids[:, -1] >= 0) & (scores[:, -1] >= np.float32(low))


def band_sizes(
    vectors: np.ndarray,
    rows: np.ndarray,
    low: float,
    high: float,
    block_bytes: int = 1 << 26,
    release: Callable[[], None] = no_release,
    take: Callable[[np.ndarray], np.ndarray] | None = None,
) -> np.ndarray:
    """Exact number of other corpus rows with a cosine in ``[low, high]`` to each of ``rows``,
    shape ``(len(rows),)``, by brute force in blocks of ``BLOCK`` corpus rows (``release``
    after each) and about ``block_bytes`` of scores (memory stays bounded at any corpus size).
    For the coverage check on a sample of anchors; ``take``, when given, reads their rows."""
    n = len(vectors)
    queries = take(rows) if take is not None else np.ascontiguousarray(vectors[rows])  # (s, d)
    out = np.zeros(len(rows), dtype=np.int64)
    lo, hi = np.float32(low), np.float32(high)
    for c0 in range(0, n, BLOCK):
        block = vectors[c0 : c0 + BLOCK]  # (c, d)
        per = max(1, block_bytes // (4 * len(block)))
        for start in range(0, len(rows), per):
            r = rows[start : start + per]
            cos = queries[start : start + per] @ block.T  # (q, c)
            own = (r >= c0) & (r < c0 + len(block))
            cos[np.flatnonzero(own), r[own] - c0] = np.nan  # the anchor is not in its band
            out[start : start + len(r)] += ((cos >= lo) & (cos <= hi)).sum(axis=1)
        release()
    return out


def open_index(
    vectors: np.ndarray,
    work: Path,
    cfg: MineConfig,
    release: Callable[[], None] = no_release,
    take: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[faiss.Index, dict[str, Any]]:
    """The index over ``vectors`` and facts about it for the metrics. An approximate index is
    saved under ``work`` once built and loaded from there by a resumed run (training an IVF or
    building an HNSW index is the costly part). ``release``, ``take``: see ``build_index``."""
    n, d = vectors.shape
    if search_engine(cfg) == "torch":
        return _torch_index(vectors, cfg, release)
    kind = cfg.index if cfg.index != "auto" else ("flat" if n <= cfg.flat_max else "ivf")
    use_gpu = {"auto": "auto", "yes": True, "no": False}[cfg.use_gpu]
    saved = work / INDEX_FILE
    start = time.monotonic()
    # An IVF index on the CPU is written to ``saved`` as it is built and searched mapped from
    # there (stages/mine/ondisk.py): its lists are not held in memory.
    gpu = use_gpu is not False and kind == "ivf" and gpu_available()
    mapped = kind == "ivf" and not gpu
    if kind != "flat" and saved.exists():
        index = read_mapped(saved) if mapped else faiss.read_index(str(saved))
        if gpu:
            index = faiss.index_cpu_to_all_gpus(index)
        loaded = True
    else:
        if mapped:
            work.mkdir(parents=True, exist_ok=True)
        try:
            index = build_index(
                vectors,
                kind,  # type: ignore[arg-type]
                nlist=cfg.nlist,
                nprobe=cfg.nprobe,
                train_size=cfg.train_size if cfg.train_size else _train_size(n, cfg.nlist),
                train_iterations=cfg.train_iterations,
                ivf_codec=cfg.ivf_codec,
                hnsw_m=cfg.hnsw_m,
                ef_construction=cfg.ef_construction,
                ef_search=cfg.ef_search,
                use_gpu=use_gpu,  # type: ignore[arg-type]
                seed=cfg.seed,
                release=release,
                take=take,
                on_disk=saved if mapped else None,
            )
        except (ValueError, RuntimeError) as exc:
            raise ConfigError(
                f"mine: cannot build a {kind} index over {n} vectors: {exc}"
            ) from None
        loaded = False
        if kind != "flat" and not mapped:
            work.mkdir(parents=True, exist_ok=True)
            cpu = faiss.index_gpu_to_cpu(index) if _on_gpu(index) else index
            tmp = work / f".{INDEX_FILE}.tmp"
            faiss.write_index(cpu, str(tmp))
            tmp.replace(saved)
    facts: dict[str, Any] = {
        "kind": kind,
        "engine": "faiss",
        "n": n,
        "dim": d,
        "gpu": _on_gpu(index),
        "build_seconds": round(time.monotonic() - start, 3),
        "loaded_from_work": loaded,
    }
    ivf = _ivf(index)
    if ivf is not None:
        facts.update(nlist=int(ivf.nlist), nprobe=int(ivf.nprobe), codec=cfg.ivf_codec)
    if kind == "hnsw":
        facts.update(hnsw_m=cfg.hnsw_m, ef_search=cfg.ef_search)
    return index, facts


def search_engine(cfg: MineConfig) -> str:
    """``faiss`` or ``torch``: ``search_engine`` as set, or under ``auto`` torch's exact search
    when a GPU is allowed and visible but this faiss build cannot use it (no faiss-gpu)."""
    if cfg.search_engine != "auto":
        return cfg.search_engine
    if cfg.use_gpu == "no" or gpu_available() or not NVIDIA_DEVICE.exists():
        return "faiss"  # the device file first: importing torch costs a second or two
    import torch

    return "torch" if torch.cuda.is_available() else "faiss"


def _torch_index(
    vectors: np.ndarray, cfg: MineConfig, release: Callable[[], None]
) -> tuple[Any, dict[str, Any]]:
    """Exact search in torch (``stages/mine/torch_search.py``), on the GPU when allowed and
    visible; the approximate kinds' settings do not apply."""
    from pairforge.stages.mine.torch_search import TorchFlatIndex, torch_device

    device = torch_device(cfg.use_gpu)
    if device is None:
        raise ConfigError("mine.use_gpu: 'yes', but torch sees no GPU (search_engine: torch)")
    if cfg.index not in ("auto", "flat"):
        raise ConfigError(
            f"mine.index: {cfg.index!r} is a faiss index; search_engine: torch searches exactly "
            "(index: flat or auto)"
        )
    start = time.monotonic()
    index = TorchFlatIndex(vectors, device, release)
    n, d = vectors.shape
    return index, {
        "kind": "flat",
        "engine": "torch",
        "n": n,
        "dim": d,
        "gpu": index.on_gpu,
        "build_seconds": round(time.monotonic() - start, 3),
        "loaded_from_work": False,
    }


def _train_size(n: int, nlist: int | None) -> int:
    # 40 points per cell: just above faiss's own minimum of 39; more barely moves recall here
    # and k-means time grows with it (benchmarks/mine.py).
    return 40 * (nlist or _default_nlist(n))


def _on_gpu(index: faiss.Index) -> bool:
    return "Gpu" in type(index).__name__


def _ivf(index: faiss.Index):
    try:
        return faiss.extract_index_ivf(index)
    except (RuntimeError, TypeError):
        return None


def flat_view(index: faiss.Index, vectors: np.ndarray) -> np.ndarray:
    """The vectors stored inside a CPU flat index (no second copy in memory), else ``vectors``."""
    if isinstance(index, faiss.IndexFlat) and index.ntotal == len(vectors):
        view = faiss.rev_swig_ptr(index.get_xb(), index.ntotal * index.d)
        return view.reshape(index.ntotal, index.d)
    return vectors
