"""ingest: raw corpus files -> clean, deduplicated, id'd sentence shards (+ a quarantine).

Three steps, each resumable at shard granularity:

1. read   (sequential, streaming)  raw files -> ``raw_records`` chunks of ``chunk_rows``
2. clean  (``clean_shard``, mapped over chunks in-process or on Dask) -> ``clean_records`` and
          per-row rejects: decode, NFC, whitespace and control characters, length filters, ids
3. dedup  (sequential, vectorised) -> ``sentences`` shards of ``rows_per_shard`` rows, first
          occurrence kept; the quarantine gets the clean-step rejects and the duplicates

Every record read ends in exactly one of the two datasets: ``rows_read == kept + dropped`` is
checked before the metrics are written.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.config import StageConfig
from pairforge.pipeline.plumbing.errors import ConfigError, DataIntegrityError
from pairforge.pipeline.plumbing.progress import Progress
from pairforge.pipeline.plumbing.runner import Executor, ShardResult, finished
from pairforge.pipeline.plumbing.shards import (
    MANIFEST,
    DatasetWriter,
    open_dataset,
)
from pairforge.pipeline.plumbing.stagedefs import StageDef
from pairforge.pipeline.plumbing.stagerun import StageRun
from pairforge.pipeline.plumbing.storage import dataset_path, remove_tree
from pairforge.pipeline.science.readers import InputFile, RawBlock, read_chunks, resolve_inputs
from pairforge.pipeline.science.text import char_counts, normalize, sentence_ids, word_counts
from pairforge.stages.options import executor, stage_command
from pydantic import Field, model_validator

log = logging.getLogger("pairforge")

PREVIEW_CHARS = 500
# Drop reasons, in the order they are tested; a row gets the first that applies.
REASONS = (
    "invalid_utf8",
    "nul_byte",
    "malformed_record",
    "empty",
    "too_short",
    "too_long",
    "duplicate",
)


class IngestConfig(StageConfig):
    """The ``ingest`` section of params.yaml."""

    root: str = Field(
        ".",
        description="folder holding the raw corpus, which the inputs are relative to (the stage's DVC dependency)",
    )
    inputs: list[str] = Field(
        min_length=1,
        description="files or globs under root, read in order (on the command line: repeat -i)",
    )
    format: Literal["auto", "txt", "jsonl", "csv", "tsv", "parquet"] = Field(
        "auto", description="auto (from the file name), txt, jsonl, csv, tsv or parquet"
    )
    field: str = Field("text", description="JSON field / CSV column / Parquet column to read")
    min_words: int = Field(3, ge=0, description="drop rows with fewer words (reason too_short)")
    max_words: int = Field(128, ge=1, description="drop rows with more words (reason too_long)")
    max_chars: int = Field(
        2000, ge=1, description="drop rows with more characters (reason too_long)"
    )
    max_line_bytes: int = Field(
        1 << 20,
        ge=1024,
        description="records above this size are dropped without being held in memory",
    )
    invalid_utf8: Literal["quarantine", "replace"] = Field(
        "quarantine",
        description="quarantine: drop rows that are not UTF-8; replace: keep them with U+FFFD",
    )
    rows_per_shard: int = Field(100_000, ge=1, description="rows per output Parquet shard")
    chunk_rows: int = Field(50_000, ge=1, description="rows per parallel work unit")
    output: str = Field("data/sentences", description="output dataset folder")
    quarantine: str = Field("data/quarantine/ingest", description="quarantine dataset folder")
    metrics: str = Field("metrics/ingest.json", description="metrics JSON path")

    @model_validator(mode="after")
    def _words_order(self) -> IngestConfig:
        if self.min_words > self.max_words:
            raise ValueError(
                f"min_words ({self.min_words}) must not exceed max_words ({self.max_words})"
            )
        return self


STAGE = StageDef(
    name="ingest",
    module=__name__,
    config=IngestConfig,
    inputs=("${ingest.root}",),
    outputs=("output", "quarantine", "metrics"),
    datasets=("output", "quarantine"),
    headlines={"rows_out": "rows_kept", "dropped": "rows_dropped_total"},
)


# --- step 2: the pure per-shard function ------------------------------------------------------


def _decode(raw: pa.Array, replace: bool) -> tuple[pa.Array, np.ndarray]:
    """UTF-8 decode; returns the text (invalid bytes replaced) and a mask of invalid rows."""
    try:
        return pc.cast(raw, pa.string()), np.zeros(len(raw), dtype=bool)
    except pa.ArrowInvalid:
        pass
    texts, invalid = [], np.zeros(len(raw), dtype=bool)
    for i, value in enumerate(raw.to_pylist()):
        try:
            texts.append(value.decode("utf-8"))
        except UnicodeDecodeError:
            texts.append(value.decode("utf-8", "replace"))
            invalid[i] = not replace
    return pa.array(texts, pa.string()), invalid


def clean_shard(
    table: pa.Table, *, min_words: int, max_words: int, max_chars: int, invalid_utf8: str
) -> ShardResult:
    """``raw_records`` -> ``clean`` (``clean_records``) and ``rejected`` (``quarantine``) tables.

    Pure: no files, no globals. Counts: ``read``, ``kept`` and ``dropped.<reason>``.
    """
    S.RAW_RECORDS.check_table(table, "raw_records chunk")
    n = table.num_rows
    raw = table[S.RAW].combine_chunks()
    # Reasons as codes into REASONS (+1; 0 = kept): vectorised, and cheap for the kept majority.
    code = np.zeros(n, dtype=np.int8)
    detail: dict[int, str] = {}
    if table[S.REASON].null_count < n:  # the reader already rejected some records
        for i, (why, said) in enumerate(
            zip(table[S.REASON].to_pylist(), table[S.DETAIL].to_pylist(), strict=True)
        ):
            if why is not None:
                code[i] = _CODE[why]
                if said is not None:
                    detail[i] = said
    text, invalid = _decode(raw, replace=invalid_utf8 == "replace")
    norm = normalize(text)
    words = word_counts(norm)
    chars = char_counts(norm)

    def assign(mask: np.ndarray, why: str, why_detail=None) -> None:
        """Give ``why`` to rows in ``mask`` that have no reason yet; details only for those."""
        todo = np.flatnonzero(mask & (code == 0))
        code[todo] = _CODE[why]
        for i in todo:
            if why_detail is not None:
                detail[int(i)] = why_detail(i) if callable(why_detail) else why_detail

    assign(invalid, "invalid_utf8", "bytes that are not UTF-8")
    assign(_has_nul(raw, text), "nul_byte", "NUL byte in the record")
    assign(words == 0, "empty")
    assign(words < min_words, "too_short", lambda i: f"{words[i]} words < min_words={min_words}")
    too_long = (words > max_words) | (chars > max_chars)
    assign(
        too_long,
        "too_long",
        lambda i: f"{words[i]} words, {chars[i]} chars (max {max_words} words, {max_chars} chars)",
    )
    keep = code == 0
    kept_text = norm.filter(pa.array(keep))
    ids, keys = sentence_ids(kept_text)
    keep_idx = pa.array(np.flatnonzero(keep))
    clean = pa.table(
        {
            S.ID: ids,
            S.KEY: pa.array(keys, pa.uint64()),
            S.TEXT: kept_text,
            S.SOURCE: table[S.SOURCE].take(keep_idx),
            S.LINE: table[S.LINE].take(keep_idx),
        }
    )
    drop_idx = np.flatnonzero(~keep)
    reasons = np.array(REASONS, dtype=object)[code[drop_idx] - 1]
    rejected = _quarantine_rows(
        reasons,
        table[S.SOURCE].take(pa.array(drop_idx)),
        table[S.LINE].take(pa.array(drop_idx)),
        text.take(pa.array(drop_idx)),
        table[S.N_BYTES].take(pa.array(drop_idx)),
        [detail.get(int(i)) for i in drop_idx],
    )
    counts = {"read": n, "kept": int(keep.sum())}
    for why, count in zip(*np.unique(reasons.astype(str), return_counts=True), strict=False):
        counts[f"dropped.{why}"] = int(count)
    return ShardResult({"clean": clean, "rejected": rejected}, counts)


_CODE = {why: k + 1 for k, why in enumerate(REASONS)}


def _has_nul(raw: pa.Array, text: pa.Array) -> np.ndarray:
    """Row mask of records holding a NUL byte. A NUL is a control character, so only rows that
    are not printable ASCII are searched."""
    suspects = np.flatnonzero(~pc.ascii_is_printable(text).to_numpy(zero_copy_only=False))
    mask = np.zeros(len(raw), dtype=bool)
    if len(suspects):
        found = pc.match_substring(raw.take(pa.array(suspects)), "\x00")
        mask[suspects[found.to_numpy(zero_copy_only=False)]] = True
    return mask


def _strings(values: list) -> pa.Array:
    # pa.array(values, pa.string()) is far slower on lists of mostly None than this path.
    return pa.array(values, pa.large_string()).cast(pa.string())


def _quarantine_rows(reason, source, line, text, n_bytes, detail) -> pa.Table:
    preview = pc.utf8_slice_codeunits(text, 0, PREVIEW_CHARS) if len(text) else text
    return pa.table(
        {
            S.REASON: _strings(list(reason)),
            S.SOURCE: source,
            S.LINE: line,
            S.TEXT: preview,
            S.N_BYTES: n_bytes,
            S.DETAIL: _strings(list(detail)),
        }
    )


# --- step 3: deduplication --------------------------------------------------------------------


class Deduplicator:
    """First-occurrence deduplication over a stream of uint64 keys, in O(unique keys) memory."""

    def __init__(self) -> None:
        self.seen = np.empty(0, dtype=np.uint64)  # sorted

    def keep_mask(self, keys: np.ndarray) -> np.ndarray:
        keep = np.zeros(len(keys), dtype=bool)
        if not len(keys):
            return keep
        _, first = np.unique(keys, return_index=True)
        keep[first] = True
        if len(self.seen):
            pos = np.minimum(np.searchsorted(self.seen, keys), len(self.seen) - 1)
            keep &= self.seen[pos] != keys
        new = np.sort(keys[keep])
        # Two sorted runs: the stable sort (timsort) merges them in linear time.
        self.seen = np.sort(np.concatenate([self.seen, new]), kind="stable")
        return keep


# --- the stage --------------------------------------------------------------------------------


def _block_table(block: RawBlock) -> pa.Table:
    return pa.table(
        {
            S.RAW: pa.array(block.raw, pa.binary()),
            S.SOURCE: pa.array(block.source, pa.string()),
            S.LINE: pa.array(block.line, pa.int64()),
            S.N_BYTES: pa.array(block.n_bytes, pa.int64()),
            S.REASON: _strings(block.reason),
            S.DETAIL: _strings(block.detail),
        }
    )


def _raw_chunks(
    cfg: IngestConfig,
    files: list[InputFile],
    outputs: list[DatasetWriter],
    counter: list[int],
    rows_by_file: dict[str, int],
):
    """Yield ``(index, raw_records table)`` for every chunk some output has not finished.
    Finished chunks are still read (to advance the reader) but not built or cleaned again.
    ``counter`` ends as [chunks, chunks already finished]; ``rows_by_file`` as each file's rows."""
    for index, block in enumerate(
        read_chunks(files, cfg.field, cfg.max_line_bytes, cfg.chunk_rows, rows_by_file)
    ):
        counter[0] = index + 1
        if finished(outputs, index):
            counter[1] += 1
        else:
            yield index, _block_table(block)


