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


def normalize(texts: pa.Array) -> pa.Array:
    """``normalize_one`` over an Arrow string array.

    Rows that are already normal (printable ASCII, single-spaced, trimmed: most of any real
    corpus) are found with vectorised kernels and left alone; only the rest go through Python.
    """
    clean = pc.and_(
        pc.and_(pc.string_is_ascii(texts), pc.utf8_is_printable(texts)),
        pc.invert(
            pc.or_(
                pc.match_substring(texts, "  "),
                pc.or_(pc.starts_with(texts, " "), pc.ends_with(texts, " ")),
            )
        ),
    )
    clean = pc.fill_null(clean, False).to_numpy(zero_copy_only=False)
    if clean.all():
        return texts
    todo = np.flatnonzero(~clean)
    fixed = [normalize_one(t) for t in texts.take(pa.array(todo)).to_pylist()]
    values = texts.to_pylist()
    for i, value in zip(todo, fixed):
        values[i] = value
    return pa.array(values, pa.large_string()).cast(pa.string())


def word_counts(normalized: pa.Array) -> np.ndarray:
    """Space-separated words of normalised (single-spaced, trimmed) text; 0 for ''."""
    spaces = pc.count_substring(normalized, " ").to_numpy(zero_copy_only=False)
    nonempty = pc.greater(pc.utf8_length(normalized), 0).to_numpy(zero_copy_only=False)
    return np.where(nonempty, spaces + 1, 0)


def sentence_ids(normalized: list[str]) -> tuple[list[str], np.ndarray]:
    """Stable ids: the first 64 bits of BLAKE2b of the UTF-8 text, as hex and as uint64."""
    digests = [hashlib.blake2b(t.encode(), digest_size=8).digest() for t in normalized]
    keys = np.frombuffer(b"".join(digests), dtype=">u8").astype(np.uint64)
    return [d.hex() for d in digests], keys


def sentence_id(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
