"""One writer per output: an exclusive lock file beside the dataset (or model) folder.

``data/sentences`` is locked by ``data/.sentences.lock``: the file sits outside the folder, so
DVC never hashes it and a finished dataset never carries it. The lock is an ``flock`` on that
file, which the kernel drops when its process dies, however it dies; the file also holds who
took it (pid, host, start time, command) so that a refused writer can name the holder. A lock
file whose ``flock`` is free was left by a process that is gone (killed, crashed): it is stale
and taken over with a warning.

On a store (``pipeline/plumbing/storage.py``) the lock is an object created only if absent
(S3's ``If-None-Match: *``) holding the same record; a store that cannot create so is refused,
one line. Nothing drops it when its process dies: a lock left by a process of this host that is
gone is taken over with a warning; one of another host is named with the command that
removes it.

Locks are per process and re-entrant: a second ``acquire`` of a lock this process holds only
counts; the lock is released (file removed) when the count drops to zero, and every lock still
held is released when the process exits, on an error too.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from pairforge.pipeline.plumbing.errors import DatasetLockedError, PairforgeError
from pairforge.pipeline.plumbing.storage import RemotePath, dataset_path

# Plumbing: no stage's output depends on this module, so it is no stage's code (its edits rerun
# nothing): pipeline/plumbing/stagedefs.py.
CHANGES_NO_OUTPUT = True

log = logging.getLogger("pairforge")

_held: dict[str, list[int]] = {}  # resolved lock path -> [fd, count]; fd -1: a store's lock
_objects: dict[str, RemotePath] = {}  # a store's lock key -> its object
_guard = threading.Lock()


def lock_path(output: str | Path | RemotePath) -> Path | RemotePath:
    """The lock file of an output folder: ``<parent>/.<name>.lock``."""
    output = dataset_path(output)
    return output.parent / f".{output.name}.lock"


def _holder(fd: int) -> dict:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 65536)
    try:
        found = json.loads(raw.decode()) if raw.strip() else {}
    except (UnicodeDecodeError, json.JSONDecodeError):
        found = {}
    return found if isinstance(found, dict) else {}


def _pid_alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _describe(holder: dict) -> str:
    return (
        f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, "
        f"since {holder.get('since', '?')}, `{holder.get('command', '?')}`"
    )


def _command() -> str:
    """This process's command line as the user typed it (``python -m pairforge.stages.cli``
    and the console script both read ``pairforge``)."""
    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    if program in ("cli.py", "__main__.py", "pairforge"):
        program = "pairforge"
    return " ".join([program, *sys.argv[1:]])[:500]


def acquire(output: str | Path, label: str | None = None) -> Path:
    """Take the writer lock of ``output``, or raise :class:`DatasetLockedError` naming the holder.

    Returns the lock file. Re-entrant within a process (see the module docstring).
    """
    path = lock_path(output)
    label = label or str(output)
    if isinstance(path, RemotePath):
        return _acquire_object(path, label)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = str(path.resolve())
    with _guard:
        if key in _held:
            _held[key][1] += 1
            return path
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = _holder(fd)
                os.close(fd)
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
                raise DatasetLockedError(
                    f"{label}: another writer holds it ({_describe(holder)}); wait for it to "
                    f"finish or stop it (lock file {path})"
                ) from None
            # The holder we raced with may have removed the file after we opened it: then our
            # flock is on an orphan inode and someone else may hold the path; start again.
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        stale = _holder(fd)
        if stale:
            here = stale.get("host") == socket.gethostname()
            gone = "is gone" if here and not _pid_alive(stale.get("pid")) else "no longer holds it"
            log.warning(
                "%s: taking over a stale lock (%s; that process %s)", label, _describe(stale), gone
            )
        record = _record()
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode())
        _held[key] = [fd, 1]
    return path


def _record() -> dict:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": _command(),
    }


def _acquire_object(path: RemotePath, label: str) -> RemotePath:
    """A store's writer lock: an object created only if absent (the module docstring)."""
    key = str(path)
    with _guard:
        if key in _held:
            _held[key][1] += 1
            return path
        for _ in range(3):
            try:
                created = path.create((json.dumps(_record(), sort_keys=True) + "\n").encode())
            except NotImplementedError:
                raise PairforgeError(
                    f"{label}: the store of {path} cannot create an object only if it is absent, "
                    "which the writer lock needs; write the dataset to a local folder or to a "
                    "store that can (S3 and its compatibles)"
                ) from None
            except Exception as exc:  # a read-only store, a denied write, an unreachable one
                first = (str(exc).strip().splitlines() or [""])[0][:200]
                raise PairforgeError(
                    f"{label}: cannot write the lock object {path} ({type(exc).__name__}: "
                    f"{first}); is the store writable with these credentials?"
                ) from None
            if created:
                _held[key] = [-1, 1]
                _objects[key] = path
                return path
            try:
                holder = json.loads(path.read_text())
            except FileNotFoundError:
                continue  # released meanwhile: try again
            except (UnicodeDecodeError, json.JSONDecodeError):
                holder = {}
            holder = holder if isinstance(holder, dict) else {}
            if holder.get("host") == socket.gethostname() and not _pid_alive(holder.get("pid")):
                log.warning(
                    "%s: taking over a stale lock (%s; that process is gone)",
                    label,
                    _describe(holder),
                )
                path.unlink(missing_ok=True)
                continue
            raise DatasetLockedError(
                f"{label}: another writer holds it ({_describe(holder)}); wait for it to finish "
                f"or stop it (lock object {path}; if that writer is gone, remove it: "
                f"`python -c \"import fsspec; fsspec.url_to_fs('{path}')[0].rm_file('{path}')\"`)"
            )
        raise DatasetLockedError(f"{label}: the lock object {path} kept changing; try again")


def release(output: str | Path | RemotePath) -> None:
    """Drop one count of this process's lock on ``output``; the last one removes the file."""
    path = lock_path(output)
    key = str(path.resolve())
    with _guard:
        entry = _held.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _held[key]
        if entry[0] == -1:
            _objects.pop(key).unlink(missing_ok=True)
            return
        # Remove while still holding the flock, so the next writer finds no stale file.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(entry[0])


def release_all() -> None:
    """Release every lock this process holds (at exit, and after a failed command)."""
    with _guard:
        held = list(_held.items())
        _held.clear()
    for key, (fd, _) in held:
        if fd == -1:
            with contextlib.suppress(Exception):  # at exit: a store that is gone is no error
                _objects.pop(key).unlink(missing_ok=True)
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(key)
        os.close(fd)


def held() -> list[str]:
    """Lock files this process holds (for tests and diagnostics)."""
    with _guard:
        return sorted(_held)


@contextlib.contextmanager
def writer_lock(output: str | Path, label: str | None = None) -> Iterator[Path | None]:
    """Hold the writer lock of ``output`` for the ``with`` block (a stage's run holds every
    folder it writes so, from its start: ``pipeline/plumbing/stagerun.py``; a ``DatasetWriter``
    takes its own as well). Under ``torchrun`` only rank 0 takes it: the ranks of one run are
    one writer."""
    if int(os.environ.get("RANK", "0") or 0) != 0:
        yield None
        return
    path = acquire(output, label)
    try:
        yield path
    finally:
        release(output)


atexit.register(release_all)
