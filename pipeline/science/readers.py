"""Streaming readers of raw corpora: text, JSON lines, CSV/TSV and Parquet, gzipped or not.

Readers never decode text and never hold more than one block plus one bounded line in memory.
They yield ``RawBlock``s of records: the record's bytes, where it came from (file and 1-based
record number) and, when the reader itself had to reject the record (a line over
``max_line_bytes``, malformed JSON, a missing field), the reason. Decoding, normalisation and
filters happen later, per shard, so that they can run in parallel.
"""

from __future__ import annotations

import collections
import csv
import glob
import gzip
import json
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

import pyarrow as pa
from pairforge.pipeline.plumbing.errors import ConfigError, PairforgeError
from pairforge.pipeline.plumbing.files import DECODE_THREADS, open_parquet

FORMATS = ("txt", "jsonl", "csv", "tsv", "parquet")
_SUFFIX_FORMAT = {
    ".txt": "txt",
    ".text": "txt",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".tsv": "tsv",
    ".parquet": "parquet",
    ".pq": "parquet",
}
PREVIEW_BYTES = 1000

# Reasons a reader can give.
TOO_LONG = "too_long"
MALFORMED = "malformed_record"
# A quoted CSV field may hold line breaks, up to this many physical lines per record.
MAX_RECORD_LINES = 16


class InputError(PairforgeError):
    """An input file cannot be read at all (as opposed to a bad record inside it)."""


@dataclass
class RawBlock:
    """Column lists of raw records (all the same length)."""

    raw: list[bytes] = field(default_factory=list)
    source: list[str] = field(default_factory=list)
    line: list[int] = field(default_factory=list)
    n_bytes: list[int] = field(default_factory=list)
    reason: list[str | None] = field(default_factory=list)
    detail: list[str | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.raw)

    def add(
        self,
        raw: bytes,
        source: str,
        line: int,
        n_bytes: int,
        reason: str | None = None,
        detail: str | None = None,
    ) -> None:
        self.raw.append(raw)
        self.source.append(source)
        self.line.append(line)
        self.n_bytes.append(n_bytes)
        self.reason.append(reason)
        self.detail.append(detail)

    def extend(self, other: RawBlock) -> None:
        for name in ("raw", "source", "line", "n_bytes", "reason", "detail"):
            getattr(self, name).extend(getattr(other, name))

    def take(self, n: int) -> RawBlock:
        """Remove and return the first ``n`` records."""
        head = RawBlock()
        for name in ("raw", "source", "line", "n_bytes", "reason", "detail"):
            column = getattr(self, name)
            setattr(head, name, column[:n])
            del column[:n]
        return head


@dataclass(frozen=True)
class InputFile:
    path: str
    format: str
    size: int
    mtime_ns: int


def detect_format(path: str) -> str | None:
    name = path[:-3] if path.endswith(".gz") else path
    return _SUFFIX_FORMAT.get(os.path.splitext(name)[1].lower())


def resolve_inputs(patterns: list[str], fmt: str = "auto") -> list[InputFile]:
    """Expand paths and globs (sorted, each file once) and decide each file's format."""
    files: list[InputFile] = []
    seen: set[str] = set()
    for pattern in patterns:
        matches = (
            sorted(glob.glob(pattern, recursive=True)) if glob.has_magic(pattern) else [pattern]
        )
        matches = [m for m in matches if os.path.isfile(m)]
        if not matches:
            raise ConfigError(f"ingest.inputs: {pattern!r} matches no file")
        for path in matches:
            if path in seen:
                continue
            seen.add(path)
            file_fmt = detect_format(path) if fmt == "auto" else fmt
            if file_fmt is None:
                raise ConfigError(
                    f"ingest.format: cannot tell the format of {path!r} from its name; "
                    f"set it to one of {', '.join(FORMATS)}"
                )
            stat = os.stat(path)
            files.append(InputFile(path, file_fmt, stat.st_size, stat.st_mtime_ns))
    return files


def _open_binary(path: str) -> BinaryIO:
    fh = open(path, "rb")  # noqa: SIM115 - returned to the caller, who closes it
    if fh.read(2) == b"\x1f\x8b":
        fh.seek(0)
        return gzip.GzipFile(fileobj=fh)  # type: ignore[return-value]
    fh.seek(0)
    return fh


