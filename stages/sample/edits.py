"""Edit distances between anchors and their candidates, as the ``sample`` stage scores them:
compiled numba kernels over texts encoded once (the default backend), or rapidfuzz over the
same encoded texts.

This is the ``edit(x_i, x_j)`` of DebCSE eq. 1. The paper says only "edit distance" (citing
Ristad & Yianilos' string-edit distance); it names neither the unit nor a normalisation, so both
are parameters of :func:`edit_scorer`:

- ``kind="char"`` compares characters, ``kind="word"`` compares word tokens (runs of word
  characters, and each punctuation mark on its own, case kept: ``_WORD_RE``).
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

Unit: the stage defaults to **words** (``WordCodes`` codes, each text encoded once per run).
Characters need no tokeniser and mean the same across corpora, but the surface similarity DebCSE
wants in a hard negative is shared wording, which its own diagnostic counts in words (Tables 1
and 4), a changed word then counts once instead of once per letter, and short code sequences
score several times faster than characters (benchmarks/edit_throughput.py).

**Backends.** ``edit_scorer``'s default backend, ``numba``, encodes each distinct sentence once
into integer codes (``EditCodes``: one flat int32 array and int64 offsets; word codes from
``WordCodes``, or code points) and scores pairs given as row-index arrays with the compiled
bit-parallel kernels of ``edit_kernels.py``: no Python object per pair, which is what bounds
rapidfuzz's ``cpdist`` (~150 ns per pair to convert two strings, under the GIL). Its results equal
rapidfuzz's exactly (property-tested). When numba is missing or fails to compile, ``edit_scorer``
logs a warning and uses rapidfuzz over the encoded texts (``encoded_distances``;
``backend="rapidfuzz"`` asks for it directly). The kernels compile once per machine and numba
caches them on disk; each process loads them before its first scoring call (``numba_kernels``),
so compilation never counts in a measured throughput.

The reference both backends are tested against, rapidfuzz over plain strings
(``pair_distances``, ``pool_distances``, ...), lives with the tests as their oracle
(``tests/stages/sample/edit_oracle.py``): this module holds only what the stage runs.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from typing import Any, Literal, Protocol

import numpy as np
import pyarrow as pa
from rapidfuzz import process
from rapidfuzz.distance import Indel, Levenshtein

__all__ = [
    "EditBackend",
    "EditCodes",
    "EditKind",
    "EditMetric",
    "PairScorer",
    "WordCodes",
    "code_distances",
    "edit_scorer",
    "encoded_distances",
    "numba_kernels",
    "numba_unavailable",
]

EditKind = Literal["char", "word"]
EditMetric = Literal["levenshtein", "indel"]
EditBackend = Literal["numba", "rapidfuzz"]

log = logging.getLogger("pairforge")

_WORD_RE = re.compile(r"\w+|[^\w\s]")

# Code points available to stand for word ids: all of Unicode except the surrogate block, which
# cannot be encoded and which some string routines reject.
_SURROGATES = (0xD800, 0xE000)
_MAX_CODES = 0x110000 - (_SURROGATES[1] - _SURROGATES[0])


def _code(i: int) -> str:
    return chr(i if i < _SURROGATES[0] else i + (_SURROGATES[1] - _SURROGATES[0]))


class WordCodes:
    """A word vocabulary fitted once over a corpus; each sentence is then encoded once.

    The pipeline's fast path for word-level distances over pools that repeat corpus sentences:
    tokenising per call (the tests' ``edit_oracle.encode_words``) is about half the cost of
    scoring a pool; this tokenises each distinct text once per run. Codes are ranked by token
    frequency (the most frequent token gets code 0), so they do not depend on the order texts
    arrive in, and frequent tokens get small code points (compact strings). Tokens ranked beyond
    the code space (about 1.1 million distinct tokens) share codes by hash; two such rare tokens
    can then compare equal, which can only lower a distance, and only in corpora with that many
    distinct tokens.
    """

    def __init__(self, texts: Sequence[str] | pa.Array) -> None:
        self._fit([texts])

    @classmethod
    def fit_codes(cls, *groups: Sequence[str] | pa.Array) -> tuple[WordCodes, list[EditCodes]]:
        """Fit the vocabulary over all ``groups`` and return each group's integer codes, from
        one tokenising pass (``WordCodes(all texts)`` then ``codes(group)`` tokenises twice)."""
        words = cls.__new__(cls)
        return words, words._fit(groups)

    def _fit(self, groups) -> list[EditCodes]:
        # Tokens get provisional ids in order of first sight (C-speed map over each chunk's
        # tokens); counting, ranking and the final codes then work on those ids.
        vocab = _FirstSeen()
        tokens_of = vocab.__getitem__
        parts = []
        for texts in groups:
            chunks = []
            for tokens, sep in _token_chunks(texts):
                ids = np.fromiter(map(tokens_of, tokens), np.int64, len(tokens))
                cut = ids == vocab[sep]
                bounds = np.concatenate([[-1], np.flatnonzero(cut), [ids.size]])
                chunks.append((ids[~cut].astype(np.int32), np.diff(bounds) - 1))
            parts.append(chunks)
        seen = [ids for chunks in parts for ids, _ in chunks]
        counts = np.bincount(np.concatenate(seen), minlength=len(vocab)) if seen else np.zeros(0)
        tokens = list(vocab)  # by provisional id
        ranked = sorted(np.flatnonzero(counts).tolist(), key=lambda i: (-counts[i], tokens[i]))
        limit = _MAX_CODES - 65536
        self.table = {tokens[i]: _code(r) for r, i in enumerate(ranked[:limit])}
        self.size = len(ranked)
        self._ids: _TokenIds | None = None
        # Provisional id -> the code point of the token's code (as ``encode`` writes it).
        points = np.zeros(len(tokens), dtype=np.int32)
        head = np.asarray(ranked[:limit], dtype=np.int64)
        rank = np.arange(head.size)
        points[head] = rank + np.where(rank >= _SURROGATES[0], _SURROGATES[1] - _SURROGATES[0], 0)
        for i in ranked[limit:]:
            points[i] = ord(self._code_of(tokens[i]))
        out = []
        for chunks in parts:
            lengths = np.concatenate([n for _, n in chunks]) if chunks else np.empty(0, np.int64)
            offsets = np.zeros(lengths.size + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            flat = np.concatenate([ids for ids, _ in chunks]) if chunks else np.empty(0, np.int32)
            out.append(EditCodes(points[flat], offsets))
        return out

    def _code_of(self, tok: str) -> str:
        ch = self.table.get(tok)
        if ch is None:  # beyond the ranked codes, or unseen at fit time: the hashed tail
            ch = _code(_MAX_CODES - 65536 + (hash_token(tok) & 0xFFFF))
        return ch

    def encode(self, texts) -> list[str]:
        """Each text as a string with one character per word token (``_WORD_RE``'s tokens)."""
        code = self._code_of
        findall = _WORD_RE.findall
        return ["".join([code(tok) for tok in findall(t)]) for t in texts]

    def codes(self, texts: Sequence[str] | pa.Array) -> EditCodes:
        """Each text as integer codes for the compiled kernels: the code points of ``encode``'s
        characters (so both backends see the same symbols), without building those strings."""
        if self._ids is None:
            self._ids = _TokenIds((tok, ord(ch)) for tok, ch in self.table.items())
        ids = self._ids
        parts, lengths = [], []
        for tokens, sep in _token_chunks(texts):
            saved = ids.pop(sep, None)  # "\uffff" can be a real token of other chunks
            ids[sep] = -1  # the separator between texts
            flat = np.fromiter(map(ids.__getitem__, tokens), np.int64, len(tokens))
            del ids[sep]
            if saved is not None:
                ids[sep] = saved
            cuts = np.flatnonzero(flat < 0)
            bounds = np.concatenate([[-1], cuts, [flat.size]])
            lengths.append(np.diff(bounds) - 1)  # tokens between consecutive separators
            parts.append(flat[flat >= 0].astype(np.int32))
        lens = np.concatenate(lengths) if lengths else np.empty(0, np.int64)
        offsets = np.zeros(lens.size + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        codes = np.concatenate(parts) if parts else np.empty(0, np.int32)
        return EditCodes(codes, offsets)


class _FirstSeen(dict):
    """token -> provisional id, the next integer on first sight."""

    def __missing__(self, tok: str) -> int:
        value = self[tok] = len(self)
        return value


class _TokenIds(dict):
    """token -> code point of its ``WordCodes`` code; tokens outside the ranked table get the
    hashed tail, as ``WordCodes._code_of`` gives them (cached on first sight)."""

    def __missing__(self, tok: str) -> int:
        value = self[tok] = ord(_code(_MAX_CODES - 65536 + (hash_token(tok) & 0xFFFF)))
        return value


_SEP = "\uffff"  # a noncharacter: one token of its own under _WORD_RE, never inside a word


def _token_chunks(texts: Sequence[str] | pa.Array, chunk: int = 4096):
    """``(tokens, sep)`` per chunk of texts: the chunk's word tokens with ``sep`` between
    consecutive texts, from one regex call over the joined chunk (per-call overhead dominates
    short sentences). A chunk whose texts contain ``_SEP`` is tokenised text by text, with the
    empty string, never a token, as the separator."""
    findall = _WORD_RE.findall
    for start in range(0, len(texts), chunk):
        part = texts[start : start + chunk]
        if isinstance(part, pa.Array):
            part = part.to_pylist()
        joined = _SEP.join(part)
        if joined.count(_SEP) == max(len(part) - 1, 0):
            yield findall(joined), _SEP
            continue
        tokens: list[str] = []
        for i, text in enumerate(part):
            if i:
                tokens.append("")
            tokens += findall(text)
        yield tokens, ""


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
    """Distance between ``anchors[i]`` and ``candidates[i]`` for every i, texts already encoded
    (``WordCodes.encode``, or raw text for character level): no tokenising, one rapidfuzz
    ``cpdist`` call (``workers``: -1 uses every core, the GIL released). Shape ``(n,)``, float32
    in [0, 1] when ``normalized``, else int32."""
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


def _dtype(normalized: bool) -> type:
    return np.float32 if normalized else np.int32


# --- integer codes and the compiled kernels ----------------------------------------------------


class EditCodes:
    """Sequences of integer symbols, encoded once for the compiled kernels.

    Sequence ``i`` is ``codes[offsets[i]:offsets[i + 1]]`` (``codes``: int32, ``offsets``: int64,
    ``len(offsets) == len(self) + 1``). Pairs then name sequences by row, so scoring them touches
    no Python object.
    """

    __slots__ = ("codes", "offsets", "max_len")

    def __init__(self, codes: np.ndarray, offsets: np.ndarray) -> None:
        self.codes = np.ascontiguousarray(codes, dtype=np.int32)
        self.offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        if (
            self.offsets.ndim != 1
            or self.offsets.size < 1
            or self.offsets[0] != 0
            or self.offsets[-1] != self.codes.size
            or np.any(np.diff(self.offsets) < 0)
        ):
            raise ValueError("offsets must rise from 0 to len(codes)")
        self.max_len = int(np.diff(self.offsets).max()) if self.offsets.size > 1 else 0

    def __len__(self) -> int:
        return self.offsets.size - 1

    @classmethod
    def from_strings(cls, strings: Sequence[str] | pa.Array, chunk: int = 65536) -> EditCodes:
        """One symbol per code point: raw text for character level, or ``WordCodes.encode``
        output for word level (one code point per word, so equal codes mean equal words)."""
        n = len(strings)
        lengths = np.empty(n, dtype=np.int64)
        parts = []
        for start in range(0, n, chunk):
            part = strings[start : start + chunk]
            if isinstance(part, pa.Array):
                part = part.to_pylist()
            lengths[start : start + len(part)] = np.fromiter(map(len, part), np.int64, len(part))
            # One C-level conversion per chunk; surrogatepass keeps any code point as itself.
            parts.append(
                np.frombuffer("".join(part).encode("utf-32-le", "surrogatepass"), dtype=np.int32)
            )
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        codes = np.concatenate(parts) if parts else np.empty(0, dtype=np.int32)
        return cls(codes, offsets)


_NUMBA_STATUS: dict[str, Any] = {}  # memo of numba_unavailable(): reason, seconds, cache


def numba_unavailable() -> str | None:
    """None when the compiled kernels run here; otherwise why not (numba not installed, or the
    kernel failed to compile or to reproduce rapidfuzz on a smoke test). Checked once per process;
    the first call compiles the kernels or loads them from numba's on-disk cache (see
    ``numba_kernels``), so no scoring call ever waits for a compilation."""
    if not _NUMBA_STATUS:
        t0 = time.perf_counter()
        reason, cache, where = None, None, None
        try:
            from pairforge.stages.sample import edit_kernels

            texts = ["kitten", "sitting", "", "x" * 70 + "abc", "abc" + "x" * 70]
            codes = EditCodes.from_strings(texts)
            rows = np.arange(len(texts))
            other = rows[::-1].copy()
            got = code_distances(codes, rows, codes, other, normalized=False, _checked=True)
            want = [
                Levenshtein.distance(texts[i], texts[j]) for i, j in zip(rows, other, strict=True)
            ]
            if got.tolist() != want:
                raise RuntimeError(f"smoke test: got {got.tolist()}, want {want}")
            stats = edit_kernels.pair_kernel.stats
            cache = "loaded" if stats.cache_hits else "compiled"
            where = stats.cache_path
        except Exception as exc:  # ImportError, numba's TypingError/LoweringError, ...
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        seconds = time.perf_counter() - t0
        _NUMBA_STATUS.update(reason=reason, seconds=seconds, cache=cache)
        if cache == "compiled":
            log.info(
                "edit distances: numba kernels compiled in %.1f s, cached in %s for later "
                "processes",
                seconds,
                where,
            )
        elif cache == "loaded":
            log.info("edit distances: numba kernels loaded from %s in %.1f s", where, seconds)
    return _NUMBA_STATUS["reason"]


def numba_kernels() -> dict[str, Any]:
    """How this process got the compiled kernels: ``cache`` is ``"compiled"`` (nothing usable in
    numba's cache: compiled now and saved there), ``"loaded"`` (from the cache) or None (numba
    unavailable); ``seconds`` is what that took, compilation or loading plus the smoke test.

    numba's cache lives in ``$NUMBA_CACHE_DIR`` when set, else in the ``__pycache__`` beside
    ``edit_kernels.py`` (an editable install: the repository; a wheel: site-packages) when that
    is writable, else in the user's cache folder (``~/.cache/numba``). An entry is keyed by the
    source's content hash, the signature and the CPU, so a fresh install compiles once (the
    first ``sample``) and every later process loads the compiled kernel.
    """
    numba_unavailable()
    return {"cache": _NUMBA_STATUS["cache"], "seconds": _NUMBA_STATUS["seconds"]}


_PARALLEL_MIN_PAIRS = 16384  # fewer pairs are scored on the calling thread alone


def _numba_threads(threads: int) -> int:
    import numba

    most = numba.config.NUMBA_NUM_THREADS
    return most if threads < 1 else min(threads, most)


def code_distances(
    a: EditCodes,
    a_rows: np.ndarray,
    b: EditCodes,
    b_rows: np.ndarray,
    normalized: bool = True,
    metric: EditMetric = "levenshtein",
    threads: int = -1,
    _checked: bool = False,
) -> np.ndarray:
    """Distance between sequence ``a_rows[p]`` of ``a`` and ``b_rows[p]`` of ``b`` for every p,
    with the compiled kernels; equal to rapidfuzz's ``Levenshtein``/``Indel`` ``distance`` (int32)
    or ``normalized_distance`` (float32). Shape ``(n,)``. ``threads``: -1 (or 0) uses every core.

    Raises ``RuntimeError`` saying why when numba cannot be used (see ``numba_unavailable``).
    """
    if metric not in ("levenshtein", "indel"):
        raise ValueError(f"metric must be 'levenshtein' or 'indel', got {metric!r}")
    a_rows = np.ascontiguousarray(a_rows, dtype=np.int64)
    b_rows = np.ascontiguousarray(b_rows, dtype=np.int64)
    if a_rows.shape != b_rows.shape or a_rows.ndim != 1:
        raise ValueError(
            f"a_rows and b_rows must be aligned 1-d arrays, got {a_rows.shape} and {b_rows.shape}"
        )
    for rows, codes, name in ((a_rows, a, "a_rows"), (b_rows, b, "b_rows")):
        if rows.size and (rows.min() < 0 or rows.max() >= len(codes)):
            raise IndexError(f"{name} must lie in [0, {len(codes)})")
    if not _checked:
        reason = numba_unavailable()
        if reason is not None:
            raise RuntimeError(f"the numba edit-distance backend is unavailable: {reason}")
    import numba
    from pairforge.stages.sample.edit_kernels import pair_kernel

    n = a_rows.size
    out_int = np.empty(0 if normalized else n, dtype=np.int32)
    out_float = np.empty(n if normalized else 0, dtype=np.float32)
    if n:
        before = numba.get_num_threads()
        # Waking numba's worker threads costs up to a scheduler slice: more than a small call's
        # whole work.
        n_threads = _numba_threads(threads) if n >= _PARALLEL_MIN_PAIRS else 1
        numba.set_num_threads(n_threads)
        try:
            pair_kernel(
                a.codes,
                a.offsets,
                a_rows,
                b.codes,
                b.offsets,
                b_rows,
                metric == "indel",
                normalized,
                max(a.max_len, b.max_len),
                n_threads,
                out_int,
                out_float,
            )
        finally:
            numba.set_num_threads(before)
    return out_float if normalized else out_int


# --- the sample stage's scorer: corpus rows against corpus rows or candidate rows --------------


class PairScorer(Protocol):
    """Edit distances between sequences encoded once per run, named by row.

    ``corpus(a, b)[p]``: corpus row ``a[p]`` against corpus row ``b[p]`` (negative pools);
    ``candidates(a, c)[p]``: corpus row ``a[p]`` against candidate row ``c[p]`` (positive
    pools). float32 in [0, 1] when normalised, else int32.
    """

    backend: str
    encode_seconds: float
    # numba: the wait for the kernels in this call (0 when this process already had them) and
    # how the process got them (``numba_kernels``); None for rapidfuzz.
    compile_seconds: float | None
    kernels: str | None

    def corpus(self, a_rows: np.ndarray, b_rows: np.ndarray) -> np.ndarray: ...

    def candidates(self, a_rows: np.ndarray, c_rows: np.ndarray) -> np.ndarray: ...


class _NumbaScorer:
    backend = "numba"
    compile_seconds: float | None = None
    kernels: str | None = None

    def __init__(self, corpus, candidates, normalized, metric, threads, encode_seconds):
        self.codes = (corpus, candidates)
        self.kw = dict(normalized=normalized, metric=metric, threads=threads, _checked=True)
        self.encode_seconds = encode_seconds

    def corpus(self, a_rows: np.ndarray, b_rows: np.ndarray) -> np.ndarray:
        return code_distances(self.codes[0], a_rows, self.codes[0], b_rows, **self.kw)

    def candidates(self, a_rows: np.ndarray, c_rows: np.ndarray) -> np.ndarray:
        return code_distances(self.codes[0], a_rows, self.codes[1], c_rows, **self.kw)


def _gather(strings: pa.Array, rows: np.ndarray) -> list[str]:
    """``strings[rows]`` as a list of Python strings, each distinct row converted once (pools
    repeat corpus sentences: the list then holds references, not copies)."""
    uniq, inverse = np.unique(rows, return_inverse=True)
    objs = np.empty(len(uniq), dtype=object)
    objs[:] = strings.take(pa.array(uniq)).to_pylist()
    return objs[inverse].tolist()


class _RapidfuzzScorer:
    backend = "rapidfuzz"
    compile_seconds: float | None = None
    kernels: str | None = None

    def __init__(self, corpus, candidates, normalized, metric, threads, encode_seconds):
        self.strings = (corpus, candidates)
        self.args = (normalized, threads, metric)
        self.encode_seconds = encode_seconds

    def corpus(self, a_rows: np.ndarray, b_rows: np.ndarray) -> np.ndarray:
        strings = self.strings[0]
        return encoded_distances(_gather(strings, a_rows), _gather(strings, b_rows), *self.args)

    def candidates(self, a_rows: np.ndarray, c_rows: np.ndarray) -> np.ndarray:
        a = _gather(self.strings[0], a_rows)
        return encoded_distances(a, _gather(self.strings[1], c_rows), *self.args)


def edit_scorer(
    corpus: pa.Array,
    candidates: pa.Array,
    kind: EditKind = "word",
    normalized: bool = True,
    metric: EditMetric = "levenshtein",
    backend: EditBackend = "numba",
    threads: int = -1,
) -> PairScorer:
    """Encode the corpus and the candidate texts once (word codes fitted over both, or
    characters) and return the ``PairScorer`` of ``backend``. ``numba`` falls back to
    ``rapidfuzz`` with a logged warning when it cannot run here; the distances are the same."""
    if kind not in ("char", "word"):
        raise ValueError(f"kind must be 'char' or 'word', got {kind!r}")
    if metric not in ("levenshtein", "indel"):
        raise ValueError(f"metric must be 'levenshtein' or 'indel', got {metric!r}")
    if backend not in ("numba", "rapidfuzz"):
        raise ValueError(f"backend must be 'numba' or 'rapidfuzz', got {backend!r}")
    compile_seconds = None
    if backend == "numba":
        t0 = time.perf_counter()
        reason = numba_unavailable()
        compile_seconds = time.perf_counter() - t0
        if reason is not None:
            log.warning(
                "edit distances: the numba backend is unavailable (%s); using rapidfuzz, "
                "the same distances, slower",
                reason,
            )
            backend = "rapidfuzz"
    t0 = time.perf_counter()
    if backend == "numba" and kind == "word":
        _, (a, c) = WordCodes.fit_codes(corpus, candidates)
    elif backend == "numba":
        a, c = EditCodes.from_strings(corpus), EditCodes.from_strings(candidates)
    elif kind == "word":
        words = WordCodes(pa.chunked_array([corpus, candidates], pa.string()).combine_chunks())
        a = pa.array(words.encode(corpus.to_pylist()), pa.string())
        c = pa.array(words.encode(candidates.to_pylist()), pa.string())
    else:
        a, c = corpus, candidates
    cls: type = _NumbaScorer if backend == "numba" else _RapidfuzzScorer
    scorer = cls(a, c, normalized, metric, threads, time.perf_counter() - t0)
    scorer.compile_seconds = compile_seconds if backend == "numba" else None
    scorer.kernels = numba_kernels()["cache"] if backend == "numba" else None
    return scorer
