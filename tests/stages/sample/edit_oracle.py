"""The reference edit distances over plain strings: rapidfuzz called the simplest way.

The ``sample`` stage scores through ``pairforge.stages.sample.edits.edit_scorer`` (texts encoded
once, compiled kernels or rapidfuzz over the encoded texts). This module is what those are
checked against in the tests, and what the benchmarks time as the plain rapidfuzz baseline
(``benchmarks/edit_throughput.py``, ``benchmarks/mine.py``) or use to score another miner's
pairs like the stage does (``benchmarks/quality.py``): DebCSE eq. 1's ``edit(x_i, x_j)`` between
strings, with the stage's units and metrics.

- ``kind="char"`` compares characters, ``kind="word"`` word tokens (:func:`tokenize_words`, the
  stage's tokeniser).
- ``normalized=True`` divides by the largest possible distance for the two lengths (float32 in
  [0, 1]); ``False`` gives int32 operation counts.
- ``metric="levenshtein"`` (insert, delete, substitute at 1 each) or ``"indel"`` (no
  substitution: it costs 2).
- ``workers`` as rapidfuzz takes it: ``-1`` uses every core.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pairforge.stages.sample.edits as edits
from pairforge.stages.sample.edits import EditKind, EditMetric
from rapidfuzz import process


def tokenize_words(text: str) -> list[str]:
    """Word tokens of ``text`` as the stage cuts them: runs of word characters, and each
    punctuation mark on its own; case kept, as at character level."""
    return edits._WORD_RE.findall(text)


class _VocabularyFull(Exception):
    pass


def encode_words(*groups: Sequence[str]) -> list[list[str]] | list[list[list[int]]]:
    """Tokenise each group of texts into word sequences over one shared vocabulary, in order of
    first sight (``WordCodes`` of the stage ranks by frequency instead).

    Each distinct token becomes one character, so a sentence is a short string for rapidfuzz's
    string kernels; distances between encoded sequences equal distances between the token lists.
    A call holding more distinct tokens than there are code points (``edits._MAX_CODES``) gets
    lists of integer ids instead, which rapidfuzz also accepts, only slower.
    """
    table: dict[str, str] = {}
    memo: dict[str, str] = {}
    findall = edits._WORD_RE.findall

    def encode(text: str) -> str:
        out = memo.get(text)
        if out is None:
            chars = []
            for tok in findall(text):
                ch = table.get(tok)
                if ch is None:
                    if len(table) >= edits._MAX_CODES:
                        raise _VocabularyFull
                    ch = table[tok] = edits._code(len(table))
                chars.append(ch)
            out = memo[text] = "".join(chars)
        return out

    try:
        return [[encode(t) for t in texts] for texts in groups]
    except _VocabularyFull:
        pass
    vocab: dict[str, int] = {}
    return [
        [[vocab.setdefault(tok, len(vocab)) for tok in findall(t)] for t in texts]
        for texts in groups
    ]


def _encode(kind: EditKind, *groups: Sequence[str]) -> list:
    if kind == "char":
        return list(groups)
    if kind == "word":
        return encode_words(*groups)
    raise ValueError(f"kind must be 'char' or 'word', got {kind!r}")


def pair_distances(
    anchors: Sequence[str],
    candidates: Sequence[str],
    kind: EditKind = "char",
    normalized: bool = True,
    workers: int = -1,
    metric: EditMetric = "levenshtein",
) -> np.ndarray:
    """Distance between ``anchors[i]`` and ``candidates[i]`` for every i, shape ``(n,)``: one
    ``rapidfuzz.process.cpdist`` call over all pairs."""
    if len(anchors) != len(candidates):
        raise ValueError(
            f"anchors and candidates must be aligned, got {len(anchors)} and {len(candidates)}"
        )
    scorer = edits._scorer(metric, normalized)
    a, c = _encode(kind, anchors, candidates)
    out = process.cpdist(a, c, scorer=scorer, dtype=edits._dtype(normalized), workers=workers)
    return out.reshape(len(anchors))


def cross_distances(
    anchors: Sequence[str],
    candidates: Sequence[str],
    kind: EditKind = "char",
    normalized: bool = True,
    workers: int = -1,
    metric: EditMetric = "levenshtein",
) -> np.ndarray:
    """Distance between every anchor and every candidate, shape ``(n_anchors, n_candidates)``."""
    scorer = edits._scorer(metric, normalized)
    a, c = _encode(kind, anchors, candidates)
    return process.cdist(a, c, scorer=scorer, dtype=edits._dtype(normalized), workers=workers)


def pool_distances(
    anchors: Sequence[str],
    candidates: Sequence[str],
    offsets: np.ndarray,
    kind: EditKind = "char",
    normalized: bool = True,
    workers: int = -1,
    metric: EditMetric = "levenshtein",
) -> np.ndarray:
    """Distance of every candidate of ragged pools to its pool's anchor, flat shape ``(N,)``.

    Pool ``i`` is ``candidates[offsets[i]:offsets[i + 1]]`` and belongs to ``anchors[i]``
    (``len(offsets) == len(anchors) + 1``); the output lines up with ``candidates``.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    if offsets.ndim != 1 or offsets.size != len(anchors) + 1:
        raise ValueError(
            f"offsets must have len(anchors) + 1 = {len(anchors) + 1} entries, "
            f"got shape {offsets.shape}"
        )
    if offsets[0] != 0 or offsets[-1] != len(candidates) or np.any(np.diff(offsets) < 0):
        raise ValueError(
            f"offsets must rise from 0 to len(candidates) = {len(candidates)}, "
            f"got {offsets[0]} .. {offsets[-1]}"
        )
    scorer = edits._scorer(metric, normalized)
    a, c = _encode(kind, anchors, candidates)
    items = np.empty(len(a), dtype=object)  # not np.asarray: equal-length id lists would go 2-D
    for i, item in enumerate(a):
        items[i] = item
    repeated = np.repeat(items, np.diff(offsets))  # (N,)
    out = process.cpdist(
        repeated, c, scorer=scorer, dtype=edits._dtype(normalized), workers=workers
    )
    return out.reshape(len(candidates))
