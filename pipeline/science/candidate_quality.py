"""The per-row columns of a candidate besides its text: its id, and cheap quality signals against
its source sentence (scores, not decisions).

- ``identical``: equal to the source after whitespace normalisation (a round trip that returned
  its input is not a useful positive; downstream sampling drops or down-weights it);
- ``length_ratio``: candidate characters / source characters;
- ``edit_ratio``: normalised character Indel distance (insertions + deletions over the summed
  lengths), in [0, 1]; 0 for equal strings, 1 for strings without a common character.
"""

from __future__ import annotations

import hashlib

import numpy as np
from pairforge.pipeline.science.text import squeeze_spaces


def quality_signals(
    sources: list[str], candidates: list[str]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(identical bool, length_ratio float32, edit_ratio float32)``, one entry per pair."""
    if len(sources) != len(candidates):
        raise ValueError(f"{len(sources)} sources but {len(candidates)} candidates")
    if not sources:
        return np.zeros(0, bool), np.zeros(0, np.float32), np.zeros(0, np.float32)
    src = [squeeze_spaces(s) for s in sources]
    cand = [squeeze_spaces(c) for c in candidates]
    identical = np.fromiter((a == b for a, b in zip(src, cand, strict=True)), bool, len(src))
    src_len = np.fromiter((len(s) for s in sources), np.float64, len(sources))
    cand_len = np.fromiter((len(c) for c in candidates), np.float64, len(candidates))
    length_ratio = (cand_len / np.maximum(src_len, 1.0)).astype(np.float32)
    from rapidfuzz.distance import Indel
    from rapidfuzz.process import cpdist

    edit_ratio = cpdist(sources, candidates, scorer=Indel.normalized_distance, workers=1)
    return identical, length_ratio, np.asarray(edit_ratio, dtype=np.float32)


def candidate_id(
    sentence_id: str, route: str, model: str, decoding: str, noise: str, index: int
) -> str:
    """BLAKE2b-64 hex over (id, route, model, decoding, noise, index): unique per candidate."""
    parts = "\x1f".join([sentence_id, route, model, decoding, noise, str(index)])
    return hashlib.blake2b(parts.encode(), digest_size=8).hexdigest()
