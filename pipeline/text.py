"""Text normalisation and stable sentence ids, vectorised over Arrow arrays."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Control characters, every Unicode separator (spaces, line and paragraph separators), ASCII
# whitespace, the BOM and the zero-width space all become one space. Other format characters
# (soft hyphen, zero-width joiner) are kept: they carry meaning in some scripts and emoji.
_SPACES = r"[\p{Cc}\p{Z}\s\x{FEFF}\x{200B}]+"


def normalize(texts: pa.Array) -> pa.Array:
    """Unicode NFC, control characters and runs of whitespace to one space, trimmed."""
    texts = pc.utf8_normalize(texts, form="NFC")
    texts = pc.replace_substring_regex(texts, _SPACES, " ")
    return pc.utf8_trim(texts, " ")


def word_counts(normalized: pa.Array) -> np.ndarray:
    """Whitespace-separated words of normalised (single-spaced, trimmed) text; 0 for ''."""
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
