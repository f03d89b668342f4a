"""Files as pairforge writes and reads them: written under a temporary name and renamed into
place (a reader sees the old file or the whole new one; a killed writer's temporaries are
removed), with the modes the user's umask gives, checksummed in one pass, and Parquet read on the
calling thread."""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import xxhash
from pairforge.pipeline.plumbing.storage import RemotePath

# Parquet decodes on the reading thread, not on Arrow's thread pools (every reader of shards and
# corpora opens its file with :func:`open_parquet` and passes this): a process that had read from a
# store (fsspec's event-loop thread alive) and decoded on the CPU pool aborted at exit about one
# time in thirty under load, after its work was done ("terminate called without an active
# exception", exit -6; apache/arrow#34314), which fails a DVC stage whose outputs are written.
# tests/pipeline/test_storage.py checks that no reader starts a pool thread.
DECODE_THREADS = False


def open_parquet(source: Any) -> pq.ParquetFile:
    """A Parquet file to read on the calling thread: without pre-buffering, which reads a local
    file's column chunks on Arrow's I/O thread pool (pairforge reads local files and buffers)."""
    return pq.ParquetFile(source, pre_buffer=False)


def file_checksums(path: Path, block: int = 1 << 20) -> tuple[str, str, int]:
    """sha256, xxh3_128 and size of a file, in one pass."""
    sha, fast, size = hashlib.sha256(), xxhash.xxh3_128(), 0
    with open(path, "rb") as fh:
        while chunk := fh.read(block):
            sha.update(chunk)
            fast.update(chunk)
            size += len(chunk)
    return sha.hexdigest(), fast.hexdigest(), size


def atomic_write_bytes(path: Path, data: bytes | pa.Buffer, durable: bool = True) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one.

    ``durable`` fsyncs before the rename (survives power loss); without it the write still
    survives a killed process, which is all that scratch data needs. On a store
    (``pipeline/plumbing/storage.py``) one PUT is atomic already.
    """
    if isinstance(path, RemotePath):
        path.write_bytes(bytes(data))
        return
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    with named_on_failure(path, tmp), open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        if durable:
            os.fsync(fh.fileno())
    os.replace(tmp, path)


@contextlib.contextmanager
def named_on_failure(path: Path, tmp: Path) -> Iterator[None]:
    """Remove the temporary ``tmp`` of a write that failed, and give an error without a file
    name (a full disk on write or close) the name of the file being written, ``path``."""
    try:
        yield
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if exc.filename is None and exc.errno is not None:
            raise OSError(exc.errno, exc.strerror or os.strerror(exc.errno), str(path)) from exc
        if exc.errno is None and "No space left on device" in str(exc):  # Arrow's IOError
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from exc
        raise


def remove_dead_temporaries(path: Path) -> int:
    """Remove ``path``'s temporaries (:func:`atomic_write_bytes`) left by writers that no longer
    run (a kill between the open and the rename leaves one); a live writer's, this process's
    included, are kept. Returns how many were removed. For a stage's single files (its metrics):
    a dataset's folder clears its own on resume, and listing a folder on every write would cost
    its shard and progress writes a scan each."""
    removed = 0
    for stale in path.parent.glob(f".{glob.escape(path.name)}.tmp-*"):
        pid = stale.name.rsplit(".tmp-", 1)[1].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # alive (or reused by another process: kept, never a live write removed)
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        stale.unlink(missing_ok=True)
        removed += 1
    return removed


def atomic_write_json(path: Path, obj: Any, durable: bool = True) -> None:
    atomic_write_bytes(
        path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode(), durable=durable
    )


def current_umask() -> int:
    """The process's umask, read without changing it where the OS allows (Linux /proc)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    # Elsewhere the only API sets it; setting it back at once is racy only against other threads
    # creating files in that instant.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def apply_umask(path: str | Path) -> None:
    """Give ``path``, or a folder and everything under it, the modes that ``open`` and ``mkdir``
    give new files under the user's umask: 0o666 (0o777 for folders and executables) less it.

    Libraries that write through ``mkstemp`` leave 0o600 (safetensors' ``model.safetensors``),
    which the rest of a group sharing a model folder cannot read; call this on what such a
    library wrote before publishing it (before the rename into place).
    """
    mask = current_umask()
    root = Path(path)
    todo = [root]
    if root.is_dir():
        todo += list(root.rglob("*"))
    for p in todo:
        if p.is_symlink():
            continue
        st = p.stat()
        full = 0o777 if p.is_dir() or st.st_mode & 0o111 else 0o666
        want = full & ~mask
        if st.st_mode & 0o777 != want:
            os.chmod(p, want)
