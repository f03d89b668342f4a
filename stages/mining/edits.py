"""Edit distances between anchors and their candidates, vectorised with rapidfuzz.

This is the ``edit(x_i, x_j)`` of DebCSE eq. 1. The paper says only "edit distance" (citing
Ristad & Yianilos' string-edit distance); it names neither the unit nor a normalisation, so both
are parameters here:

- ``kind="char"`` compares characters, ``kind="word"`` compares word tokens (see
  :func:`tokenize_words`).
- ``normalized=True`` divides the distance by its largest possible value for the two lengths
  (``max(len_a, len_b)`` for Levenshtein), giving a float in [0, 1]; ``normalized=False`` returns
  the integer count of operations.
- ``metric="levenshtein"`` (insert, delete, substitute, each costing 1) is the classic edit
  distance and the default. ``metric="indel"`` (insert and delete only; a substitution costs 2;
  ``1 - fuzz.ratio / 100`` when normalised) runs about 4x faster on sentences longer than 64
  characters, because its bit-parallel kernel is simpler.

Why normalised (the default everywhere): eq. 1 puts the distance inside ``exp``. Raw character
distances between sentences are tens of operations apart, so ``exp(edit)`` of the farthest
candidate dwarfs all others (a gap of 10 is a factor of 22,000), the softmax collapses onto that
one candidate, S_sur is ~0 for it and ~1 for every other, and the surface term stops ranking
anything (METHODS.md section 2). Normalised distances differ by less than 1, which keeps every
candidate in play (then the softmaxes barely sharpen; ``ipw.py`` exposes a temperature for that).

Unit: these functions default to characters (no tokeniser, the same meaning across corpora). The
``sample`` stage defaults to **words** (``WordCodes`` + ``encoded_distances``): the surface
similarity DebCSE wants in a hard negative is shared wording, which its own diagnostic counts in
words (Tables 1 and 4), a changed word then counts once instead of once per letter, and sentences
encoded once per run score 2-4x faster than characters (benchmarks/mine.py).

All functions take ``workers`` as rapidfuzz does: ``-1`` uses every core (the GIL is released).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

import numpy as np
from rapidfuzz import process
from rapidfuzz.distance import Indel, Levenshtein

__all__ = [
    "EditKind",
    "EditMetric",
    "WordCodes",
    "cross_distances",
    "encode_words",
    "encoded_distances",
    "pair_distances",
    "pool_distances",
    "tokenize_words",
]

EditKind = Literal["char", "word"]
EditMetric = Literal["levenshtein", "indel"]

_WORD_RE = re.compile(r"\w+|[^\w\s]")

# Code points available to stand for word ids: all of Unicode except the surrogate block, which
# cannot be encoded and which some string routines reject.
_SURROGATES = (0xD800, 0xE000)
_MAX_CODES = 0x110000 - (_SURROGATES[1] - _SURROGATES[0])


def tokenize_words(text: str) -> list[str]:
    """Word tokens of ``text``: runs of word characters, and each punctuation mark on its own.

    Case is kept, like the character-level distance, so that both kinds see the same text.
    """
    return _WORD_RE.findall(text)


def _code(i: int) -> str:
    return chr(i if i < _SURROGATES[0] else i + (_SURROGATES[1] - _SURROGATES[0]))


class _VocabularyFull(Exception):
    pass


def encode_words(*groups: Sequence[str]) -> list[list[str]] | list[list[list[int]]]:
    """Tokenise each group of texts into word sequences over one shared vocabulary.

    Each distinct token becomes one Unicode character, so a sentence of words is a short string
    and rapidfuzz uses its string kernels (a 20-word sentence fits one 64-bit word of the
    bit-parallel algorithm). Distances between encoded sequences equal distances between the token
    lists. Each distinct text is tokenised once per call (pools repeat corpus sentences a lot). If a
    call holds more distinct tokens than there are code points (about 1.1 million), it returns
    lists of integer ids instead, which rapidfuzz also accepts, only slower.
    """
    table: dict[str, str] = {}
    memo: dict[str, str] = {}
    findall = _WORD_RE.findall

    def encode(text: str) -> str:
        out = memo.get(text)
        if out is None:
            chars = []
            for tok in findall(text):
                ch = table.get(tok)
                if ch is None:
                    if len(table) >= _MAX_CODES:
                        raise _VocabularyFull
                    ch = table[tok] = _code(len(table))
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


class WordCodes:
    """A word vocabulary fitted once over a corpus; each sentence is then encoded once.

    The pipeline's fast path for word-level distances over pools that repeat corpus sentences:
    ``encode_words`` tokenises per call (about half the cost of scoring a pool), this tokenises
    each distinct text once per run. Codes are ranked by token frequency (the most frequent token
    gets code 0), so they do not depend on the order texts arrive in, and frequent tokens get
    small code points (compact strings). Tokens ranked beyond the code space (about 1.1 million
    distinct tokens) share codes by hash; two such rare tokens can then compare equal, which can
    only lower a distance, and only in corpora with that many distinct tokens.
    """

    def __init__(self, texts) -> None:
        counts: dict[str, int] = {}
        findall = _WORD_RE.findall
        for text in texts:
            for tok in findall(text):
                counts[tok] = counts.get(tok, 0) + 1
        ranked = sorted(counts, key=lambda t: (-counts[t], t))
        self.table = {tok: _code(i) for i, tok in enumerate(ranked[: _MAX_CODES - 65536])}
        self.size = len(counts)

    def _code_of(self, tok: str) -> str:
        ch = self.table.get(tok)
        if ch is None:  # beyond the ranked codes, or unseen at fit time: the hashed tail
            ch = _code(_MAX_CODES - 65536 + (hash_token(tok) & 0xFFFF))
        return ch

    def encode(self, texts) -> list[str]:
        """Each text as a string with one character per word token (see ``tokenize_words``)."""
        code = self._code_of
        findall = _WORD_RE.findall
        return ["".join([code(tok) for tok in findall(t)]) for t in texts]


def hash_token(tok: str) -> int:
    """A hash of a token that is stable across processes (``hash()`` of a str is salted)."""
    import zlib

    return zlib.crc32(tok.encode("utf-8"))


def encoded_distances(
    anchors: Sequence[str],
    candidates: Sequence[str],
    normalized: bool = True,
    workers: int = -1,
    metric: EditMetric = "levenshtein",
) -> np.ndarray:
    """``pair_distances`` over texts already encoded (``WordCodes.encode``, or raw text for
    character level): no tokenising, one ``cpdist`` call. Shape ``(n,)``."""
    if len(anchors) != len(candidates):
        raise ValueError(
            f"anchors and candidates must be aligned, got {len(anchors)} and {len(candidates)}"
        )
    if not len(anchors):
        return np.empty(0, dtype=_dtype(normalized))
    scorer = _scorer(metric, normalized)
    out = process.cpdist(
        anchors, candidates, scorer=scorer, dtype=_dtype(normalized), workers=workers
    )
    return out.reshape(len(anchors))


def _scorer(metric: EditMetric, normalized: bool):
    if metric == "levenshtein":
        module = Levenshtein
    elif metric == "indel":
        module = Indel
    else:
        raise ValueError(f"metric must be 'levenshtein' or 'indel', got {metric!r}")
    return module.normalized_distance if normalized else module.distance


def _encode(kind: EditKind, *groups: Sequence[str]) -> list:
    if kind == "char":
        return list(groups)
    if kind == "word":
        return encode_words(*groups)
    raise ValueError(f"kind must be 'char' or 'word', got {kind!r}")


def _dtype(normalized: bool) -> type:
    return np.float32 if normalized else np.int32


def pair_distances(
    anchors: Sequence[str],
    candidates: Sequence[str],
    kind: EditKind = "char",
    normalized: bool = True,
    workers: int = -1,
    metric: EditMetric = "levenshtein",
) -> np.ndarray:
    """Distance between ``anchors[i]`` and ``candidates[i]`` for every i (aligned pairs).

    Shape ``(n,)``; float32 in [0, 1] when ``normalized``, else int32 operation counts. This is the
    fast path for large batches: one ``rapidfuzz.process.cpdist`` call over all pairs.
    """
    if len(anchors) != len(candidates):
        raise ValueError(
            f"anchors and candidates must be aligned, got {len(anchors)} and {len(candidates)}"
        )
    scorer = _scorer(metric, normalized)
    a, c = _encode(kind, anchors, candidates)
    out = process.cpdist(a, c, scorer=scorer, dtype=_dtype(normalized), workers=workers)
    return out.reshape(len(anchors))


def cross_distances(
    anchors: Sequence[str],
    candidates: Sequence[str],
    kind: EditKind = "char",
    normalized: bool = True,
    workers: int = -1,
    metric: EditMetric = "levenshtein",
) -> np.ndarray:
    """Distance between every anchor and every candidate, shape ``(n_anchors, n_candidates)``.

    For one anchor against its own candidate list, pass ``[anchor]``: the anchor's bit-parallel
    pattern is built once and reused across the candidates.
    """
    scorer = _scorer(metric, normalized)
    a, c = _encode(kind, anchors, candidates)
    return process.cdist(a, c, scorer=scorer, dtype=_dtype(normalized), workers=workers)


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

    ``candidates`` holds the pools back to back; pool ``i`` is
    ``candidates[offsets[i]:offsets[i + 1]]`` and belongs to ``anchors[i]``
    (``len(offsets) == len(anchors) + 1``). The output lines up with ``candidates``, ready for
    ``ipw.negative_probs(edit, cos, offsets)``.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    if offsets.ndim != 1 or offsets.size != len(anchors) + 1:
        raise ValueError(
            f"offsets must have len(anchors) + 1 = {len(anchors) + 1} entries, got shape {offsets.shape}"
        )
    if offsets[0] != 0 or offsets[-1] != len(candidates) or np.any(np.diff(offsets) < 0):
        raise ValueError(
            f"offsets must rise from 0 to len(candidates) = {len(candidates)}, "
            f"got {offsets[0]} .. {offsets[-1]}"
        )
    scorer = _scorer(metric, normalized)
    # Encode each anchor once (word kind tokenises), then repeat it per candidate of its pool.
    a, c = _encode(kind, anchors, candidates)
    items = np.empty(len(a), dtype=object)  # not np.asarray: equal-length id lists would go 2-D
    for i, item in enumerate(a):
        items[i] = item
    repeated = np.repeat(items, np.diff(offsets))  # (N,)
    out = process.cpdist(repeated, c, scorer=scorer, dtype=_dtype(normalized), workers=workers)
    return out.reshape(len(candidates))
