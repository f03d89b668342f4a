"""What the mining stages (embed, mine, sample, report) read, and how they check it.

- embeddings: read back as one float32 ``(n, d)`` matrix, checked (finite, unit norm, aligned with
  the dataset they embed, made by the same encoder as the other embeddings in the run), in memory
  (``load_vectors``) or spilled to a file under the stage's ``_work`` and memory-mapped
  (``spill_vectors``: the resident pages are those a step touches, not the matrix; scattered
  rows are read with positioned reads, ``MappedVectors.take``, which map no page);
- texts: a read-only sequence view over an Arrow string column, so a million-sentence corpus is
  not turned into a million Python strings when only the rows a pool touches are needed.
"""

from __future__ import annotations

import logging
import mmap
import os
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.errors import DataIntegrityError, PairforgeError
from pairforge.pipeline.plumbing.files import DECODE_THREADS, open_parquet
from pairforge.pipeline.plumbing.shards import Dataset, open_dataset, read_manifest
from pairforge.pipeline.plumbing.storage import dataset_path

log = logging.getLogger("pairforge")

ENCODER_KEY = "encoder"  # manifest key of an embeddings dataset: how its vectors were made
# float16 storage rounds each component to ~3 significant digits, so a stored unit vector's norm
# is off by up to ~1e-3; vectors are renormalised after the cast, and this is the check before it.
STORED_NORM_TOL = 1e-2
# Rows per Parquet row group of an embeddings shard. Decoding a fixed-size list column costs
# several times its size in transient memory (levels, pages); reading one row group at a time
# keeps that to a few MiB instead of several times the shard.
VECTOR_ROW_GROUP = 4096


# ----------------------------------------------------------------------------- embeddings

_VECTOR_TYPE = re.compile(r"fixed_size_list<\w+: (halffloat|float)>\[(\d+)\]")


def embeddings_layout(path: str | Path) -> tuple[int, str]:
    """``(dim, dtype)`` of a complete embeddings dataset, read from its manifest."""
    manifest = read_manifest(path)
    schema = manifest.get("schema", {})
    if schema.get("name") != "embeddings":
        raise S.SchemaError(
            f"dataset {str(path)!r}: expected an embeddings dataset, found schema "
            f"{schema.get('name')!r}"
        )
    for field in schema.get("fields", []):
        if field["name"] == S.VECTOR:
            match = _VECTOR_TYPE.fullmatch(field["type"])
            if match:
                dtype = "float16" if match.group(1) == "halffloat" else "float32"
                return int(match.group(2)), dtype
    raise S.SchemaError(
        f"dataset {str(path)!r}: no fixed-size float vector column {S.VECTOR!r} in its manifest"
    )


def open_embeddings(path: str | Path) -> Dataset:
    dim, dtype = embeddings_layout(path)
    return open_dataset(path, S.embeddings_spec(dim, dtype))


def encoder_info(dataset: Dataset) -> dict[str, Any]:
    return dict(dataset.manifest.get(ENCODER_KEY) or {})


def check_same_encoder(a: Dataset, b: Dataset) -> None:
    """Both embeddings datasets must come from one encoder (model, pooling, prompt, length,
    engine and its precision, onnxruntime's int8 recipe included: int8 vectors sit ~0.004 in
    cosine from float32 ones, and two recipes differ as well)."""
    # Manifests written before the ctranslate2 engine existed name no engine: transformers.
    ia, ib = ({"engine": "transformers", **encoder_info(d)} for d in (a, b))
    keys = (
        "model",
        "pooling",
        "prompt",
        "max_length",
        "dim",
        "engine",
        "compute_type",
        "int8_recipe",
    )
    diff = [k for k in keys if ia.get(k) != ib.get(k)]
    if diff:
        detail = ", ".join(f"{k}: {ia.get(k)!r} vs {ib.get(k)!r}" for k in diff)
        raise PairforgeError(
            f"embeddings {str(a.path)!r} and {str(b.path)!r} were made by different encoders "
            f"({detail}); cosines between them would be meaningless: embed both again"
        )