def _file_lines(file: InputFile, max_line_bytes: int) -> Iterator[tuple[list[bytes], list[int]]]:
    """``iter_lines`` over a file, gzipped or not, with read failures as one ``InputError``.

    A truncated or corrupt gzip stream (and any I/O error) stops the stage with the file and the
    last line read, instead of a traceback or typer's bare "Aborted." (an ``EOFError``).
    """
    seen = 0
    try:
        with _open_binary(file.path) as fh:
            for lines, sizes in iter_lines(fh, max_line_bytes):
                yield lines, sizes
                seen += len(lines)
    except (EOFError, OSError, zlib.error) as exc:
        gz = file.path.endswith(".gz") or isinstance(exc, (EOFError, zlib.error, gzip.BadGzipFile))
        what = "the gzip stream is truncated or corrupt" if gz else "the file cannot be read"
        fix = (
            f"check it with `gzip -t {file.path}` and fetch it again" if gz else "fix or remove it"
        )
        raise InputError(
            f"{file.path}: {what} after line {seen} ({exc}); {fix}, or drop it from ingest.inputs"
        ) from None


def iter_lines(
    stream: BinaryIO, max_line_bytes: int, block_size: int = 1 << 20
) -> Iterator[tuple[list[bytes], list[int]]]:
    """Split a byte stream into lines on ``\r\n``, ``\n`` or a lone ``\r``.

    Yields per block ``(lines, sizes)`` where ``sizes`` are the true byte sizes. A line longer
    than ``max_line_bytes`` is yielded cut to its first ``PREVIEW_BYTES`` bytes and is never held
    whole in memory, so callers tell it by ``size > max_line_bytes``. A leading UTF-8 BOM is
    removed. Memory is bounded by ``block_size + max_line_bytes``.
    """
    carry = b""  # the current line so far (only its preview once it is oversized)
    carry_size = 0  # its true size so far
    pending_cr = False  # the previous block ended in \r, which may pair with a \n

    def cut(piece: bytes, size: int) -> bytes:
        return piece[:PREVIEW_BYTES] if size > max_line_bytes else piece

    start = stream.read(3)
    prefix = b"" if start == b"\xef\xbb\xbf" else start
    while True:
        block = stream.read(block_size)
        if prefix:
            block, prefix = prefix + block, b""
        if not block:
            break
        if pending_cr:
            block, pending_cr = b"\r" + block, False
        if block.endswith(b"\r"):
            block, pending_cr = block[:-1], True
        if b"\r" in block:
            block = block.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        pieces = block.split(b"\n")
        head = pieces[0]
        if carry_size > max_line_bytes:  # already oversized: only top up the preview
            if len(carry) < PREVIEW_BYTES:
                carry = (carry + head[:PREVIEW_BYTES])[:PREVIEW_BYTES]
            carry_size += len(head)
        else:
            carry_size += len(head)
            carry = cut(carry + head, carry_size)
        if len(pieces) == 1:
            continue
        tail = pieces[-1]
        middle = pieces[1:-1]
        middle_sizes = list(map(len, middle))
        if middle_sizes and max(middle_sizes) > max_line_bytes:
            middle = [cut(p, size) for p, size in zip(middle, middle_sizes, strict=False)]
        lines = [carry, *middle]
        sizes = [carry_size, *middle_sizes]
        carry, carry_size = cut(tail, len(tail)), len(tail)
        yield lines, sizes
    if pending_cr or carry_size:
        yield [carry], [carry_size]


def _read_text(file: InputFile, max_line_bytes: int) -> Iterator[RawBlock]:
    number = 0
    for lines, sizes in _file_lines(file, max_line_bytes):
        block = RawBlock()
        n = len(lines)
        block.raw = lines
        block.source = [file.path] * n
        block.line = list(range(number + 1, number + n + 1))
        block.n_bytes = sizes
        block.reason = [TOO_LONG if s > max_line_bytes else None for s in sizes]
        block.detail = [
            f"line of {s} bytes over max_line_bytes={max_line_bytes}"
            if s > max_line_bytes
            else None
            for s in sizes
        ]
        number += n
        yield block


def _read_jsonl(file: InputFile, field_name: str, max_line_bytes: int) -> Iterator[RawBlock]:
    number = 0
    for lines, sizes in _file_lines(file, max_line_bytes):
        block = RawBlock()
        for line, size in zip(lines, sizes, strict=False):
            number += 1
            if size > max_line_bytes:
                block.add(
                    line,
                    file.path,
                    number,
                    size,
                    TOO_LONG,
                    f"line of {size} bytes over max_line_bytes={max_line_bytes}",
                )
                continue
            if not line.strip():
                block.add(b"", file.path, number, size)  # dropped later as empty
                continue
            try:
                obj = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                block.add(line, file.path, number, size, MALFORMED, f"invalid JSON: {exc}")
                continue
            value = obj.get(field_name) if isinstance(obj, dict) else None
            if not isinstance(value, str):
                why = (
                    f"no field {field_name!r}"
                    if not isinstance(obj, dict) or field_name not in obj
                    else f"field {field_name!r} is {type(value).__name__}, not a string"
                )
                block.add(line, file.path, number, size, MALFORMED, why)
                continue
            # Lone surrogates from \\ud800-style escapes survive as invalid UTF-8 bytes.
            block.add(value.encode("utf-8", "surrogatepass"), file.path, number, size)
        yield block


