"""Training rows: a pairs dataset streamed shard by shard through a seeded shuffle buffer, and the
collator that turns rows into the ``batch`` the objectives read.

Streaming (:class:`RowStream`): each epoch visits the shards in a seeded order; a shard is read
one Parquet row group at a time, in chunks of ``read_rows`` rows, into a buffer of
``buffer_size`` rows from which rows are drawn at random. Memory stays at one row group plus the
buffer whatever the dataset size. The stream's whole position (epoch, shard, row, the buffer
and its generator) is a small state dict, so a resumed run draws exactly the rows an
uninterrupted one would.

Rows an objective cannot use (a null or empty text, a list with no non-empty item) are skipped
and counted by reason (``empty:<column>``), never silently lost.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from pairforge.pipeline.plumbing.errors import PairforgeError
from pairforge.pipeline.plumbing.files import DECODE_THREADS, open_parquet
from pairforge.pipeline.plumbing.integrity import verified_shard_path
from pairforge.pipeline.plumbing.shards import read_manifest
from pairforge.pipeline.plumbing.storage import dataset_path

TEXT_KIND = "text"
LIST_KIND = "list"


@dataclass(frozen=True)
class ShardFile:
    path: Path
    rows: int


def column_kind(arrow_type: pa.DataType) -> str | None:
    """``text`` for a string column, ``list`` for a list of strings, None otherwise."""
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return TEXT_KIND
    if (pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)) and (
        pa.types.is_string(arrow_type.value_type) or pa.types.is_large_string(arrow_type.value_type)
    ):
        return LIST_KIND
    return None


class PairsSource:
    """A complete pairforge dataset (folder of shards + manifest) opened for training.

    Only the shards' Parquet footers are read here. ``available`` lists the text and
    list-of-text columns; :meth:`select` fixes the columns the stream will read.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = dataset_path(path)  # a local folder or a store's URL (read from its cache)
        self.manifest = read_manifest(self.path)
        self.files = [
            ShardFile(self.path / shard["file"], int(shard["rows"]))
            for shard in self.manifest["shards"]
        ]
        self.rows = sum(f.rows for f in self.files)
        if not self.files or self.rows == 0:
            raise PairforgeError(f"training data {str(self.path)!r} has no rows")
        for f in self.files:
            if not f.path.exists():
                raise PairforgeError(
                    f"training data {str(self.path)!r}: shard {f.path.name} is missing"
                )
        schema = pq.read_schema(self.verified(0))
        self.kinds = {
            field.name: kind for field in schema if (kind := column_kind(field.type)) is not None
        }
        self.columns: list[str] = []

    def verified(self, index: int) -> Path:
        """Shard ``index``'s file, its size and checksum checked against the manifest (once per
        process): a corrupt shard stops training with one line instead of altered rows."""
        return verified_shard_path(
            self.path,
            self.manifest["shards"][index],
            f"training data {str(self.path)!r}",
            self.manifest.get("stage"),
        )

    @property
    def available(self) -> list[str]:
        return list(self.kinds)

    @property
    def fingerprint(self) -> str:
        return str(
            self.manifest.get("fingerprint") or [s["sha256"] for s in self.manifest["shards"]]
        )

    def select(self, columns: Sequence[str]) -> PairsSource:
        """Read ``columns`` (each must be in :attr:`available`); returns self."""
        missing = [c for c in columns if c not in self.kinds]
        if missing:
            raise PairforgeError(
                f"training data {str(self.path)!r} has no text column(s) {missing}; "
                f"text columns: {self.available}"
            )
        self.columns = list(columns)
        return self


def clean_value(value: Any, kind: str) -> Any:
    """The value as training reads it, or None when it is unusable (null, empty, no items)."""
    if kind == TEXT_KIND:
        return value if isinstance(value, str) and value.strip() else None
    if value is None:
        return None
    items = [item for item in value if isinstance(item, str) and item.strip()]
    return items or None