def iter_vectors(dataset: Dataset, index: int) -> Iterator[tuple[pa.Array, np.ndarray]]:
    """``(ids, float32 (n, d) vectors)`` of shard ``index``, one Parquet row group at a time,
    checked like ``vectors_of`` (and the shard against its schema and manifest row count)."""
    dim, _ = embeddings_layout(dataset.path)
    shard = dataset.manifest["shards"][index]
    pf = open_parquet(dataset.shard_path(index))  # size and checksum checked first
    name = f"{dataset.path}/{shard['file']}"
    S.check_arrow_schema(pf.schema_arrow, dataset.spec, name)
    if pf.metadata.num_rows != shard["rows"]:
        raise DataIntegrityError(
            f"dataset {str(dataset.path)!r}: shard {shard['file']} has {pf.metadata.num_rows} "
            f"rows, manifest says {shard['rows']}"
        )
    for group in range(pf.num_row_groups):
        table = pf.read_row_group(group, columns=[S.ID, S.VECTOR], use_threads=DECODE_THREADS)
        yield table[S.ID].combine_chunks(), vectors_of(table, dim, name)


def vectors_of(table: pa.Table, dim: int, name: str) -> np.ndarray:
    """The ``vector`` column of an embeddings table as float32 ``(n, dim)``, renormalised.

    Raises DataIntegrityError naming the first bad row's id for NaN/inf components, a zero vector
    or a norm farther than ``STORED_NORM_TOL`` from 1 (vectors that were never normalised).
    """
    col = table[S.VECTOR].combine_chunks()
    if col.null_count:
        raise DataIntegrityError(f"{name}: {col.null_count} null vectors")
    flat = col.flatten().to_numpy(zero_copy_only=False)
    vectors = np.asarray(flat, dtype=np.float32).reshape(len(col), dim)  # (n, d)
    if not len(vectors):
        return vectors
    finite = np.isfinite(vectors).all(axis=1)
    norms = np.sqrt(np.einsum("ij,ij->i", vectors, vectors, dtype=np.float64))  # (n,)
    bad = ~finite | (np.abs(norms - 1.0) > STORED_NORM_TOL)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        what = "NaN or infinite components" if not finite[row] else f"norm {norms[row]:.4g}"
        raise DataIntegrityError(
            f"{name}: {int(bad.sum())} of {len(vectors)} vectors are not finite unit vectors "
            f"(first: id {table[S.ID][row].as_py()!r}, {what}); embed again"
        )
    return vectors / norms[:, None].astype(np.float32)


def load_vectors(dataset: Dataset, ids: pa.Array | None = None) -> np.ndarray:
    """All vectors of an embeddings dataset as float32 ``(n, d)``, rows in dataset order.

    ``ids``, when given, is the id column of the dataset these vectors embed: the embeddings must
    hold exactly those ids in that order (DataIntegrityError otherwise).
    """
    dim, _ = embeddings_layout(dataset.path)
    n = dataset.num_rows
    out = np.empty((n, dim), dtype=np.float32)
    got_ids = []
    start = 0
    for index in range(len(dataset)):
        for shard_ids, vectors in iter_vectors(dataset, index):
            out[start : start + len(vectors)] = vectors
            got_ids.append(shard_ids)
            start += len(vectors)
    if ids is not None:
        check_aligned(pa.chunked_array(got_ids, pa.string()), ids, str(dataset.path))
    return out


GATHER = 16_384  # rows per chunk of a gather of scattered rows from a mapped matrix


def no_release() -> None:
    """The ``release`` of a matrix held in memory: nothing to drop."""


def take_rows(
    vectors: np.ndarray, rows: np.ndarray, release: Callable[[], None] = no_release
) -> np.ndarray:
    """``vectors[rows]`` gathered ``GATHER`` rows at a time, ``release`` after each chunk."""
    out = np.empty((len(rows), vectors.shape[1]), dtype=vectors.dtype)  # (r, d)
    for start in range(0, len(rows), GATHER):
        out[start : start + GATHER] = vectors[rows[start : start + GATHER]]
        release()
    return out


VECTOR_FILE = "vectors.f32"  # spill_vectors' file in a stage's _work: raw float32, row-major
# Positioned reads (MappedVectors.take): rows at most READ_GAP apart are read in one call, the
# rows between them included (a 1.5 KiB row costs less to copy than a system call and a Python
# loop turn), in spans of at most READ_SPAN rows (the scratch buffer: 12 MiB at d = 384).
READ_GAP = 16
READ_SPAN = 8192


