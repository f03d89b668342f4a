"""Text normalisation and stable sentence ids.

Three forms of a text, each with one name:

- :func:`normalize_one` (:func:`normalize` over an Arrow array): the text as ``ingest`` stores it
  (NFC, control characters and whitespace runs to one space, trimmed);
- :func:`squeeze_spaces`: whitespace runs to one space, trimmed (how augmentations are compared
  with their source);
- :func:`match_key`: NFKC, case-folded, whitespace squeezed (what two sentences are compared by
  when the question is "the same sentence?", as the negative pools' ``exact_duplicate`` rule).
"""

from __future__ import annotations

import hashlib
import unicodedata

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Control characters, every Unicode separator (spaces, line and paragraph separators), the BOM
# and the zero-width space all become a space; runs of whitespace then collapse to one. Other
# format characters (soft hyphen, zero-width joiner) are kept: they carry meaning in some
# scripts and in emoji sequences.
_SPACE_CATEGORIES = ("Cc", "Zs", "Zl", "Zp")


class _ToSpace(dict):
    """``str.translate`` table filled on first sight of each code point: building it for all
    1.1M code points up front would slow every import (every CLI start)."""

    def __missing__(self, cp: int) -> str:
        char = chr(cp)
        self[cp] = out = (
            " "
            if unicodedata.category(char) in _SPACE_CATEGORIES or cp in (0xFEFF, 0x200B)
            else char
        )
        return out


_TO_SPACE = _ToSpace()


def normalize_one(text: str) -> str:
    """Unicode NFC, control characters and runs of whitespace to one space, trimmed."""
    if not (text.isascii() and text.isprintable()):
        text = unicodedata.normalize("NFC", text)
        if not text.isprintable():
            text = text.translate(_TO_SPACE)
    return " ".join(text.split())


def squeeze_spaces(text: str) -> str:
    """Whitespace runs collapsed to one space, ends stripped."""
    return " ".join(text.split())


def match_key(text: str) -> str:
    """Text as compared for duplicates: Unicode NFKC, case-folded, whitespace runs collapsed,
    trimmed."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


class ByteStats:
    """Per-row facts read straight off an Arrow string/binary array's buffers with numpy."""

    def __init__(self, arr: pa.Array) -> None:
        arr = arr.cast(pa.large_binary()) if not pa.types.is_large_binary(arr.type) else arr
        n = len(arr)
        bufs = arr.buffers()
        offsets = np.frombuffer(bufs[1], dtype=np.int64, count=n + 1, offset=arr.offset * 8)
        data = (
            np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.empty(0, np.uint8)
        )
        # Arrow values are contiguous: row i is data[offsets[i]:offsets[i + 1]].
        self.n = n
        self.data = data[offsets[0] : offsets[-1]]
        self.start, self.end = offsets[:-1] - offsets[0], offsets[1:] - offsets[0]
        self.nbytes = self.end - self.start

    def _count(self, flags: np.ndarray) -> np.ndarray:
        """Set flags per row. reduceat sums each [start_i, start_i+1) segment; a zero pad byte
        keeps every start a valid index, and empty rows (whose segment reduceat would not make
        empty) are zeroed."""
        if not self.n:
            return np.zeros(0, dtype=np.int64)
        padded = np.append(flags.view(np.uint8) if flags.dtype == bool else flags, np.uint8(0))
        counts = np.add.reduceat(padded, self.start, dtype=np.int64)
        counts[self.nbytes == 0] = 0
        return counts

    def count(self, byte: int) -> np.ndarray:
        return self._count(self.data == byte)


# Everything ``normalize_one`` would change in a row: a character it turns into a space (a space
# other than U+0020 included), a double space, or a space at either end. NFC is checked apart.
_NEEDS_WORK = r"[\p{Cc}\p{Zl}\p{Zp}\x{FEFF}\x{200B}]|[^\P{Zs} ]|  |^ | $"


def _rows_with_double_space(stats: ByteStats) -> np.ndarray:
    """Row mask: the row holds two consecutive 0x20 bytes (found sparsely, no per-byte reduce)."""
    data = stats.data
    hits = np.zeros(stats.n, dtype=bool)
    if len(data) > 1:
        pos = np.flatnonzero((data[1:] == 0x20) & (data[:-1] == 0x20))
        if len(pos):
            rows = np.searchsorted(stats.start, pos, side="right") - 1
            # A pair straddling two rows starts at a row's last byte: not a double space.
            inside = pos + 1 < stats.end[rows]
            hits[rows[inside]] = True
    return hits


def normalize(texts: pa.Array) -> pa.Array:
    """``normalize_one`` over an Arrow string array, with the same result row for row.

    Most rows of any real corpus are already normal. Arrow kernels and numpy find the few that
    are not (printable ASCII, single-spaced and trimmed rows are normal; other rows are normal
    when they are NFC and hold nothing ``_NEEDS_WORK`` matches); only those go through Python.
    """
    if not len(texts):
        return texts
    texts = texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else texts
    stats = ByteStats(texts)
    printable = pc.ascii_is_printable(texts).to_numpy(zero_copy_only=False)
    edge = pc.not_equal(
        pc.binary_length(pc.utf8_trim(texts, " ")), pc.binary_length(texts)
    ).to_numpy(zero_copy_only=False)
    suspects = np.flatnonzero(~printable | edge | _rows_with_double_space(stats))
    if not len(suspects):
        return texts
    subset = texts.take(pa.array(suspects))
    work = pc.match_substring_regex(subset, _NEEDS_WORK).to_numpy(zero_copy_only=False)
    values = subset.to_pylist()
    todo = [
        k for k, text in enumerate(values) if work[k] or not unicodedata.is_normalized("NFC", text)
    ]
    if not todo:
        return texts
    mask = np.zeros(len(texts), dtype=bool)
    mask[suspects[todo]] = True
    fixed = [normalize_one(values[k]) for k in todo]
    return pc.replace_with_mask(texts, pa.array(mask), pa.array(fixed, pa.string()))


def word_counts(normalized: pa.Array) -> np.ndarray:
    """Space-separated words of normalised (single-spaced, trimmed) text; 0 for ''."""
    stats = ByteStats(normalized)
    return np.where(stats.nbytes > 0, stats.count(0x20) + 1, 0)


def char_counts(texts: pa.Array) -> np.ndarray:
    """Code points per row of a string array."""
    return pc.utf8_length(texts).to_numpy(zero_copy_only=False).astype(np.int64)


def sentence_ids(normalized: pa.Array | list[str]) -> tuple[pa.Array, np.ndarray]:
    """Stable ids: the first 64 bits of BLAKE2b of the UTF-8 text, as hex strings and as uint64.

    The hex ids are built as one Arrow buffer (16 ASCII bytes a row), not as Python strings.
    """
    if isinstance(normalized, list):
        normalized = pa.array(normalized, pa.string())
    blobs = normalized.cast(pa.binary()).to_pylist()
    digests = b"".join([hashlib.blake2b(b, digest_size=8).digest() for b in blobs])
    n = len(blobs)
    keys = np.frombuffer(digests, dtype=">u8").astype(np.uint64)
    offsets = np.arange(0, 16 * n + 1, 16, dtype=np.int32)
    ids = pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(digests.hex().encode())]
    )
    return ids, keys


def sentence_id(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
