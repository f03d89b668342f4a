"""Datasets on disk: a folder of Parquet shards plus a JSON manifest.

Layout of a dataset folder::

    _manifest.json         written last (the leading _ keeps Arrow and DuckDB folder readers off it); its presence means the dataset is complete
    part-00000.parquet     shards, numbered from 0, each a self-describing Parquet file
    _progress/             while a stage runs: one JSON marker per finished shard, and run.json

Every file is written under a temporary name in the same folder and renamed into place, so a
reader never sees half a file. A shard counts as finished only when its marker exists; a run
killed at any moment and started again keeps the finished shards and rewrites the rest. A run
whose fingerprint (stage, params, inputs, code) differs from the folder's starts from scratch.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pairforge.pipeline.errors import DataIntegrityError, IncompleteDatasetError
from pairforge.pipeline.schemas import META_SCHEMA, SchemaError, SchemaSpec, check_arrow_schema
from pairforge.pipeline.version import code_version

FORMAT = "pairforge-dataset"
FORMAT_VERSION = 1
MANIFEST = "_manifest.json"
PROGRESS = "_progress"
RUN_FILE = "run.json"


# Shards whose Arrow data is at most this size are encoded in memory before they are written.
IN_MEMORY_SHARD_BYTES = 256 << 20


def shard_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


def sha256_file(path: Path, block: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def atomic_write_bytes(path: Path, data: bytes | pa.Buffer, durable: bool = True) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one.

    ``durable`` fsyncs before the rename (survives power loss); without it the write still
    survives a killed process, which is all that scratch data needs.
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        if durable:
            os.fsync(fh.fileno())
    os.replace(tmp, path)


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


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


@dataclass(frozen=True)
class ShardInfo:
    """What the manifest records of one shard; ``counts`` carries the stage's per-shard tallies."""

    file: str
    rows: int
    sha256: str
    bytes: int
    counts: dict[str, int] = field(default_factory=dict)


def write_shard(
    folder: Path,
    index: int,
    table: pa.Table,
    spec: SchemaSpec,
    dataset: str,
    counts: dict[str, int] | None = None,
    row_group_size: int = 64_000,
    compression: str = "zstd",
    durable: bool = True,
) -> ShardInfo:
    """Write shard ``index`` of a dataset atomically and mark it finished.

    Safe to call from a Dask worker: it touches only its own shard and marker. ``durable``
    fsyncs before the rename (survives power loss); without it the write still survives a
    killed process, which is all that scratch data needs.
    """
    table = spec.conform(table, dataset)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / PROGRESS).mkdir(exist_ok=True)
    final = folder / shard_name(index)
    if table.nbytes <= IN_MEMORY_SHARD_BYTES:
        # Encode in memory: the sha256 is taken from the bytes, not from a re-read of the file.
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression=compression, row_group_size=row_group_size)
        data = sink.getvalue()
        atomic_write_bytes(final, data, durable=durable)
        sha256, size = hashlib.sha256(data).hexdigest(), data.size
    else:
        tmp = folder / f".{final.name}.tmp-{os.getpid()}-{threading.get_ident()}"
        pq.write_table(table, tmp, compression=compression, row_group_size=row_group_size)
        if durable:
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, final)
        sha256, size = sha256_file(final), final.stat().st_size
    info = ShardInfo(
        file=final.name, rows=table.num_rows, sha256=sha256, bytes=size, counts=dict(counts or {})
    )
    atomic_write_json(folder / PROGRESS / f"{final.stem}.json", asdict(info), durable=durable)
    return info