class MappedVectors:
    """A float32 ``(n, d)`` matrix in a file, memory-mapped read-only: ``array`` is the matrix,
    ``release()`` drops the pages this process touched from its resident set (they stay in the
    page cache: the next touch costs no disk read while memory is free). Steps that scan or
    gather the whole corpus call ``release`` between blocks, so a million 384-d vectors
    (1.43 GiB) cost the resident memory of a block.

    Scattered rows are better read with ``take`` (positioned reads into an array of this
    process) than through the mapping: a fault on a mapped file maps the pages around it too
    (fault-around, large folios), so a gather of a few thousand rows maps most of the file, and
    ``ru_maxrss`` counts those pages until ``release``."""

    def __init__(self, path: str | Path, n: int, dim: int) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self._map: mmap.mmap | None = None
        if n * dim:
            with open(self.path, "rb") as fh:
                self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            if len(self._map) != 4 * n * dim:
                raise DataIntegrityError(
                    f"{self.path}: {len(self._map)} bytes where {n} x {dim} float32 vectors "
                    f"take {4 * n * dim}"
                )
            self.array = np.frombuffer(self._map, dtype=np.float32).reshape(n, dim)  # (n, d)
        else:
            self.array = np.empty((n, dim), dtype=np.float32)

    def __len__(self) -> int:
        return len(self.array)

    def release(self) -> None:
        if self._map is not None:
            self._map.madvise(mmap.MADV_DONTNEED)

    def take(self, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``array[rows]`` (float32 ``(len(rows), d)``, any order, repeats allowed), read from
        the file with positioned reads: no page of the mapping is touched. The rows are read in
        ascending order, neighbours at most ``READ_GAP`` rows apart in one read of at most
        ``READ_SPAN`` rows. ``out``: a C-contiguous float32 array of ``len(rows)`` rows or
        more to read into (its first ``len(rows)`` rows are returned)."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        n, d = self.array.shape
        if out is None:
            out = np.empty((len(rows), d), dtype=np.float32)  # (r, d)
        elif out.dtype != np.float32 or out.shape[1:] != (d,) or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous float32 (m, {d}) array")
        out = out[: len(rows)]
        if not len(rows):
            return out
        if rows.min() < 0 or rows.max() >= n:
            raise IndexError(f"rows out of range for {n} vectors: {rows.min()}..{rows.max()}")
        ascending = bool((rows[1:] >= rows[:-1]).all())
        order = None if ascending else np.argsort(rows, kind="stable")
        srt = rows if order is None else rows[order]  # (r,) ascending
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        scratch = np.empty((min(READ_SPAN, int(srt[-1] - srt[0]) + 1), d), dtype=np.float32)
        # Runs of rows at most READ_GAP apart, each cut into reads of at most READ_SPAN rows.
        starts = np.concatenate([[0], np.flatnonzero(np.diff(srt) > READ_GAP) + 1, [len(srt)]])
        for a, b in zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True):
            while a < b:
                first = int(srt[a])
                stop = a + int(np.searchsorted(srt[a:b], first + READ_SPAN))  # rows < first+SPAN
                span = int(srt[stop - 1]) - first + 1
                if order is None and span == stop - a:  # consecutive rows: read in place
                    self._pread(out[a:stop], first * d * 4)
                else:
                    self._pread(scratch[:span], first * d * 4)
                    if order is None:
                        np.take(scratch, srt[a:stop] - first, axis=0, out=out[a:stop])
                    else:
                        out[order[a:stop]] = scratch[srt[a:stop] - first]
                a = stop
        return out

    def _pread(self, into: np.ndarray, offset: int) -> None:
        view = memoryview(into).cast("B")
        done = 0
        while done < len(view):
            got = os.preadv(self._fd, [view[done:]], offset + done)
            if got <= 0:
                raise DataIntegrityError(
                    f"{self.path}: short read at byte {offset + done} (the file shrank?)"
                )
            done += got

    def close(self) -> None:
        """Close the file descriptor ``take`` opened (the mapping stays)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.close()


class RowsRead:
    """``rows[i]``: row ``i`` of an ``(n, d)`` matrix read by ``take`` (``MappedVectors.take``:
    a positioned read a row), for the few scattered rows a step needs one at a time; ``shape``
    and ``ndim`` are the matrix's, so it stands for the matrix where single rows are read."""

    def __init__(self, take: Callable[[np.ndarray], np.ndarray], shape: tuple[int, int]) -> None:
        self.take = take
        self.shape = shape
        self.ndim = 2

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, i: int) -> np.ndarray:
        return self.take(np.array([i], dtype=np.int64))[0]  # (d,)