def _numbered_lines(file: InputFile, max_line_bytes: int) -> Iterator[tuple[int, bytes, int]]:
    """``(line number, bytes, true size)`` of every physical line of a file."""
    number = 0
    for lines, sizes in _file_lines(file, max_line_bytes):
        for line, size in zip(lines, sizes, strict=True):
            number += 1
            yield number, line, size


class _CsvRecords:
    """CSV/TSV records over physical lines, with unterminated quotes caught instead of merged.

    A quoted field may hold line breaks (RFC 4180), but a record that spans several lines is
    accepted only when it closes properly within ``MAX_RECORD_LINES`` lines, has as many fields
    as the header, and none of its inner lines looks like a record of its own (the header's
    number of fields, no quote). Otherwise the quote that opened it was never closed: its first
    line is one ``malformed_record`` and reading resumes at the next line, so the rows it would
    have swallowed are read as what they are. A quote not followed by the delimiter or the end
    of the line is malformed too (``strict``); so is a line that opens a quote at the end of file.
    """

    def __init__(self, file: InputFile, delimiter: str, max_line_bytes: int) -> None:
        self.file = file
        self.delimiter = delimiter
        self.max_line_bytes = max_line_bytes
        self.lines = _numbered_lines(file, max_line_bytes)
        self.pending: collections.deque[tuple[int, bytes, int]] = collections.deque()
        self.width: int | None = None  # the header's number of fields, once read

    def _pull(self) -> tuple[int, bytes, int] | None:
        return self.pending.popleft() if self.pending else next(self.lines, None)

    def _alone(self, text: str) -> list[str]:
        return next(csv.reader([text], delimiter=self.delimiter)) if text else []

    def next(self) -> tuple[int, int, bytes, list[str] | None, str | None, str | None] | None:
        """The next record as ``(line, n_bytes, first line's bytes, fields, reason, detail)``
        (fields ``None`` when rejected), or ``None`` at the end of the file."""
        first = self._pull()
        if first is None:
            return None
        number, raw, size = first
        if size > self.max_line_bytes:
            why = f"line of {size} bytes over max_line_bytes={self.max_line_bytes}"
            return number, size, raw, None, TOO_LONG, why
        text = raw.decode("utf-8", "surrogateescape")
        if '"' not in text:  # the common case needs no CSV state machine
            return number, size, raw, text.split(self.delimiter) if text else [], None, None
        span = [first]

        def feed() -> Iterator[str]:
            yield text + "\n"
            while len(span) < MAX_RECORD_LINES:
                line = self._pull()
                if line is None:
                    return
                span.append(line)
                if line[2] > self.max_line_bytes:
                    return  # ends the quoted field as at the end of the file: rejected below
                yield line[1].decode("utf-8", "surrogateescape") + "\n"

        try:
            fields: list[str] | None = next(
                csv.reader(feed(), delimiter=self.delimiter, strict=True)
            )
            error = None
        except csv.Error as exc:
            fields, error = None, str(exc)
        if fields is not None and len(span) > 1:
            inner = [line[1].decode("utf-8", "surrogateescape") for line in span[1:]]
            if self.width is not None and len(fields) != self.width:
                error = f"{len(fields)} fields where the header has {self.width}"
            elif self.width is not None and self.width > 1:
                for k, line_text in enumerate(inner):
                    if '"' not in line_text and len(self._alone(line_text)) == self.width:
                        error = f"line {span[k + 1][0]} inside it reads as a record of its own"
                        break
        if error is None:
            return number, sum(line[2] for line in span), raw, fields, None, None
        if len(span) == 1:
            return number, size, raw, None, MALFORMED, f"CSV error: {error}"
        # The quote opened on the first line never closed: reject that line, reread the rest.
        self.pending.extendleft(reversed(span[1:]))
        why = (
            f"unterminated quoted field: the record starting here does not close properly "
            f"within lines {number}-{span[-1][0]} ({error})"
        )
        return number, size, raw, None, MALFORMED, why


