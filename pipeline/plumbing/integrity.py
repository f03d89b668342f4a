"""Reading a dataset's shards verified against its manifest: a manifest's shard paths must stay
in the dataset's own data/ folder, and every shard's size and checksum are checked the first time
this process opens it (a changed, truncated or bit-flipped shard fails with one line naming the
dataset, the shard and the stage to rerun). Shards on a store are fetched into a local cache."""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import xxhash
from pairforge.pipeline.plumbing.errors import CorruptShardError
from pairforge.pipeline.plumbing.files import DECODE_THREADS, atomic_write_bytes, open_parquet
from pairforge.pipeline.plumbing.schemas import SchemaSpec, check_arrow_schema
from pairforge.pipeline.plumbing.storage import RemotePath, dataset_path

# The checksum verified on every read: xxh3_128 hashes ~10 GB/s on one core, sha256 ~1.5 and
# blake2b ~0.8 (docs/verify figures); sha256 stays in the manifest for people who check by hand.
FAST_CHECKSUM = "xxh3_128"

_SHARD_FILE = re.compile(r"^data/[A-Za-z0-9][A-Za-z0-9._-]*\.parquet$")
_SHARD_FILE_BESIDE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\.parquet$")


def shard_path_problem(file: Any, beside: bool = False) -> str | None:
    """Why a manifest's shard path is refused, or None: it must be ``data/<name>.parquet``, a
    plain name in the dataset's own data folder (not absolute, no ``..``, no other folder), so
    that a dataset received from elsewhere cannot make a stage read outside it. ``beside``: a
    format-1 manifest, whose shards sit beside it (``<name>.parquet``)."""
    if not isinstance(file, str):
        return "which is not a path"
    if file.startswith("/") or re.match(r"^[A-Za-z]:", file):
        return "an absolute path"
    if "\\" in file:
        return "a path with a backslash"
    if ".." in file.split("/"):
        return "a path that leaves the dataset"
    if not (_SHARD_FILE.match(file) or beside and _SHARD_FILE_BESIDE.match(file)):
        return "not a Parquet file directly in its data/ folder"
    return None


# Shards this process has checked against their manifest, by file identity: a shard is hashed
# the first time it is opened in a run and trusted until its file changes (new inode, size or
# mtime). Dask workers keep their own.
_verified: set[tuple] = set()
_verified_guard = threading.Lock()
# A file modified this recently may change again within the filesystem's timestamp granularity
# without its mtime moving (git's "racy clean" problem): it is hashed on every read instead.
RACY_SECONDS = 2.0