class RowStream:
    """Endless, seeded, resumable stream of training rows (tuples in ``source.columns`` order).

    ``buffer_size`` 1 reads in order (shards still shuffled per epoch); a buffer at least as large
    as the dataset shuffles it completely.
    """

    def __init__(
        self,
        source: PairsSource,
        buffer_size: int = 10_000,
        seed: int = 0,
        read_rows: int = 1024,
    ) -> None:
        if not source.columns:
            raise ValueError("RowStream: select the source's columns first")
        self.source = source
        self.buffer_size = max(1, int(buffer_size))
        self.seed = int(seed)
        self.read_rows = max(1, int(read_rows))
        self.epoch = 0
        self.file_pos = 0  # index into this epoch's shard order
        self.row_pos = 0  # rows of the current shard already moved into the buffer
        self.buffer: list[tuple] = []
        self.rng = np.random.default_rng([self.seed, 1 << 20])
        self.skipped: Counter[str] = Counter()
        self.rows_read = 0
        self.rows_used = 0
        self._epoch_used = 0
        self._group: tuple[int, int, pa.Table] | None = None  # (file index, row group, table)
        self._sizes: dict[int, list[int]] = {}  # file index -> row group sizes

    # --- position -------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "file_pos": self.file_pos,
            "row_pos": self.row_pos,
            "buffer": list(self.buffer),
            "rng": self.rng.bit_generator.state,
            "skipped": dict(self.skipped),
            "rows_read": self.rows_read,
            "rows_used": self.rows_used,
            "epoch_used": self._epoch_used,
            "config": [self.seed, self.buffer_size, self.read_rows, self.source.columns],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        expected = [self.seed, self.buffer_size, self.read_rows, self.source.columns]
        if list(state["config"]) != expected:
            raise ValueError(f"stream state is for {state['config']}, this stream is {expected}")
        self.epoch = int(state["epoch"])
        self.file_pos = int(state["file_pos"])
        self.row_pos = int(state["row_pos"])
        self.buffer = [tuple(row) for row in state["buffer"]]
        self.rng.bit_generator.state = state["rng"]
        self.skipped = Counter(state["skipped"])
        self.rows_read = int(state["rows_read"])
        self.rows_used = int(state["rows_used"])
        self._epoch_used = int(state["epoch_used"])
        self._group = None

    # --- reading --------------------------------------------------------------------------

    def _order(self) -> np.ndarray:
        return np.random.default_rng([self.seed, self.epoch]).permutation(len(self.source.files))

    def _group_sizes(self, index: int) -> list[int]:
        if index not in self._sizes:
            metadata = open_parquet(self.source.verified(index)).metadata
            self._sizes[index] = [
                metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)
            ]
        return self._sizes[index]

    def _row_group(self, index: int, row: int) -> tuple[pa.Table, int]:
        """The row group of shard ``index`` that holds ``row``, and that group's first row."""
        file = self.source.files[index]
        start = 0
        for group, size in enumerate(self._group_sizes(index)):
            if row < start + size:
                if self._group is None or self._group[:2] != (index, group):
                    table = open_parquet(self.source.verified(index)).read_row_group(
                        group, columns=self.source.columns, use_threads=DECODE_THREADS
                    )
                    self._group = (index, group, table)
                return self._group[2], start
            start += size
        raise PairforgeError(
            f"training data: shard {file.path.name} has fewer rows than its manifest"
        )

    def _read_chunk(self) -> list[tuple] | None:
        """The next chunk of the current epoch: rows ``[row_pos, next grid point)`` of the current
        shard, the grid being every ``read_rows`` rows from each row group's start (so a resumed
        stream cuts the same chunks). None when the epoch's shards are used up."""
        order = self._order()
        while self.file_pos < len(order):
            index = int(order[self.file_pos])
            if self.row_pos >= self.source.files[index].rows:
                self.file_pos += 1
                self.row_pos = 0
                continue
            table, start = self._row_group(index, self.row_pos)
            offset = self.row_pos - start
            length = min(self.read_rows - offset % self.read_rows, table.num_rows - offset)
            chunk = table.slice(offset, length)
            self.row_pos += length
            self.rows_read += length
            values = [chunk.column(c).to_pylist() for c in self.source.columns]
            return list(zip(*values, strict=True))
        return None

    def _accept(self, rows: list[tuple]) -> list[tuple]:
        kinds = [self.source.kinds[c] for c in self.source.columns]
        kept = []
        for row in rows:
            cleaned = tuple(clean_value(v, k) for v, k in zip(row, kinds, strict=True))
            bad = next((i for i, v in enumerate(cleaned) if v is None), None)
            if bad is None:
                kept.append(cleaned)
            else:
                self.skipped[f"empty:{self.source.columns[bad]}"] += 1
        return kept

    def take(self, n: int) -> list[tuple]:
        """The next ``n`` rows; the stream starts a new epoch whenever one is used up."""
        out: list[tuple] = []
        while len(out) < n:
            while len(self.buffer) < self.buffer_size:
                chunk = self._read_chunk()
                if chunk is None:
                    break
                self.buffer.extend(self._accept(chunk))
            if not self.buffer:
                if self._epoch_used == 0:
                    reasons = ", ".join(f"{k} {v}" for k, v in sorted(self.skipped.items()))
                    raise PairforgeError(
                        f"training data {str(self.source.path)!r}: no usable row for columns "
                        f"{self.source.columns} ({reasons})"
                    )
                self.epoch += 1
                self.file_pos = 0
                self.row_pos = 0
                self._epoch_used = 0
                continue
            i = int(self.rng.integers(len(self.buffer)))
            self.buffer[i], self.buffer[-1] = self.buffer[-1], self.buffer[i]
            out.append(self.buffer.pop())
            self.rows_used += 1
            self._epoch_used += 1
        return out


