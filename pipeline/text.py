"""Text normalisation and stable sentence ids."""

from __future__ import annotations

import hashlib
import sys
import unicodedata

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Control characters, every Unicode separator (spaces, line and paragraph separators), the BOM
# and the zero-width space all become a space; runs of whitespace then collapse to one. Other
# format characters (soft hyphen, zero-width joiner) are kept: they carry meaning in some
# scripts and in emoji sequences.
_TO_SPACE = {
    cp: " "
    for cp in range(sys.maxunicode + 1)
    if unicodedata.category(chr(cp)) in ("Cc", "Zs", "Zl", "Zp") or cp in (0xFEFF, 0x200B)
}


def normalize_one(text: str) -> str:
    """Unicode NFC, control characters and runs of whitespace to one space, trimmed."""
    if not (text.isascii() and text.isprintable()):
        text = unicodedata.normalize("NFC", text)
        if not text.isprintable():
            text = text.translate(_TO_SPACE)
    return " ".join(text.split())


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

    def any_below(self, value: int) -> np.ndarray:
        return self._count(self.data < value) > 0

    def nonascii(self) -> np.ndarray:
        return self._count(self.data >= 0x80) > 0

    def chars(self) -> np.ndarray:
        """Code points of valid UTF-8 rows: bytes that are not continuation bytes."""
        return self.nbytes - self._count((self.data & 0xC0) == 0x80)

    def double_or_edge_space(self) -> np.ndarray:
        data = self.data
        pairs = np.zeros(len(data), dtype=bool)
        if len(data) > 1:
            pairs[1:] = (data[1:] == 0x20) & (data[:-1] == 0x20)
        # A pair that starts at a row's first byte straddles two rows: the edge test catches it.
        double = self._count(pairs) > 0
        nonempty = self.nbytes > 0
        first = np.where(
            nonempty, data[np.minimum(self.start, max(len(data) - 1, 0))] if len(data) else 0, 0
        )
        last = np.where(nonempty, data[np.maximum(self.end - 1, 0)] if len(data) else 0, 0)
        return double | (nonempty & ((first == 0x20) | (last == 0x20)))


def normalize(texts: pa.Array) -> pa.Array:
    """``normalize_one`` over an Arrow string array.

    Rows that are already normal (printable ASCII, single-spaced, trimmed: most of any real
    corpus) are found from the raw bytes with numpy and left alone; only the rest go through
    Python.
    """
    stats = ByteStats(texts)
    ctrl = stats.any_below(0x20) | (stats.count(0x7F) > 0)
    todo = np.flatnonzero(stats.nonascii() | ctrl | stats.double_or_edge_space())
    if not len(todo):
        return texts
    fixed = [normalize_one(t) for t in texts.take(pa.array(todo)).to_pylist()]
    mask = np.zeros(len(texts), dtype=bool)
    mask[todo] = True
    return pc.replace_with_mask(texts, pa.array(mask), pa.array(fixed, pa.string()))


def word_counts(normalized: pa.Array) -> np.ndarray:
    """Space-separated words of normalised (single-spaced, trimmed) text; 0 for ''."""
    stats = ByteStats(normalized)
    return np.where(stats.nbytes > 0, stats.count(0x20) + 1, 0)


def sentence_ids(normalized: list[str]) -> tuple[list[str], np.ndarray]:
    """Stable ids: the first 64 bits of BLAKE2b of the UTF-8 text, as hex and as uint64."""
    digests = [hashlib.blake2b(t.encode(), digest_size=8).digest() for t in normalized]
    keys = np.frombuffer(b"".join(digests), dtype=">u8").astype(np.uint64)
    return [d.hex() for d in digests], keys


def sentence_id(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