def _identity(file: Path, expected: str) -> tuple:
    st = file.stat()
    return (str(file.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, expected)


# What verification cost this process: shards and bytes hashed, seconds spent hashing.
_stats = {"shards": 0, "bytes": 0, "seconds": 0.0}


def verification_stats() -> dict[str, float]:
    """Shards and bytes this process hashed to verify reads, and the seconds it took."""
    with _verified_guard:
        return dict(_stats)


def _count(size: int, seconds: float) -> None:
    with _verified_guard:
        _stats["shards"] += 1
        _stats["bytes"] += size
        _stats["seconds"] += seconds


def _remember(identity: tuple) -> None:
    if time.time() - identity[4] / 1e9 > RACY_SECONDS:
        with _verified_guard:
            _verified.add(identity)


def _expected_checksum(shard: dict[str, Any]) -> tuple[str, str]:
    """The checksum a read verifies: xxh3_128 when the manifest has it (format 2), else sha256."""
    if shard.get(FAST_CHECKSUM):
        return FAST_CHECKSUM, shard[FAST_CHECKSUM]
    return "sha256", shard["sha256"]


def _hasher(algorithm: str) -> Any:
    return xxhash.xxh3_128() if algorithm == FAST_CHECKSUM else hashlib.sha256()


def _remedy(stage: str | None) -> str:
    writer = f" (`pairforge {stage}`)" if stage else ""
    return f"rerun the stage that writes it{writer} or fetch the dataset again"


def _shard_file(folder: Path, shard: dict[str, Any], label: str, stage: str | None) -> Path:
    file = folder / shard["file"]
    if not file.is_file():
        raise CorruptShardError(f"{label}: shard {shard['file']} is missing; {_remedy(stage)}")
    return file


def _check_size(file: Path, shard: dict, size: int, label: str, stage: str | None) -> None:
    if size != shard["bytes"]:
        raise CorruptShardError(
            f"{label}: shard {shard['file']} is corrupt (size {size} != {shard['bytes']} in the "
            f"manifest); {_remedy(stage)}"
        )


def _check_digest(shard: dict, algorithm: str, digest: str, label: str, stage: str | None) -> None:
    if digest != _expected_checksum(shard)[1]:
        raise CorruptShardError(
            f"{label}: shard {shard['file']} is corrupt ({algorithm} mismatch; size "
            f"{shard['bytes']} as in the manifest); {_remedy(stage)}"
        )


def verified_shard_path(
    folder: str | Path | RemotePath, shard: dict[str, Any], label: str, stage: str | None = None
) -> Path:
    """The path of a manifest ``shard`` of the dataset at ``folder``, after checking its size and
    checksum (streamed, once per process). For readers that stream a shard row group by row
    group; everything else reads through :func:`read_verified_shard`. A shard on a store is
    fetched into the local shard cache first (:func:`_cached_copy`)."""
    folder = dataset_path(folder)
    if isinstance(folder, RemotePath):
        return _cached_copy(folder, shard, label, stage)
    file = _shard_file(folder, shard, label, stage)
    algorithm, expected = _expected_checksum(shard)
    identity = _identity(file, expected)
    if identity in _verified:
        return file
    _check_size(file, shard, identity[3], label, stage)
    start = time.perf_counter()
    digest = _hasher(algorithm)
    with open(file, "rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
    _count(identity[3], time.perf_counter() - start)
    _check_digest(shard, algorithm, digest.hexdigest(), label, stage)
    _remember(identity)
    return file


def shard_cache() -> Path:
    """Where shards read from a store are kept for streaming readers: ``$PAIRFORGE_CACHE/shards``
    (default ``~/.cache/pairforge/shards``), one file per checksum."""
    root = os.environ.get("PAIRFORGE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pairforge"
    )
    return Path(root) / "shards"


def _cached_copy(folder: RemotePath, shard: dict[str, Any], label: str, stage: str | None) -> Path:
    """A verified local copy of a store's shard (fetched once per checksum; a copy that no longer
    matches its checksum is fetched again)."""
    algorithm, expected = _expected_checksum(shard)
    local = shard_cache() / f"{algorithm}-{expected}.parquet"
    if local.is_file():
        digest = _hasher(algorithm)
        digest.update(local.read_bytes())
        if digest.hexdigest() == expected:
            return local
    data = _verified_bytes(_shard_file(folder, shard, label, stage), shard, label, stage)
    local.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(local, data, durable=False)
    return local


def _verified_bytes(
    file: Path | RemotePath, shard: dict[str, Any], label: str, stage: str | None
) -> bytes:
    """The bytes of ``file``, read in one pass and checked against the manifest's size and
    checksum (a mismatch is one :class:`CorruptShardError` line)."""
    algorithm, _ = _expected_checksum(shard)
    data = file.read_bytes()
    _check_size(file, shard, len(data), label, stage)
    start = time.perf_counter()
    digest = _hasher(algorithm)
    digest.update(data)
    _count(len(data), time.perf_counter() - start)
    _check_digest(shard, algorithm, digest.hexdigest(), label, stage)
    return data


def read_verified_shard(
    folder: str | Path | RemotePath,
    shard: dict[str, Any],
    label: str,
    stage: str | None = None,
    spec: SchemaSpec | None = None,
    columns: list[str] | None = None,
) -> pa.Table:
    """Read one manifest ``shard`` of the dataset at ``folder``: the file's bytes are hashed as
    they are read into memory and decoded from that buffer (one pass over the file); a size or
    checksum that differs from the manifest, a file that does not decode, or a row count that
    differs is one :class:`CorruptShardError` line naming the dataset, the shard and the fix.
    A shard on a store is fetched and hashed on every read (there is no file identity to trust)."""
    folder = dataset_path(folder)
    file = _shard_file(folder, shard, label, stage)
    identity = (
        None if isinstance(file, RemotePath) else _identity(file, _expected_checksum(shard)[1])
    )
    source: Any = file
    if identity is None or identity not in _verified:
        if identity is not None:  # a local file's size is known before reading it
            _check_size(file, shard, identity[3], label, stage)
        source = pa.BufferReader(pa.py_buffer(_verified_bytes(file, shard, label, stage)))
    try:
        pf = open_parquet(source)
        if spec is not None:
            check_arrow_schema(pf.schema_arrow, spec, f"{folder}/{shard['file']}")
        table = pf.read(columns=columns, use_threads=DECODE_THREADS)
    except (pa.ArrowException, OSError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise CorruptShardError(
            f"{label}: shard {shard['file']} does not decode ({first}); {_remedy(stage)}"
        ) from None
    if table.num_rows != shard["rows"]:
        raise CorruptShardError(
            f"{label}: shard {shard['file']} has {table.num_rows} rows, {shard['rows']} in the "
            f"manifest; {_remedy(stage)}"
        )
    if identity is not None:
        _remember(identity)
    return table