class DatasetWriter:
    """Coordinates the shards of one output dataset across a (possibly resumed) run.

    ``fingerprint`` identifies what the dataset is computed from; finished shards are kept only
    when it matches the one recorded by the interrupted run.
    """

    def __init__(
        self,
        path: str | Path,
        spec: SchemaSpec,
        *,
        stage: str,
        params: dict[str, Any],
        fingerprint: str,
        rows_per_shard: int | None = None,
        name: str | None = None,
        scratch: bool = False,
    ) -> None:
        self.path = Path(path)
        self.spec = spec
        self.stage = stage
        self.params = params
        self.fingerprint = fingerprint
        self.rows_per_shard = rows_per_shard
        self.name = name or str(path)
        # Scratch datasets (a stage's intermediate work) are written fast: no compression, no fsync.
        self.write_options = {"compression": "none", "durable": False} if scratch else {}
        self.progress_dir = self.path / PROGRESS
        self.complete = self._prepare()

    def _prepare(self) -> bool:
        self._remove_temporaries()
        manifest = self.path / MANIFEST
        if manifest.exists():
            found = json.loads(manifest.read_text())
            if found.get("fingerprint") == self.fingerprint:
                shutil.rmtree(self.progress_dir, ignore_errors=True)
                return True
            self._clear()
        run_file = self.progress_dir / RUN_FILE
        if run_file.exists():
            run = json.loads(run_file.read_text())
            if run.get("fingerprint") == self.fingerprint:
                self.created_at = run["created_at"]
                return False
        self._clear()
        self.progress_dir.mkdir(parents=True, exist_ok=True)
        self.created_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        atomic_write_json(
            run_file, {"fingerprint": self.fingerprint, "created_at": self.created_at}
        )
        return False

    def _remove_temporaries(self) -> None:
        """Half-written files of a killed run (their final names were never taken)."""
        for folder in (self.path, self.progress_dir):
            if folder.is_dir():
                for tmp in folder.glob(".*.tmp-*"):
                    tmp.unlink(missing_ok=True)

    def _clear(self) -> None:
        """Remove what an earlier, different run left (only files this format owns)."""
        if not self.path.exists():
            return
        for child in self.path.iterdir():
            owned = child.name in {MANIFEST, PROGRESS, "_work"} or (
                child.name.startswith(("part-", ".part-", f".{MANIFEST}"))
            )
            if not owned:
                continue
            if child.is_dir():
                shutil.rmtree(child)
            else:
                child.unlink()

    def is_done(self, index: int) -> bool:
        if self.complete:
            return True
        marker = self.progress_dir / f"part-{index:05d}.json"
        return marker.exists() and (self.path / shard_name(index)).exists()

    def done_info(self, index: int) -> ShardInfo:
        if self.complete:
            return ShardInfo(**read_manifest(self.path)["shards"][index])
        marker = self.progress_dir / f"part-{index:05d}.json"
        return ShardInfo(**json.loads(marker.read_text()))

    def write(self, index: int, table: pa.Table, counts: dict[str, int] | None = None) -> ShardInfo:
        return write_shard(
            self.path, index, table, self.spec, self.name, counts, **self.write_options
        )

    def finished_shards(self) -> list[ShardInfo]:
        if self.complete:
            return [ShardInfo(**s) for s in read_manifest(self.path)["shards"]]
        infos = []
        index = 0
        while self.is_done(index):
            infos.append(self.done_info(index))
            index += 1
        return infos

    def finalize(self, num_shards: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Check that shards 0..num_shards-1 are finished, then write the manifest (last)."""
        if self.complete:
            return read_manifest(self.path)
        shards = []
        for index in range(num_shards):
            if not self.is_done(index):
                raise DataIntegrityError(
                    f"dataset {self.name!r}: shard {index} is not finished; cannot finalize"
                )
            shards.append(asdict(self.done_info(index)))
        stray = sorted(p.name for p in self.path.glob("part-*.parquet"))[num_shards:]
        for name in stray:
            (self.path / name).unlink()
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "schema": {
                "name": self.spec.name,
                "version": self.spec.version,
                "fields": [{"name": f.name, "type": str(f.type)} for f in self.spec.schema],
                "doc": self.spec.doc,
            },
            "stage": self.stage,
            "params": self.params,
            "fingerprint": self.fingerprint,
            "code_version": code_version(self.stage),
            "created_at": self.created_at,
            "rows": sum(s["rows"] for s in shards),
            "rows_per_shard": self.rows_per_shard,
            "num_shards": len(shards),
            "shards": shards,
            **(extra or {}),
        }
        atomic_write_json(self.path / MANIFEST, manifest)
        shutil.rmtree(self.progress_dir, ignore_errors=True)
        self.complete = True
        return manifest


def read_manifest(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    manifest = path / MANIFEST
    if not manifest.exists():
        if (path / PROGRESS).exists():
            why = "its stage was interrupted; run the stage again to finish it"
        elif path.exists():
            why = "it has no _manifest.json"
        else:
            why = "the folder does not exist"
        raise IncompleteDatasetError(f"dataset {str(path)!r} is not complete: {why}")
    try:
        return json.loads(manifest.read_text())
    except json.JSONDecodeError as exc:
        raise DataIntegrityError(
            f"dataset {str(path)!r}: unreadable _manifest.json: {exc}"
        ) from None


class Dataset:
    """A complete dataset opened for reading; shards are checked against the schema on read."""

    def __init__(self, path: Path, manifest: dict[str, Any], spec: SchemaSpec) -> None:
        self.path = path
        self.manifest = manifest
        self.spec = spec

    @property
    def num_rows(self) -> int:
        return int(self.manifest["rows"])

    @property
    def files(self) -> list[Path]:
        return [self.path / s["file"] for s in self.manifest["shards"]]

    def __len__(self) -> int:
        return len(self.manifest["shards"])

    def read_shard(self, index: int, columns: list[str] | None = None) -> pa.Table:
        shard = self.manifest["shards"][index]
        file = self.path / shard["file"]
        if not file.exists():
            raise DataIntegrityError(
                f"dataset {str(self.path)!r}: shard {shard['file']} is missing"
            )
        pf = pq.ParquetFile(file)
        check_arrow_schema(pf.schema_arrow, self.spec, f"{self.path}/{shard['file']}")
        table = pf.read(columns=columns)
        if table.num_rows != shard["rows"]:
            raise DataIntegrityError(
                f"dataset {str(self.path)!r}: shard {shard['file']} has {table.num_rows} rows, "
                f"manifest says {shard['rows']}"
            )
        return table

    def iter_shards(self, columns: list[str] | None = None) -> Iterator[pa.Table]:
        for index in range(len(self)):
            yield self.read_shard(index, columns)

    def read_table(self, columns: list[str] | None = None) -> pa.Table:
        tables = list(self.iter_shards(columns))
        if not tables:
            schema = self.spec.schema
            if columns is not None:
                schema = pa.schema([schema.field(c) for c in columns])
            return schema.empty_table()
        return pa.concat_tables(tables)

    def verify(self) -> None:
        """Recompute every shard's sha256 and compare it with the manifest."""
        for shard in self.manifest["shards"]:
            file = self.path / shard["file"]
            if not file.exists() or sha256_file(file) != shard["sha256"]:
                raise DataIntegrityError(
                    f"dataset {str(self.path)!r}: shard {shard['file']} does not match its "
                    "manifest (missing or changed since it was written)"
                )


def open_dataset(path: str | Path, spec: SchemaSpec, verify: bool = False) -> Dataset:
    """Open a complete dataset, checking its schema name and version against ``spec``."""
    path = Path(path)
    manifest = read_manifest(path)
    found = manifest.get("schema", {})
    if found.get("name") != spec.name or found.get("version") != spec.version:
        fields = ", ".join(f"{f['name']}: {f['type']}" for f in found.get("fields", []))
        raise SchemaError(
            f"dataset {str(path)!r}: expected schema {spec.describe()}, found "
            f"{found.get('name')} v{found.get('version')} ({fields})"
        )
    dataset = Dataset(path, manifest, spec)
    if verify:
        dataset.verify()
    return dataset


def shard_schema_name(file: str | Path) -> str | None:
    """The schema name a shard records in its Parquet metadata (None for foreign files)."""
    meta = pq.read_schema(file).metadata or {}
    value = meta.get(META_SCHEMA)
    return value.decode() if value else None