def spill_vectors(dataset: Dataset, ids: pa.Array | None, folder: str | Path) -> MappedVectors:
    """``load_vectors``' matrix written to ``folder/vectors.f32`` (atomically) one row group
    at a time and mapped (``MappedVectors``): the same checked, renormalised float32 values,
    without holding them in memory. A worker process maps the same file with
    ``MappedVectors(path, n, dim)``."""
    dim, _ = embeddings_layout(dataset.path)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / VECTOR_FILE
    for stale in folder.glob(f".{VECTOR_FILE}.tmp-*"):  # a killed spill's (the folder is ours)
        stale.unlink(missing_ok=True)
    tmp = folder / f".{VECTOR_FILE}.tmp-{os.getpid()}"
    got_ids = []
    try:
        with open(tmp, "wb") as fh:
            for index in range(len(dataset)):
                for shard_ids, vectors in iter_vectors(dataset, index):
                    fh.write(np.ascontiguousarray(vectors, dtype=np.float32).data)
                    got_ids.append(shard_ids)
        if ids is not None:
            check_aligned(pa.chunked_array(got_ids, pa.string()), ids, str(dataset.path))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return MappedVectors(path, dataset.num_rows, dim)


def check_aligned(
    found: pa.ChunkedArray | pa.Array, expected: pa.ChunkedArray | pa.Array, name: str
) -> None:
    """``found`` must equal ``expected`` element by element (same ids, same order)."""
    if len(found) != len(expected):
        raise DataIntegrityError(
            f"{name}: holds {len(found)} rows but the dataset it embeds has {len(expected)}; "
            "run embed again"
        )
    a = found.combine_chunks() if isinstance(found, pa.ChunkedArray) else found
    b = expected.combine_chunks() if isinstance(expected, pa.ChunkedArray) else expected
    if not a.equals(b):
        diff = np.flatnonzero(~np.asarray(pc.equal(a, b).fill_null(False)))
        row = int(diff[0])
        raise DataIntegrityError(
            f"{name}: row {row} has id {a[row].as_py()!r} where the embedded dataset has "
            f"{b[row].as_py()!r}; the embeddings are stale, run embed again"
        )


# ----------------------------------------------------------------------------- texts


class ArrowTexts(Sequence):
    """``texts[i]`` over an Arrow string array without materialising every Python string."""

    def __init__(self, array: pa.Array | pa.ChunkedArray) -> None:
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks() if array.num_chunks else pa.array([], pa.string())
        self.array = array

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return self.array[i].to_pylist()
        return self.array[int(i)].as_py()

    def take(self, rows: np.ndarray) -> list[str]:
        """Texts of ``rows`` (an int array), in that order."""
        return self.array.take(pa.array(np.asarray(rows, dtype=np.int64))).to_pylist()


def own_augmentations(
    path: str | None, sentence_ids: pa.Array, name: str = "candidates"
) -> tuple[np.ndarray, pa.Array, dict[str, Any]]:
    """The augmentations in ``path`` (a ``candidates``-schema dataset: the back-translations, or
    the LLM rewrites when ``name`` is ``rewrites``) sorted by their sentence's row in
    ``sentence_ids``: ``(rows, texts, facts)``. ``facts`` is the source's ``status`` (used /
    empty / absent / disabled) and ``rows``; augmentations of no sentence are counted as
    ``orphans``. A dataset of another schema raises SchemaError naming it."""
    empty = (np.empty(0, np.int64), pa.array([], pa.string()))
    if path is None:
        return *empty, {"status": "disabled", "rows": 0}
    if not dataset_path(path).exists():
        log.warning("mine: no %s dataset at %s: own augmentations cannot be excluded", name, path)
        return *empty, {"status": "absent", "rows": 0}
    dataset = open_dataset(path, S.CANDIDATES)
    if dataset.num_rows == 0:  # e.g. the demo's rewrites (rewrite disabled)
        return *empty, {"status": "empty", "rows": 0}
    table = dataset.read_table([S.ID, S.TEXT])
    anchor = pc.index_in(table[S.ID], value_set=sentence_ids)
    orphans = anchor.null_count
    keep = pc.is_valid(anchor)
    rows = pc.filter(anchor, keep).to_numpy().astype(np.int64)
    texts = pc.filter(table[S.TEXT], keep).combine_chunks()
    order = np.argsort(rows, kind="stable")
    facts = {"status": "used", "rows": table.num_rows, "orphans": orphans}
    if orphans:
        log.warning(
            "mine: %d %s of %s belong to no sentence (stale %s?)", orphans, name, path, name
        )
    return rows[order], texts.take(pa.array(order)), facts


def merge_augmentations(
    parts: Sequence[tuple[np.ndarray, pa.Array]],
) -> tuple[np.ndarray, pa.Array]:
    """Several sources' ``(rows, texts)`` from ``own_augmentations`` -> one pair, sorted by row,
    each sentence's texts in source order (empty sources leave the others as they were)."""
    rows = np.concatenate([r for r, _ in parts])
    texts = pa.concat_arrays([t for _, t in parts])
    order = np.argsort(rows, kind="stable")
    return rows[order], texts.take(pa.array(order))
