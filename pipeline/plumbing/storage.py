"""Datasets on object storage: a dataset path may be an fsspec URL (``s3://bucket/pairs``,
``gs://``, ``memory://``...) wherever a local folder is accepted.

:func:`dataset_path` gives a local ``Path`` for a local folder (nothing changes for those) and a
:class:`RemotePath` for a URL: the few ``pathlib`` operations the dataset format uses (``/``,
``exists``, ``read_bytes``, ``glob``...), over the URL's fsspec filesystem. Credentials and the
endpoint come from the environment as the filesystem reads them (``AWS_ACCESS_KEY_ID``,
``AWS_ENDPOINT_URL_S3``...), never from params: nothing secret reaches a manifest or a log.

Commit semantics on a store without rename (``pipeline/plumbing/shards.py``): every object is
written with one PUT, which the store makes visible whole or not at all; a shard's marker is
written after the shard and the manifest after every shard, so a reader, which reads only
datasets with a manifest, never sees a partial dataset, and a killed writer resumes from its
markers. The writer lock is an object created only if absent (S3's ``If-None-Match: *``,
``pipeline/plumbing/locks.py``); a store that cannot do that is refused, one line.
"""

from __future__ import annotations

import fnmatch
import os
import re
import threading
from pathlib import Path, PurePosixPath
from typing import Any

# Plumbing: no stage's output depends on this module, so it is no stage's code (its edits rerun
# nothing): pipeline/plumbing/stagedefs.py.
CHANGES_NO_OUTPUT = True

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(path: object) -> bool:
    """Whether ``path`` names a dataset on a store (``scheme://``; ``file://`` is a local path)."""
    return isinstance(path, (str, RemotePath)) and (
        isinstance(path, RemotePath) or bool(_URL.match(path)) and not path.startswith("file://")
    )


def dataset_path(path: str | Path | RemotePath) -> Path | RemotePath:
    """A local ``Path``, or a :class:`RemotePath` for a URL."""
    if isinstance(path, RemotePath):
        return path
    if isinstance(path, str) and is_url(path):
        return RemotePath(path)
    if isinstance(path, str) and path.startswith("file://"):
        return Path(path[len("file://") :])
    return Path(path)


class RemotePath:
    """A path on an fsspec filesystem with the ``pathlib`` operations the dataset format uses.
    Picklable (a Dask worker rebuilds the filesystem from the URL and its own environment)."""

    def __init__(self, url: str, fs: Any = None) -> None:
        import fsspec

        self.url = url.rstrip("/")
        if fs is None:
            try:
                fs, _ = fsspec.core.url_to_fs(self.url)
            except (ImportError, ValueError) as exc:  # the store's package absent, an unknown one
                from pairforge.pipeline.plumbing.errors import ConfigError

                extra = " (pip install 'pairforge[s3]')" if self.url.startswith("s3") else ""
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise ConfigError(f"{self.url}: {first}{extra}") from None
        self.fs = fs
        self.scheme = self.url.split("://", 1)[0]
        self.key = self.url.split("://", 1)[1]

    def __reduce__(self) -> tuple:
        return (RemotePath, (self.url,))

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"RemotePath({self.url!r})"

    def __fspath__(self) -> str:
        raise TypeError(f"{self.url} is on a store, not a local path")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemotePath) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)

    def __truediv__(self, part: str) -> RemotePath:
        return RemotePath(f"{self.url}/{str(part).strip('/')}", self.fs)

    @property
    def name(self) -> str:
        return PurePosixPath(self.key).name

    @property
    def stem(self) -> str:
        return PurePosixPath(self.key).stem

    @property
    def parent(self) -> RemotePath:
        return RemotePath(f"{self.scheme}://{PurePosixPath(self.key).parent}", self.fs)

    def with_name(self, name: str) -> RemotePath:
        return self.parent / name

    def relative_to(self, other: RemotePath) -> PurePosixPath:
        return PurePosixPath(self.key).relative_to(other.key)

    def resolve(self) -> RemotePath:
        return self

    def _fs_path(self) -> str:
        return self.fs._strip_protocol(self.url)

    def exists(self) -> bool:
        return bool(self.fs.exists(self._fs_path()))

    def is_file(self) -> bool:
        return bool(self.fs.isfile(self._fs_path()))

    def is_dir(self) -> bool:
        return bool(self.fs.isdir(self._fs_path()))

    def size(self) -> int:
        return int(self.fs.size(self._fs_path()))

    def read_bytes(self) -> bytes:
        return bytes(self.fs.cat_file(self._fs_path()))

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def write_bytes(self, data: bytes) -> None:
        """One PUT: the object appears whole or not at all."""
        self.fs.pipe_file(self._fs_path(), bytes(data))

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode())

    def upload(self, local: Path) -> None:
        """Copy the local file ``local`` here, streamed (a multipart upload when it is large)."""
        self.fs.put_file(str(local), self._fs_path())

    def download(self, local: Path) -> None:
        """Copy this object to the local file ``local``, streamed, under a temporary name first."""
        tmp = local.with_name(f".{local.name}.part-{os.getpid()}-{threading.get_ident()}")
        self.fs.get_file(self._fs_path(), str(tmp))
        tmp.replace(local)

    def create(self, data: bytes) -> bool:
        """Write only if no object is there (S3's ``If-None-Match: *``); False if one is.
        A filesystem that cannot create exclusively raises ``NotImplementedError``."""
        try:
            self.fs.pipe_file(self._fs_path(), bytes(data), mode="create")
        except FileExistsError:
            return False
        except TypeError as exc:  # a filesystem whose pipe_file takes no mode
            raise NotImplementedError(str(exc)) from None
        return True

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self.fs.rm_file(self._fs_path())
        except FileNotFoundError:
            if not missing_ok:
                raise

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Nothing to make: a store's folders are key prefixes."""

    def rmtree(self) -> None:
        if self.fs.exists(self._fs_path()):
            self.fs.rm(self._fs_path(), recursive=True)
        self.fs.invalidate_cache()

    def iterdir(self) -> list[RemotePath]:
        if not self.fs.isdir(self._fs_path()):
            return []
        names = self.fs.ls(self._fs_path(), detail=False, refresh=True)
        return sorted(self / PurePosixPath(str(n)).name for n in names)

    def glob(self, pattern: str) -> list[RemotePath]:
        """Entries directly in this folder whose name matches ``pattern`` (no ``**``)."""
        return [p for p in self.iterdir() if fnmatch.fnmatchcase(p.name, pattern)]

    def __lt__(self, other: RemotePath) -> bool:
        return self.url < other.url


def remove_tree(path: Path | RemotePath) -> None:
    """``shutil.rmtree(path, ignore_errors=True)``, on a store too."""
    import shutil

    if isinstance(path, RemotePath):
        path.rmtree()
    else:
        shutil.rmtree(path, ignore_errors=True)