def _dedup_step(
    cfg: IngestConfig,
    clean: DatasetWriter,
    rejected: DatasetWriter,
    sentences: DatasetWriter,
    quarantine: DatasetWriter,
    progress: bool,
) -> tuple[int, int, int]:
    """Write final shards; returns (sentence shards, quarantine shards, duplicates)."""
    clean_ds = open_dataset(clean.path, S.CLEAN_RECORDS)
    rejected_ds = open_dataset(rejected.path, S.QUARANTINE)
    dedup = Deduplicator()
    masks = [dedup.keep_mask(t[S.KEY].to_numpy()) for t in clean_ds.iter_shards([S.KEY])]
    del dedup
    duplicates = int(sum(len(m) - m.sum() for m in masks))
    kept_total = int(sum(m.sum() for m in masks))
    rps = cfg.rows_per_shard
    n_out = -(-kept_total // rps) if kept_total else 0
    bar = Progress("ingest/dedup", total=len(masks), unit="chunks", enabled=progress)
    buffer: list[tuple[pa.Table | None, int]] = []  # kept rows waiting for their shard
    buffered = 0
    emitted = 0  # kept rows already assigned to sentence shards
    shard = 0
    for i, mask in enumerate(masks):
        kept_i = int(mask.sum())
        lo, hi = emitted + buffered, emitted + buffered + kept_i  # global kept positions
        touches = range(lo // rps, -(-hi // rps)) if kept_i else range(0)
        need = not quarantine.is_done(i) or any(not sentences.is_done(j) for j in touches)
        table = clean_ds.read_shard(i) if need else None
        if not quarantine.is_done(i):
            parts = [rejected_ds.read_shard(i), _duplicates(table, mask)]
            quarantine.write(
                i, pa.concat_tables([S.QUARANTINE.conform(t, cfg.quarantine) for t in parts])
            )
        if kept_i:
            kept = table.filter(pa.array(mask)).drop_columns([S.KEY]) if table is not None else None
            buffer.append((kept, kept_i))
            buffered += kept_i
        while buffered >= rps or (i == len(masks) - 1 and buffered > 0):
            take = min(rps, buffered)
            head, buffer = _split_front(buffer, take)
            if not sentences.is_done(shard):
                if any(t is None for t, _ in head):
                    raise DataIntegrityError(
                        f"ingest: internal error, shard {shard} needs unread rows"
                    )
                sentences.write(shard, pa.concat_tables([t for t, _ in head]))
            buffered -= take
            emitted += take
            shard += 1
        bar.advance(done=1, rows=kept_i)
    bar.close()
    if shard != n_out:
        raise DataIntegrityError(f"ingest: wrote {shard} sentence shards, expected {n_out}")
    return n_out, len(masks), duplicates


def _duplicates(table: pa.Table, mask: np.ndarray) -> pa.Table:
    rows = table.filter(pa.array(~mask))
    return _quarantine_rows(
        np.full(rows.num_rows, "duplicate", dtype=object),
        rows[S.SOURCE],
        rows[S.LINE],
        rows[S.TEXT],
        pc.binary_length(rows[S.TEXT].cast(pa.binary())).cast(pa.int64()),
        np.array([f"same text as id {x}" for x in rows[S.ID].to_pylist()], dtype=object),
    )


def _split_front(
    buffer: list[tuple[pa.Table | None, int]], n: int
) -> tuple[list[tuple[pa.Table | None, int]], list[tuple[pa.Table | None, int]]]:
    """Split a buffer of (table or unread placeholder, rows) after its first ``n`` rows."""
    head: list[tuple[pa.Table | None, int]] = []
    for k, (table, rows) in enumerate(buffer):
        if n == 0:
            return head, buffer[k:]
        if rows <= n:
            head.append((table, rows))
            n -= rows
        else:
            head.append((table.slice(0, n) if table is not None else None, n))
            rest = (table.slice(n) if table is not None else None, rows - n)
            return head, [rest, *buffer[k + 1 :]]
    return head, []


def run(cfg: IngestConfig, executor: Executor | None = None, progress: bool = True) -> dict:
    """Run the whole stage; returns the metrics it also writes to ``cfg.metrics``."""
    with StageRun(STAGE, cfg, executor, progress) as run:
        files = resolve_inputs([os.path.join(cfg.root, p) for p in cfg.inputs], cfg.format)
        run.depend("files", [[f.path, f.format, f.size, f.mtime_ns] for f in files])
        out = dataset_path(cfg.output)
        sentences = run.output("output", S.SENTENCES, rows_per_shard=cfg.rows_per_shard)
        quarantine = run.output("quarantine", S.QUARANTINE)
        # Under the output, on a store too: the Dask workers that write them share no folder.
        work = out / "_work"
        if not (sentences.complete and quarantine.complete):
            # The read+clean step's scratch datasets, regrouped by the dedup step (the prepare
            # step of this stage: an output shard is no function of one input chunk).
            def work_writer(name: str, spec: S.SchemaSpec) -> DatasetWriter:
                return run.output(
                    name, spec, path=work / name, rows_per_shard=cfg.chunk_rows, scratch=True
                )

            clean = work_writer("clean", S.CLEAN_RECORDS)
            rejected = work_writer("rejected", S.QUARANTINE)
            n_chunks = [0, 0]
            outputs = {"clean": clean, "rejected": rejected}
            if not (clean.complete and rejected.complete):
                rows_by_file: dict[str, int] = {}
                chunks = _raw_chunks(cfg, files, list(outputs.values()), n_chunks, rows_by_file)
                run.map(_clean_fn(cfg), chunks, outputs, "ingest/read+clean")
                _check_rows_read(files, rows_by_file)
                log.info(
                    "ingest/read+clean: cleaned %d of %d chunks; %d were already finished",
                    n_chunks[0] - n_chunks[1],
                    n_chunks[0],
                    n_chunks[1],
                )
            else:
                n_chunks[0] = len(clean.finished_shards())
            clean.finalize(n_chunks[0])
            rejected.finalize(n_chunks[0])
            n_out, n_q, duplicates = _dedup_step(
                cfg, clean, rejected, sentences, quarantine, progress
            )
            counts: dict[str, int] = {"read": 0, "kept": 0, **run.totals(clean)}
            counts["dropped.duplicate"] = duplicates
            counts["kept"] -= duplicates
            extra = {"counts": counts, "inputs": [f.path for f in files]}
            sentences.finalize(n_out, extra=extra)
            quarantine.finalize(n_q, extra=extra)
        remove_tree(work)
        counts = json.loads((out / MANIFEST).read_text())["counts"]
        metrics = run.finish(_metrics(counts, sentences, quarantine))
        log.info(
            "ingest: read %d rows from %d files, kept %d, dropped %d (%s)",
            metrics["rows_read"],
            len(files),
            metrics["rows_kept"],
            metrics["rows_dropped_total"],
            ", ".join(f"{k} {v}" for k, v in metrics["rows_dropped"].items() if v) or "none",
        )
        return metrics


def _check_rows_read(files: list[InputFile], rows_by_file: dict[str, int]) -> None:
    """An empty input gives no rows and a warning; a corpus of only empty inputs is an error."""
    empty = [f.path for f in files if rows_by_file.get(f.path, 0) == 0]
    if len(empty) == len(files):
        raise ConfigError(
            f"ingest.inputs: no rows read from any input ({len(files)} file(s), all empty: "
            f"{', '.join(empty[:5])}{', ...' if len(empty) > 5 else ''}); "
            "point ingest.inputs at the corpus"
        )
    for path in empty:
        log.warning("ingest: %s is empty: no rows read from it", path)


def _clean_fn(cfg: IngestConfig):
    import functools

    return functools.partial(
        clean_shard,
        min_words=cfg.min_words,
        max_words=cfg.max_words,
        max_chars=cfg.max_chars,
        invalid_utf8=cfg.invalid_utf8,
    )


def _metrics(counts: dict[str, int], sentences: DatasetWriter, quarantine: DatasetWriter) -> dict:
    dropped = {r: int(counts.get(f"dropped.{r}", 0)) for r in REASONS}
    metrics = {
        "rows_read": int(counts["read"]),
        "rows_kept": int(counts["kept"]),
        "rows_dropped": dropped,
        "rows_dropped_total": sum(dropped.values()),
        "shards": len(sentences.finished_shards()),
    }
    written_kept = sum(s.rows for s in sentences.finished_shards())
    written_dropped = sum(s.rows for s in quarantine.finished_shards())
    if (
        metrics["rows_read"] != metrics["rows_kept"] + metrics["rows_dropped_total"]
        or written_kept != metrics["rows_kept"]
        or written_dropped != metrics["rows_dropped_total"]
    ):
        raise DataIntegrityError(
            f"ingest accounting mismatch: read {metrics['rows_read']}, kept {metrics['rows_kept']} "
            f"(written {written_kept}), dropped {metrics['rows_dropped_total']} (written {written_dropped})"
        )
    return metrics


# --- the command ------------------------------------------------------------------------------


@stage_command(STAGE, names={"inputs": ("--input", "-i")})
def command(cfg: IngestConfig, workers: int, scheduler: str | None, progress: bool) -> None:
    """Read raw corpus files into clean, deduplicated, id'd sentence shards.

    Every option defaults to the key of the same name in the `ingest` section of params.yaml.
    Dropped rows go to the quarantine dataset with their reason, file and line.
    """
    with executor(workers, scheduler) as ex:
        run(cfg, ex, progress=progress)
