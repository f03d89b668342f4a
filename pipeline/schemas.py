"""Arrow schemas of every dataset pairforge writes, and the checks run at each stage boundary.

A dataset's schema has a name and an integer version. Readers ask for the schema they expect;
a dataset written under another name or version, or whose Parquet columns do not match, fails
with one error that names the dataset, the expected and the found schema. Column names are
constants here so that no stage spells them twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from pipeline.errors import PairforgeError

# Column names shared across datasets.
ID = "id"
TEXT = "text"
SOURCE = "source"
LINE = "line"
REASON = "reason"
DETAIL = "detail"
N_BYTES = "n_bytes"
KEY = "key"
RAW = "raw"

# Parquet key-value metadata keys that make a shard self-describing.
META_SCHEMA = b"pairforge.schema"
META_VERSION = b"pairforge.schema_version"


class SchemaError(PairforgeError):
    """A dataset does not have the schema its reader expects."""


@dataclass(frozen=True)
class SchemaSpec:
    """A named, versioned Arrow schema."""

    name: str
    version: int
    schema: pa.Schema
    doc: str

    def describe(self) -> str:
        cols = ", ".join(f"{f.name}: {f.type}" for f in self.schema)
        return f"{self.name} v{self.version} ({cols})"

    def with_metadata(self) -> pa.Schema:
        return self.schema.with_metadata(
            {META_SCHEMA: self.name.encode(), META_VERSION: str(self.version).encode()}
        )

    def check_table(self, table: pa.Table | pa.RecordBatch, dataset: str) -> None:
        """Raise SchemaError unless ``table`` has exactly this schema's columns and types."""
        check_arrow_schema(table.schema, self, dataset)

    def conform(self, table: pa.Table, dataset: str) -> pa.Table:
        """Check ``table`` and return it with this schema's field order and metadata."""
        self.check_table(table, dataset)
        schema = self.with_metadata()
        columns = [table.column(f.name) for f in schema]
        for f, col in zip(schema, columns, strict=False):
            if not f.nullable and col.null_count:
                raise SchemaError(
                    f"dataset {dataset!r}: column {f.name!r} has {col.null_count} nulls"
                )
        return pa.Table.from_arrays(columns, schema=schema)


def _fields(schema: pa.Schema) -> list[tuple[str, str]]:
    return [(f.name, str(f.type)) for f in schema]


def check_arrow_schema(found: pa.Schema, spec: SchemaSpec, dataset: str) -> None:
    """Compare column names and types (order-insensitive); nullability and metadata are ignored."""
    want = dict(_fields(spec.schema))
    got = dict(_fields(found))
    if want == got:
        return
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    retyped = sorted(k for k in set(want) & set(got) if want[k] != got[k])
    parts = []
    if missing:
        parts.append(f"missing {missing}")
    if extra:
        parts.append(f"unexpected {extra}")
    if retyped:
        parts.append("type of " + ", ".join(f"{k} is {got[k]} not {want[k]}" for k in retyped))
    found_desc = ", ".join(f"{k}: {v}" for k, v in _fields(found))
    raise SchemaError(
        f"dataset {dataset!r}: expected schema {spec.describe()}, found ({found_desc}): "
        + "; ".join(parts)
    )


SENTENCES = SchemaSpec(
    name="sentences",
    version=1,
    schema=pa.schema(
        [
            pa.field(ID, pa.string(), nullable=False),
            pa.field(TEXT, pa.string(), nullable=False),
            pa.field(SOURCE, pa.string(), nullable=False),
            pa.field(LINE, pa.int64(), nullable=False),
        ]
    ),
    doc=(
        "Clean, deduplicated sentences. `id` is the first 64 bits of BLAKE2b over the UTF-8 of "
        "the normalised text, as 16 hex digits; `source` and `line` (1-based record number) say "
        "where its first occurrence was read."
    ),
)

QUARANTINE = SchemaSpec(
    name="quarantine",
    version=1,
    schema=pa.schema(
        [
            pa.field(REASON, pa.string(), nullable=False),
            pa.field(SOURCE, pa.string(), nullable=False),
            pa.field(LINE, pa.int64(), nullable=False),
            pa.field(TEXT, pa.string(), nullable=False),
            pa.field(N_BYTES, pa.int64(), nullable=False),
            pa.field(DETAIL, pa.string(), nullable=True),
        ]
    ),
    doc=(
        "Rows a stage dropped, one per row, with the reason. `text` is a preview (invalid bytes "
        "replaced, cut to a bounded length); `n_bytes` is the size of the original record."
    ),
)

# Internal work formats (never read by other teams, still checked).
RAW_RECORDS = SchemaSpec(
    name="raw_records",
    version=1,
    schema=pa.schema(
        [
            pa.field(RAW, pa.binary(), nullable=False),
            pa.field(SOURCE, pa.string(), nullable=False),
            pa.field(LINE, pa.int64(), nullable=False),
            pa.field(N_BYTES, pa.int64(), nullable=False),
            pa.field(REASON, pa.string(), nullable=True),
            pa.field(DETAIL, pa.string(), nullable=True),
        ]
    ),
    doc="Records as read from raw files, before decoding; `reason` is set when the reader rejected it.",
)

CLEAN_RECORDS = SchemaSpec(
    name="clean_records",
    version=1,
    schema=pa.schema(
        [
            pa.field(ID, pa.string(), nullable=False),
            pa.field(KEY, pa.uint64(), nullable=False),
            pa.field(TEXT, pa.string(), nullable=False),
            pa.field(SOURCE, pa.string(), nullable=False),
            pa.field(LINE, pa.int64(), nullable=False),
        ]
    ),
    doc="`key` is `id` as an integer, for vectorised deduplication. Normalised rows that passed every per-row filter, before deduplication.",
)

REGISTRY: dict[str, SchemaSpec] = {
    spec.name: spec for spec in (SENTENCES, QUARANTINE, RAW_RECORDS, CLEAN_RECORDS)
}


def get(name: str) -> SchemaSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise SchemaError(f"unknown schema {name!r}; known: {sorted(REGISTRY)}") from None