class Collator:
    """Rows -> ``batch``: for each column the objective's tokenisation of its texts.

    Text columns give ``(batch_size, seq_len)`` tensors. List columns named in the objective's
    ``sample_one`` give one item per row, drawn by a generator seeded with (seed, step, column),
    ``(batch_size, seq_len)``; other list columns give ``(batch_size, n, seq_len)`` with ``n`` the
    longest list of the global batch, shorter rows cycling their own items. Under data
    parallelism ``rows`` is the global batch and ``part`` the slice this rank encodes, so draws
    and shapes do not depend on the number of ranks.
    """

    def __init__(
        self,
        objective: Any,
        tokenizer: Any,
        columns: Sequence[str],
        kinds: dict[str, str],
        max_length: int,
        seed: int = 0,
    ) -> None:
        self.objective = objective
        self.tokenizer = tokenizer
        self.columns = list(columns)
        self.kinds = kinds
        self.max_length = max_length
        self.seed = seed
        self.sample_one = set(getattr(objective, "sample_one", ()))

    def _tokenize(self, column: str, texts: list[str]) -> dict[str, torch.Tensor]:
        return dict(self.objective.tokenize(self.tokenizer, column, texts, self.max_length))

    def __call__(
        self, rows: Sequence[tuple], step: int, part: slice | None = None
    ) -> dict[str, dict[str, torch.Tensor]]:
        part = part or slice(0, len(rows))
        batch: dict[str, dict[str, torch.Tensor]] = {}
        for j, column in enumerate(self.columns):
            values = [row[j] for row in rows]
            if self.kinds[column] == TEXT_KIND:
                batch[column] = self._tokenize(column, values[part])
            elif column in self.sample_one:
                rng = np.random.default_rng([self.seed, step, j])
                picks = rng.integers(0, [len(v) for v in values])
                texts = [v[int(k)] for v, k in zip(values, picks, strict=True)]
                batch[column] = self._tokenize(column, texts[part])
            else:
                n = max(len(v) for v in values)
                local = values[part]
                flat = [v[k % len(v)] for v in local for k in range(n)]
                features = self._tokenize(column, flat)
                batch[column] = {
                    key: value.reshape(len(local), n, *value.shape[1:])
                    for key, value in features.items()
                }
        return batch