def _read_csv(
    file: InputFile, field_name: str, delimiter: str, max_line_bytes: int, block_rows: int = 50_000
) -> Iterator[RawBlock]:
    csv.field_size_limit(max(max_line_bytes * MAX_RECORD_LINES, 1 << 17))
    records = _CsvRecords(file, delimiter, max_line_bytes)
    head = records.next()
    if head is None:
        return  # an empty file: no rows
    if head[3] is None:
        raise InputError(f"{file.path}: cannot read the CSV header on line {head[0]}: {head[5]}")
    header = head[3]
    if field_name not in header:
        raise ConfigError(
            f"ingest.field: column {field_name!r} not in {file.path} (columns: {header})"
        )
    column = header.index(field_name)
    records.width = len(header)
    block = RawBlock()
    while (record := records.next()) is not None:
        number, n_bytes, raw, fields, reason, detail = record
        if fields is None:
            block.add(raw, file.path, number, n_bytes, reason, detail)
        elif not fields:
            block.add(b"", file.path, number, n_bytes)  # a blank line: dropped later as empty
        elif column >= len(fields):
            block.add(
                delimiter.join(fields).encode("utf-8", "surrogateescape"),
                file.path,
                number,
                n_bytes,
                MALFORMED,
                f"row has {len(fields)} fields, no {field_name!r}",
            )
        else:
            block.add(fields[column].encode("utf-8", "surrogateescape"), file.path, number, n_bytes)
        if len(block) >= block_rows:
            yield block
            block = RawBlock()
    if block:
        yield block


def _read_parquet(
    file: InputFile, field_name: str, max_line_bytes: int, block_rows: int = 65_536
) -> Iterator[RawBlock]:
    try:
        pf = open_parquet(file.path)
    except (pa.ArrowException, OSError) as exc:
        state = "empty (0 bytes)" if file.size == 0 else f"corrupt or not Parquet ({exc})"
        raise InputError(
            f"{file.path}: cannot read it as Parquet: the file is {state}; "
            "write it again or drop it from ingest.inputs"
        ) from None
    names = pf.schema_arrow.names
    if field_name not in names:
        raise ConfigError(
            f"ingest.field: column {field_name!r} not in {file.path} (columns: {names})"
        )
    kind = pf.schema_arrow.field(field_name).type
    if not (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
    ):
        raise InputError(f"{file.path}: column {field_name!r} is {kind}, not text")
    number = 0
    batches = pf.iter_batches(
        columns=[field_name], batch_size=block_rows, use_threads=DECODE_THREADS
    )
    while True:
        try:
            batch = next(batches, None)
        except (pa.ArrowException, OSError) as exc:
            raise InputError(
                f"{file.path}: the Parquet data is corrupt after row {number} ({exc}); "
                "write it again or drop it from ingest.inputs"
            ) from None
        if batch is None:
            break
        values = batch.column(0).cast(pa.large_binary()).to_pylist()
        block = RawBlock()
        for value in values:
            number += 1
            if value is None:
                block.add(b"", file.path, number, 0, MALFORMED, "null value")
            elif len(value) > max_line_bytes:
                block.add(
                    value[:PREVIEW_BYTES],
                    file.path,
                    number,
                    len(value),
                    TOO_LONG,
                    f"value of {len(value)} bytes over max_line_bytes={max_line_bytes}",
                )
            else:
                block.add(value, file.path, number, len(value))
        yield block


def read_blocks(
    files: list[InputFile],
    field_name: str,
    max_line_bytes: int,
    rows_by_file: dict[str, int] | None = None,
) -> Iterator[RawBlock]:
    """Every record of every file, in order, as blocks; ``rows_by_file`` (when given) ends with
    each file's number of records, 0 for an empty file."""
    for file in files:
        if file.format == "txt":
            blocks = _read_text(file, max_line_bytes)
        elif file.format == "jsonl":
            blocks = _read_jsonl(file, field_name, max_line_bytes)
        elif file.format in ("csv", "tsv"):
            delimiter = "," if file.format == "csv" else "\t"
            blocks = _read_csv(file, field_name, delimiter, max_line_bytes)
        elif file.format == "parquet":
            blocks = _read_parquet(file, field_name, max_line_bytes)
        else:
            raise ConfigError(f"ingest.format: {file.format!r} is not one of {', '.join(FORMATS)}")
        rows = 0
        for block in blocks:
            rows += len(block)
            yield block
        if rows_by_file is not None:
            rows_by_file[file.path] = rows


def read_chunks(
    files: list[InputFile],
    field_name: str,
    max_line_bytes: int,
    chunk_rows: int,
    rows_by_file: dict[str, int] | None = None,
) -> Iterator[RawBlock]:
    """Records regrouped into chunks of exactly ``chunk_rows`` (the last may be shorter)."""
    pending = RawBlock()
    for block in read_blocks(files, field_name, max_line_bytes, rows_by_file):
        pending.extend(block)
        while len(pending) >= chunk_rows:
            yield pending.take(chunk_rows)
    if pending:
        yield pending
