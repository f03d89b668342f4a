"""Datasets on disk: a folder of Parquet shards plus a JSON manifest.

Layout of a dataset folder::

    _manifest.json              written last; its presence means the dataset is complete
    data/part-00000.parquet     shards, numbered from 0, each a self-describing Parquet file
    README.md                   the card, for datasets that carry one (``pairs``)
    _progress/                  while a stage runs: one JSON marker per finished shard, run.json

``data/`` holds nothing but Parquet, so every folder reader reads it as a table (polars refuses
a folder holding any other file); ``datasets.load_dataset(folder)`` finds ``data/*.parquet`` as
a Hub dataset's train split. Beside the folder, never inside it (DVC hashes the whole folder):
``.<name>.lock`` while a writer runs (``pipeline/plumbing/locks.py``) and ``.<name>.run.json`` with the
facts of the run that wrote it (start and end time, host, git commit), so that two runs on the
same input give byte-identical folders.

Every shard is read through :meth:`Dataset.read_shard` (or :meth:`Dataset.shard_path` for
streaming readers), which checks its size and checksum against the manifest the first time this
process opens it: a changed, truncated or bit-flipped shard fails with one line naming the
dataset, the shard and the stage to rerun, never decodes into altered rows.

Every file is written under a temporary name in the same folder and renamed into place, so a
reader never sees half a file. A shard counts as finished only when its marker exists; a run
killed at any moment and started again keeps the finished shards and rewrites the rest. A run
whose fingerprint (stage, params, inputs, code) differs from the folder's starts from scratch.

A dataset may also live at an fsspec URL (``s3://bucket/pairs``): the same layout and bytes,
each object written with one PUT instead of a rename (``pipeline/plumbing/storage.py``).

Here: the layout, the writer and the reader. Beside it: ``files.py`` (atomic writes, modes,
checksums, Parquet opened on the calling thread) and ``integrity.py`` (shards verified against
the manifest on read, and the cache of shards fetched from a store).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import xxhash
from pairforge.pipeline.plumbing import locks
from pairforge.pipeline.plumbing.errors import (
    DataIntegrityError,
    IncompleteDatasetError,
)
from pairforge.pipeline.plumbing.files import (
    atomic_write_bytes,
    atomic_write_json,
    file_checksums,
    named_on_failure,
)
from pairforge.pipeline.plumbing.integrity import (
    read_verified_shard,
    shard_cache,
    shard_path_problem,
    verification_stats,
    verified_shard_path,
)
from pairforge.pipeline.plumbing.schemas import SchemaError, SchemaSpec
from pairforge.pipeline.plumbing.storage import RemotePath, dataset_path, remove_tree
from pairforge.pipeline.plumbing.version import code_version

if TYPE_CHECKING:
    from pairforge.pipeline.plumbing.stagedefs import StageDef

FORMAT = "pairforge-dataset"
# 2: shards under data/, an xxh3_128 checksum beside the sha256, no run-specific facts.
FORMAT_VERSION = 2
MANIFEST = "_manifest.json"
PROGRESS = "_progress"
RUN_FILE = "run.json"
DATA_DIR = "data"


_PROCESS_START = time.monotonic()

# Shards whose Arrow data is at most this size are encoded in memory before they are written.
IN_MEMORY_SHARD_BYTES = 256 << 20


def shard_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


def shard_file(index: int) -> str:
    """Where shard ``index`` lives, relative to the dataset folder (as the manifest records)."""
    return f"{DATA_DIR}/{shard_name(index)}"


def run_info_path(folder: str | Path | RemotePath) -> Path | RemotePath:
    """The sidecar with the run-specific facts of a dataset: ``<parent>/.<name>.run.json``."""
    folder = dataset_path(folder)
    return folder.parent / f".{folder.name}.run.json"


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
    xxh3_128: str = ""


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
    (folder / DATA_DIR).mkdir(parents=True, exist_ok=True)
    (folder / PROGRESS).mkdir(exist_ok=True)
    final = folder / shard_file(index)
    if table.nbytes <= IN_MEMORY_SHARD_BYTES or isinstance(folder, RemotePath):
        # Encode in memory: the checksums are taken from the bytes, not from a re-read.
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression=compression, row_group_size=row_group_size)
        data = sink.getvalue()
        atomic_write_bytes(final, data, durable=durable)
        sha256, size = hashlib.sha256(data).hexdigest(), data.size
        fast = xxhash.xxh3_128(memoryview(data)).hexdigest()
    else:
        tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}-{threading.get_ident()}")
        with named_on_failure(final, tmp):
            pq.write_table(table, tmp, compression=compression, row_group_size=row_group_size)
            if durable:
                with open(tmp, "rb+") as fh:
                    os.fsync(fh.fileno())
        os.replace(tmp, final)
        sha256, fast, size = file_checksums(final)
    info = ShardInfo(
        file=shard_file(index),
        rows=table.num_rows,
        sha256=sha256,
        bytes=size,
        counts=dict(counts or {}),
        xxh3_128=fast,
    )
    atomic_write_json(folder / PROGRESS / f"{final.stem}.json", asdict(info), durable=durable)
    return info


class DatasetWriter:
    """Coordinates the shards of one output dataset across a (possibly resumed) run.

    ``fingerprint`` identifies what the dataset is computed from; finished shards are kept only
    when it matches the one recorded by the interrupted run. The writer holds the dataset's lock
    (``pipeline/plumbing/locks.py``) from construction to :meth:`finalize` (or :meth:`close`, or the end
    of the process): a second writer of the same folder is refused with one line naming it.
    """

    def __init__(
        self,
        path: str | Path,
        spec: SchemaSpec,
        *,
        stage: StageDef | str,
        params: dict[str, Any],
        fingerprint: str,
        rows_per_shard: int | None = None,
        name: str | None = None,
        scratch: bool = False,
    ) -> None:
        self.path = dataset_path(path)
        self.spec = spec
        # A declared stage's datasets name its code; a bare name (a test's) hashes pipeline/.
        self.declaration = stage
        self.stage = stage if isinstance(stage, str) else stage.name
        self.params = params
        self.fingerprint = fingerprint
        self.rows_per_shard = rows_per_shard
        self.name = name or str(path)
        # Scratch datasets (a stage's intermediate work) are written fast: no compression, no fsync.
        self.write_options = {"compression": "none", "durable": False} if scratch else {}
        self.scratch = scratch
        self.progress_dir = self.path / PROGRESS
        self._locked = False
        locks.acquire(self.path, f"dataset {self.name!r}")
        self._locked = True
        try:
            self.complete = self._prepare()
        except BaseException:
            self.close()
            raise
        if self.complete:
            self.close()

    def close(self) -> None:
        """Release the writer lock (idempotent); :meth:`finalize` calls it."""
        if self._locked:
            self._locked = False
            locks.release(self.path)

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _prepare(self) -> bool:
        self._remove_temporaries()
        manifest = self.path / MANIFEST
        if manifest.exists():
            found = json.loads(manifest.read_text())
            if found.get("fingerprint") == self.fingerprint:
                remove_tree(self.progress_dir)
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
        """Half-written files of a killed run (their final names were never taken; a store has
        none: its writes are single PUTs)."""
        if isinstance(self.path, RemotePath):
            return
        for folder in (self.path, self.path / DATA_DIR, self.progress_dir):
            if folder.is_dir():
                for tmp in folder.glob(".*.tmp-*"):
                    tmp.unlink(missing_ok=True)

    def _clear(self) -> None:
        """Remove what an earlier, different run left (only files this format owns)."""
        if not self.path.exists():
            return
        for child in self.path.iterdir():
            # part-* at the top level: the shards of a format-1 dataset.
            owned = child.name in {MANIFEST, PROGRESS, DATA_DIR, "README.md", "_work"} or (
                child.name.startswith(("part-", ".part-", f".{MANIFEST}"))
            )
            if not owned:
                continue
            if child.is_dir():
                remove_tree(child)
            else:
                child.unlink()

    def is_done(self, index: int) -> bool:
        if self.complete:
            return True
        marker = self.progress_dir / f"part-{index:05d}.json"
        return marker.exists() and (self.path / shard_file(index)).exists()

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

    def _run_facts(self) -> dict[str, Any]:
        """What the sidecar records of the run: run-specific, so never in the manifest."""
        return {
            "dataset": self.name,
            "stage": self.stage,
            "fingerprint": self.fingerprint,
            "code_version": code_version(self.declaration),
            "created_at": self.created_at,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            # The cost of verifying this process's reads so far, against its run time.
            "process_seconds": round(time.monotonic() - _PROCESS_START, 3),
            "verified_reads": {
                k: round(v, 4) if isinstance(v, float) else v
                for k, v in verification_stats().items()
            },
        }

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
        stray = sorted((self.path / DATA_DIR).glob("part-*.parquet"))[num_shards:]
        for file in stray:
            file.unlink()
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
            "params": portable(self.params, self.path),
            "fingerprint": self.fingerprint,
            # Without the git commit: a commit that leaves this stage's code alone must not
            # change the dataset's bytes (the commit is in the run sidecar).
            "code_version": code_version(self.declaration, git=False),
            "rows": sum(s["rows"] for s in shards),
            "rows_per_shard": self.rows_per_shard,
            "num_shards": len(shards),
            "shards": shards,
            # An encoder's model spec is loaded again from the manifest (train, the encoder
            # check): it stays as the stage resolved it.
            **{
                k: v if k == "encoder" else portable(v, self.path) for k, v in (extra or {}).items()
            },
        }
        # The sidecar first: a run killed between the two leaves an unfinished dataset, never
        # a finished one without its run facts. Scratch datasets are removed by their stage.
        if not self.scratch:
            atomic_write_json(run_info_path(self.path), self._run_facts())
        atomic_write_json(self.path / MANIFEST, manifest)
        remove_tree(self.progress_dir)
        self.complete = True
        self.close()
        return manifest


def portable(value: Any, dataset: Path) -> Any:
    """``value`` (a manifest's params or facts) with every absolute path made relative to the
    ``dataset`` folder, in mappings and lists alike: where the writer's machine keeps its files
    is not a fact of the dataset, so the same inputs give the same manifest wherever they are
    written. Relative paths (the project's), hub ids, ``package:`` and ``$VAR`` specs stay."""
    if isinstance(value, dict):
        return {k: portable(v, dataset) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable(v, dataset) for v in value]
    if isinstance(value, str) and os.path.isabs(value):
        # A dataset on a store: relative to the project (the folder the stage runs in).
        base = os.getcwd() if isinstance(dataset, RemotePath) else os.path.abspath(dataset)
        return os.path.relpath(value, base)
    return value


def work_folder(output: str | Path | RemotePath) -> Path:
    """A stage's local scratch folder for the dataset ``output``: ``<output>/_work`` (which a
    changed fingerprint clears with the rest), or for a dataset on a store a folder of the local
    cache named by its URL (spilled vectors, a built index: what only this process maps)."""
    path = dataset_path(output)
    if isinstance(path, RemotePath):
        name = hashlib.sha256(str(path).encode()).hexdigest()[:16]
        return shard_cache().parent / "work" / f"{path.name}-{name}"
    return path / "_work"


def read_manifest(path: str | Path | RemotePath) -> dict[str, Any]:
    path = dataset_path(path)
    manifest = path / MANIFEST
    if not manifest.exists():
        if (path / PROGRESS).exists():
            why = "its stage was interrupted; run the stage again to finish it"
        elif path.exists():
            why = "it has no _manifest.json"
        else:
            why = "the folder does not exist"
        error = IncompleteDatasetError(f"dataset {str(path)!r} is not complete: {why}")
        error.path = str(path)  # the CLI names the stage that writes it (stages/options.py)
        raise error
    try:
        data = json.loads(manifest.read_text())
    except json.JSONDecodeError as exc:
        raise DataIntegrityError(
            f"dataset {str(path)!r}: unreadable _manifest.json: {exc}"
        ) from None
    shards = data.get("shards", []) if isinstance(data, dict) else []
    beside = data.get("format_version") == 1  # format 1 kept its shards beside the manifest
    for shard in shards:
        problem = shard_path_problem(shard.get("file") if isinstance(shard, dict) else None, beside)
        if problem:
            raise DataIntegrityError(
                f"dataset {str(path)!r}: refused: its manifest names shard "
                f"{shard.get('file') if isinstance(shard, dict) else shard!r}, {problem} (a "
                "dataset's manifest may name only files in its own data/ folder)"
            )
    return data


@dataclass(frozen=True)
class ShardSource:
    """One shard of a complete dataset, picklable for Dask workers; :meth:`read` verifies it."""

    folder: str
    shard: dict[str, Any]
    label: str
    stage: str | None
    spec: SchemaSpec | None = None

    def read(self, columns: list[str] | None = None) -> pa.Table:
        return read_verified_shard(
            self.folder, self.shard, self.label, self.stage, self.spec, columns
        )


class Dataset:
    """A complete dataset opened for reading; every shard is checked against the manifest (size
    and checksum, once per process) and the schema when it is read."""

    def __init__(self, path: Path, manifest: dict[str, Any], spec: SchemaSpec) -> None:
        self.path = path
        self.manifest = manifest
        self.spec = spec

    @property
    def label(self) -> str:
        return str(self.path)

    @property
    def stage(self) -> str | None:
        return self.manifest.get("stage")

    @property
    def num_rows(self) -> int:
        return int(self.manifest["rows"])

    @property
    def files(self) -> list[Path]:
        """The shard files (unverified paths: read them through :meth:`read_shard`)."""
        return [self.path / s["file"] for s in self.manifest["shards"]]

    def sources(self) -> list[ShardSource]:
        """The shards as picklable sources for the runner (each verifies itself when read)."""
        return [
            ShardSource(str(self.path), shard, self.label, self.stage, self.spec)
            for shard in self.manifest["shards"]
        ]

    def __len__(self) -> int:
        return len(self.manifest["shards"])

    def shard_path(self, index: int) -> Path:
        """Shard ``index``'s file after a size and checksum check (for streaming readers)."""
        return verified_shard_path(
            self.path, self.manifest["shards"][index], self.label, self.stage
        )

    def read_shard(self, index: int, columns: list[str] | None = None) -> pa.Table:
        return read_verified_shard(
            self.path, self.manifest["shards"][index], self.label, self.stage, self.spec, columns
        )

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
        """Check every shard's size and checksum against the manifest (first problem raises)."""
        for index in range(len(self)):
            self.shard_path(index)


def open_dataset(path: str | Path | RemotePath, spec: SchemaSpec, verify: bool = False) -> Dataset:
    """Open a complete dataset, checking its schema name and version against ``spec``."""
    path = dataset_path(path)
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
