"""An IVF index whose inverted lists live in a file: written as the vectors are added, then
mapped read-only for the search; and its training in less memory.

A million 384-d vectors make 366 MiB of 8-bit lists. Built in memory, they are anonymous memory
from the first add to the end of the stage, and the lists' vectors grow by reallocation while
they are added. Here ``write_ivf`` encodes ``BLOCK`` rows at a time with faiss's own
``add_core`` and writes each block's share of every list at its place in the file (positioned
writes: no mapped page), so the file is byte for byte what ``faiss.write_index`` writes for the
index built in memory (tested), and ``read_mapped`` opens it the way faiss opens any index file
with ``IO_FLAG_MMAP``: the search reads the lists from the page cache, and the same file serves
a resumed run and the Dask workers. The pages a search touches count in the resident set (an
IVF search probes lists all over the index: a batch of queries touches all of it); they are
clean page cache, which the kernel can take back under memory pressure.

``train_ivf`` trains an empty 8-, 6- or 4-bit IVF index as ``index.train`` does, without the two
copies of the training sample that faiss makes for the scalar quantizer.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path

import faiss
import numpy as np
from pairforge.pipeline.science.mining_inputs import no_release

__all__ = ["is_mapped", "read_mapped", "train_ivf", "write_ivf"]

BLOCK = 65_536  # rows encoded at once; as index.BLOCK, so the coarse assignments are the same
_IDX = 8  # bytes of a faiss id (int64)


def write_ivf(
    index: faiss.IndexIVF,
    vectors: np.ndarray,
    path: str | Path,
    release: Callable[[], None] = no_release,
) -> None:
    """Add ``vectors`` (float32 ``(n, d)``, checked by the caller) to the trained, empty IVF
    ``index`` straight into the file ``path``: the index as ``faiss.write_index`` would write it
    after ``index.add(vectors)`` in blocks of ``BLOCK`` rows, byte for byte, without holding its
    lists. ``index`` itself stays empty. Two passes over ``vectors`` (``release`` after every
    block): the coarse assignments (each list's size, hence its place in the file), then the
    codes, written at their places. Written under a temporary name, then renamed.
    RuntimeError when this faiss writes empty indexes in a layout not known here."""
    n, d = vectors.shape
    ivf = faiss.extract_index_ivf(index)
    nlist, code_size = int(ivf.nlist), int(ivf.code_size)
    head = _header(index, nlist, code_size, n)
    assign = np.empty(n, dtype=np.int64)  # (n,) each row's list
    for start in range(0, n, BLOCK):
        block = np.ascontiguousarray(vectors[start : start + BLOCK])  # (b, d)
        # What IndexIVF::add_with_ids asks the quantizer before add_core.
        assign[start : start + len(block)] = ivf.quantizer.assign(block, 1).ravel()
        release()
    if (assign < 0).any():
        raise RuntimeError("the IVF quantizer assigned no list to some vectors")
    sizes = np.bincount(assign, minlength=nlist).astype(np.int64)  # (nlist,)
    head += _list_sizes(sizes, nlist)
    # List l: its codes, then its ids, lists in order (empty ones take no room).
    starts = len(head) + np.concatenate([[0], np.cumsum(sizes * (code_size + _IDX))[:-1]])
    filled = np.zeros(nlist, dtype=np.int64)  # (nlist,) entries written so far
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(head)
            fh.truncate(int(starts[-1] + sizes[-1] * (code_size + _IDX)) if nlist else len(head))
            fd = fh.fileno()
            for start in range(0, n, BLOCK):
                block = np.ascontiguousarray(vectors[start : start + BLOCK])  # (b, d)
                stop = start + len(block)
                ids = np.arange(start, stop, dtype=np.int64)
                part = assign[start:stop]
                ivf.add_core(
                    len(block), faiss.swig_ptr(block), faiss.swig_ptr(ids), faiss.swig_ptr(part)
                )
                release()
                lists = ivf.invlists
                for cell in np.unique(part).tolist():
                    m = lists.list_size(cell)
                    codes = faiss.rev_swig_ptr(lists.get_codes(cell), m * code_size)
                    got = faiss.rev_swig_ptr(lists.get_ids(cell), m)
                    base, done = int(starts[cell]), int(filled[cell])
                    _pwrite(fd, codes, base + done * code_size)
                    _pwrite(fd, got, base + int(sizes[cell]) * code_size + done * _IDX)
                    filled[cell] += m
                lists.reset()  # the next block's lists start empty (ids are explicit)
                ivf.ntotal = 0
        if not np.array_equal(filled, sizes):
            raise RuntimeError("the IVF lists written do not match their coarse assignment")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def train_ivf(index: faiss.Index, x: np.ndarray) -> None:
    """``index.train(x)`` for an empty IVF index (``x``: float32 ``(n, d)``, C-contiguous), with
    the same result, in less memory for an 8-, 6- or 4-bit residual scalar quantizer.

    faiss trains such an index by k-means on ``x``, then trains the quantizer on the residuals
    of at most ``train_encoder_num_vectors()`` (100,000) rows of ``x``: a seeded copy of those
    rows and their residuals, two more matrices the size of the sample (293 MiB at 1M
    sentences). These quantizers (range statistic min-max, faiss's default) keep only each
    component's minimum and maximum residual, so here the residuals are computed in chunks
    (each the same rows, assigned in the same blocks of faiss's BLAS search as in one call) and
    faiss trains the quantizer on the two rows (minima, maxima): the same trained values
    (tested). Other indexes call ``index.train``."""
    ivf = faiss.extract_index_ivf(index)
    ranged = (faiss.ScalarQuantizer.QT_8bit, faiss.ScalarQuantizer.QT_6bit,
              faiss.ScalarQuantizer.QT_4bit)  # fmt: skip
    squant = isinstance(ivf, faiss.IndexIVFScalarQuantizer) and (
        ivf.by_residual
        and ivf.sq.qtype in ranged
        and ivf.sq.rangestat == faiss.ScalarQuantizer.RS_minmax
    )
    if not squant or ivf.is_trained:
        index.train(x)
        return
    n, d = x.shape
    ivf.train_q1(n, faiss.swig_ptr(x), False, ivf.metric_type)  # k-means, as index.train
    limit = int(ivf.train_encoder_num_vectors())
    rows = None  # faiss's fvecs_maybe_subsample: all rows, or these (its seed, 1234)
    if 0 < limit < n:
        perm = np.empty(n, dtype=np.int32)
        faiss.rand_perm(faiss.swig_ptr(perm), n, 1234)
        rows = perm[:limit]
    m = n if rows is None else limit
    centroids = ivf.quantizer.reconstruct_n(0, ivf.quantizer.ntotal)  # (nlist, d)
    # Chunks of whole query blocks of faiss's BLAS search; a last chunk too small for BLAS
    # (rows x d below faiss's threshold) joins the one before, as it is in one call.
    step = 4 * int(faiss.cvar.distance_compute_blas_query_bs)
    cuts = list(range(0, m, step)) + [m]
    if len(cuts) > 2 and (cuts[-1] - cuts[-2]) * d < int(
        faiss.cvar.distance_compute_blas_threshold
    ):
        del cuts[-2]
    low = np.full(d, np.inf, dtype=np.float32)
    high = np.full(d, -np.inf, dtype=np.float32)
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        chunk = np.ascontiguousarray(x[a:b] if rows is None else x[rows[a:b]])  # (c, d)
        keys = ivf.quantizer.assign(chunk, 1).ravel()
        residuals = chunk - centroids[keys]  # (c, d): x - c, as compute_residual_n
        np.minimum(low, residuals.min(axis=0), out=low)
        np.maximum(high, residuals.max(axis=0), out=high)
    extremes = np.ascontiguousarray(np.stack([low, high]))  # (2, d)
    ivf.sq.train(2, faiss.swig_ptr(extremes))
    ivf.is_trained = True


def _header(index: faiss.Index, nlist: int, code_size: int, n: int) -> bytes:
    """The serialised empty ``index`` up to its lists' sizes, with ``ntotal`` set to ``n``."""
    empty = faiss.serialize_index(index).tobytes()
    tail = b"ilar" + struct.pack("<QQ", nlist, code_size) + b"sprs" + struct.pack("<Q", 0)
    # write_index_header: fourcc, d (int32), ntotal (int64), ...
    if not empty.endswith(tail) or struct.unpack("<iq", empty[4:16]) != (index.d, 0):
        raise RuntimeError(
            "this faiss serialises an empty IVF index in an unknown layout; "
            "the index cannot be written to disk as it is built"
        )
    return empty[:8] + struct.pack("<q", n) + empty[16 : -len(tail)] + tail[:20]


def _list_sizes(sizes: np.ndarray, nlist: int) -> bytes:
    """The sizes section of faiss's ``ilar`` lists: every size when more than half the lists
    hold entries (``full``), else (list, size) pairs (``sprs``)."""
    if np.count_nonzero(sizes) > nlist // 2:
        body = sizes
        kind = b"full"
    else:
        used = np.flatnonzero(sizes)
        body = np.stack([used, sizes[used]], axis=1).ravel()
        kind = b"sprs"
    return kind + struct.pack("<Q", len(body)) + body.astype("<u8").tobytes()


def _pwrite(fd: int, array: np.ndarray, offset: int) -> None:
    view = memoryview(array).cast("B")
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)


def read_mapped(path: str | Path) -> faiss.Index:
    """The IVF index in ``path`` with its lists mapped read-only (not read into memory)."""
    return faiss.read_index(str(path), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)


def is_mapped(index: faiss.Index) -> bool:
    """Whether ``index`` is an IVF index whose lists are mapped from a file (``read_mapped``)."""
    try:
        ivf = faiss.extract_index_ivf(index)
    except (RuntimeError, TypeError):
        return False
    return isinstance(faiss.downcast_InvertedLists(ivf.invlists), faiss.OnDiskInvertedLists)
