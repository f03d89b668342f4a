"""Arrow schemas of every dataset pairforge writes, and the checks run at each stage boundary.

A dataset's schema has a name and an integer version. Readers ask for the schema they expect;
a dataset written under another name or version, or whose Parquet columns do not match, fails
with one error that names the dataset, the expected and the found schema. Column names are
constants here so that no stage spells them twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from pairforge.pipeline.plumbing.errors import PairforgeError

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

# candidates (augment stages: backtranslate, rewrite)
CANDIDATE_ID = "candidate_id"
ROUTE = "route"
ENGINE = "engine"
MODEL = "model"
DECODING = "decoding"
NOISE = "noise"
NOISED_TEXT = "noised_text"
PIVOT = "pivot"
IDENTICAL = "identical"
LENGTH_RATIO = "length_ratio"
EDIT_RATIO = "edit_ratio"

# embeddings
VECTOR = "vector"

# pairs (the training dataset written by `sample`; the trainer's objectives read these names)
POSITIVE_TEXT = "positive_text"  # DenoSent: one back-translation of `text`
VIEW1_TEXT = "view1_text"  # BSL: first view (en-de-en)
VIEW2_TEXT = "view2_text"  # BSL: second view (en-fr-en)
POSITIVE_TEXTS = "positive_texts"  # DebCSE: sampled positives (eqs. 5-6)
NEGATIVE_TEXTS = "negative_texts"  # DebCSE: sampled hard negatives (eqs. 3-4)

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
    """Compare column names and types (order-insensitive); nullability and metadata are ignored.

    Types compare with Arrow's type equality, which ignores the name of a list's item field:
    Parquet stores list items as ``element`` and reads them back under that name.
    """
    want = {f.name: f.type for f in spec.schema}
    got = {f.name: f.type for f in found}
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

CANDIDATES = SchemaSpec(
    name="candidates",
    version=1,
    schema=pa.schema(
        [
            pa.field(ID, pa.string(), nullable=False),
            pa.field(CANDIDATE_ID, pa.string(), nullable=False),
            pa.field(TEXT, pa.string(), nullable=False),
            pa.field(ROUTE, pa.string(), nullable=False),
            pa.field(ENGINE, pa.string(), nullable=False),
            pa.field(MODEL, pa.string(), nullable=False),
            pa.field(DECODING, pa.string(), nullable=False),
            pa.field(NOISE, pa.string(), nullable=False),
            pa.field(NOISED_TEXT, pa.string(), nullable=False),
            pa.field(PIVOT, pa.string(), nullable=True),
            pa.field(IDENTICAL, pa.bool_(), nullable=False),
            pa.field(LENGTH_RATIO, pa.float32(), nullable=False),
            pa.field(EDIT_RATIO, pa.float32(), nullable=False),
        ]
    ),
    doc=(
        "Positive candidates of a sentence (augmentations). `id` is the source sentence's id; "
        "`candidate_id` is BLAKE2b-64 hex over (id, route, model, decoding, noise, index) and "
        "unique in the dataset. `route` is e.g. `en-zh-en` or `llm`; `engine` `transformers`, "
        "`ctranslate2`, `apertium` or `openai`; `model` the model ids joined by `+`; `decoding` a canonical "
        "string such as `greedy` or `sample(top_k=50,top_p=0.95,temperature=1.0)#2`. `noise` is "
        "`none`, `insert:<word>@<pos>[,...]` or `mask@<pos>[,...]`, and `noised_text` the text "
        "that was translated. `pivot` is the intermediate translation (null for one-step routes). "
        "`identical` flags a candidate equal to its source after whitespace normalisation; "
        "`length_ratio` is candidate chars / source chars and `edit_ratio` the normalised "
        "character Indel distance to the source, in [0, 1]."
    ),
)


def embeddings_spec(dim: int, dtype: str = "float32") -> SchemaSpec:
    """The ``embeddings`` schema for vectors of ``dim`` components of ``dtype`` (float32/float16).

    Rows are aligned with the dataset they embed (same order as its shards); `id` is the
    sentence id, or the candidate id for candidate embeddings. Vectors are L2-normalised.
    """
    if dtype not in ("float32", "float16"):
        raise SchemaError(f"embedding dtype must be float32 or float16, not {dtype!r}")
    value = pa.float32() if dtype == "float32" else pa.float16()
    return SchemaSpec(
        name="embeddings",
        version=1,
        schema=pa.schema(
            [
                pa.field(ID, pa.string(), nullable=False),
                pa.field(VECTOR, pa.list_(value, dim), nullable=False),
            ]
        ),
        doc=f"L2-normalised {dim}-d {dtype} sentence embeddings, keyed by `id`.",
    )


# pools (written by `mine`): each anchor's negative candidate pool, ragged
ROW = "row"  # the anchor's row number in the sentences dataset (0-based, over all shards)
POOL_ROWS = "pool_rows"
POOL_IDS = "pool_ids"
POOL_COS = "pool_cos"
POOL_RANDOM = "pool_random"
BAND_LOW = "band_low"
BAND_HIGH = "band_high"
WAS_SHORT = "was_short"
SHORT = "short"
FALLBACK = "fallback"

POOLS = SchemaSpec(
    name="pools",
    version=1,
    schema=pa.schema(
        [
            pa.field(ID, pa.string(), nullable=False),
            pa.field(ROW, pa.int64(), nullable=False),
            pa.field(POOL_ROWS, pa.list_(pa.int64()), nullable=False),
            pa.field(POOL_IDS, pa.list_(pa.string()), nullable=False),
            pa.field(POOL_COS, pa.list_(pa.float32()), nullable=False),
            pa.field(POOL_RANDOM, pa.list_(pa.bool_()), nullable=False),
            pa.field(BAND_LOW, pa.float32(), nullable=False),
            pa.field(BAND_HIGH, pa.float32(), nullable=False),
            pa.field(WAS_SHORT, pa.bool_(), nullable=False),
            pa.field(SHORT, pa.bool_(), nullable=False),
            pa.field(FALLBACK, pa.string(), nullable=False),
        ]
    ),
    doc=(
        "DebCSE negative candidate pools, one row per anchor sentence, rows aligned with the "
        "sentences dataset. `pool_rows`/`pool_ids` are the candidates' rows and ids in the "
        "sentences dataset, best-ranked first, random fills last (`pool_random`); `pool_cos` their "
        "cosine to the anchor. `band_low`/`band_high` is the cosine band finally used (widened "
        "when `fallback` is `widen`); `was_short` says the band held fewer than the minimum pool "
        "size before the fallback, `short` after it; `fallback` is `none`, `widen` or `random`."
    ),
)

# pairs: every score used and where each item came from, beside the training columns
POSITIVE_IDS = "positive_ids"  # candidate ids of the sampled positives
POSITIVE_ROUTES = "positive_routes"
POSITIVE_NOISES = "positive_noises"
NEGATIVE_IDS = "negative_ids"  # sentence ids of the sampled negatives
NEGATIVE_RANDOM = "negative_random"
POSITIVE_TEXT_ID = "positive_text_id"
VIEW1_ID = "view1_id"
VIEW2_ID = "view2_id"
IDENTICAL_SKIPPED = "identical_skipped"
SCORES = ("cos", "edit", "s_sur", "s_sem", "prob")  # per sampled item: `<side>_<score>`
POOL_SIZE = "pool_size"  # `<side>_pool_size`
ENTROPY = "entropy"  # `<side>_entropy`: H(P) / log(pool size)


def _pairs_schema() -> pa.Schema:
    fields = [
        pa.field(ID, pa.string(), nullable=False),
        pa.field(TEXT, pa.string(), nullable=False),
        pa.field(POSITIVE_TEXTS, pa.list_(pa.string()), nullable=False),
        pa.field(POSITIVE_IDS, pa.list_(pa.string()), nullable=False),
        pa.field(POSITIVE_ROUTES, pa.list_(pa.string()), nullable=False),
        pa.field(POSITIVE_NOISES, pa.list_(pa.string()), nullable=False),
        pa.field(NEGATIVE_TEXTS, pa.list_(pa.string()), nullable=False),
        pa.field(NEGATIVE_IDS, pa.list_(pa.string()), nullable=False),
        pa.field(NEGATIVE_RANDOM, pa.list_(pa.bool_()), nullable=False),
    ]
    for side in ("positive", "negative"):
        fields += [pa.field(f"{side}_{s}", pa.list_(pa.float32()), nullable=False) for s in SCORES]
        fields += [
            pa.field(f"{side}_{POOL_SIZE}", pa.int32(), nullable=False),
            pa.field(f"{side}_{ENTROPY}", pa.float32(), nullable=True),
        ]
    fields += [
        pa.field(BAND_LOW, pa.float32(), nullable=False),
        pa.field(BAND_HIGH, pa.float32(), nullable=False),
        pa.field(FALLBACK, pa.string(), nullable=False),
        pa.field(IDENTICAL_SKIPPED, pa.int32(), nullable=False),
        pa.field(POSITIVE_TEXT, pa.string(), nullable=True),
        pa.field(POSITIVE_TEXT_ID, pa.string(), nullable=True),
        pa.field(VIEW1_TEXT, pa.string(), nullable=True),
        pa.field(VIEW1_ID, pa.string(), nullable=True),
        pa.field(VIEW2_TEXT, pa.string(), nullable=True),
        pa.field(VIEW2_ID, pa.string(), nullable=True),
    ]
    return pa.schema(fields)


PAIRS = SchemaSpec(
    name="pairs",
    version=1,
    schema=_pairs_schema(),
    doc=(
        "The training dataset, one row per anchor sentence (`id`, `text`). DebCSE: "
        "`positive_texts` (augmentations sampled by P_pos, eqs. 5-6) and `negative_texts` "
        "(corpus sentences sampled by P_neg, eqs. 3-4), in draw order, with their ids, each "
        "positive's `route` and `noise`, whether a negative was a random fill, and per item "
        "`<side>_cos`, `<side>_edit` (edit distance to the anchor), `<side>_s_sur`, "
        "`<side>_s_sem` (eqs. 1-2) and `<side>_prob` (P); per pool `<side>_pool_size` and "
        "`<side>_entropy` (H(P) / log n, null for an empty pool). `band_low`/`band_high`/"
        "`fallback` as in `pools`; `identical_skipped` counts candidates equal to the anchor. "
        "DenoSent: `positive_text` (an en-zh-en back-translation); BSL: `view1_text` (en-de-en) "
        "and `view2_text` (en-fr-en); null when the route is absent, ids beside them."
    ),
)

REGISTRY: dict[str, SchemaSpec] = {
    spec.name: spec
    for spec in (SENTENCES, QUARANTINE, RAW_RECORDS, CLEAN_RECORDS, CANDIDATES, POOLS, PAIRS)
}


def get(name: str) -> SchemaSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise SchemaError(f"unknown schema {name!r}; known: {sorted(REGISTRY)}") from None
