"""The numba kernels equal rapidfuzz exactly (property tests over int sequences and strings,
lengths around the 64-symbol word boundaries and beyond BLOCK_MAX), and the scorer behind the
sample stage gives the same distances on both backends, or falls back with a warning."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pairforge.stages.sample.edits as edits
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pairforge.stages.sample.edits import EditCodes, code_distances, edit_scorer, numba_unavailable
from rapidfuzz.distance import Indel, Levenshtein

from tests.stages.sample.edit_oracle import tokenize_words

# numba is a required dependency (pyproject.toml). A machine where the kernels do not compile
# skips these tests, saying why; CI (which sets CI) runs them, so there they fail instead.
NUMBA_ERROR = numba_unavailable()
pytestmark = pytest.mark.skipif(
    NUMBA_ERROR is not None and not os.environ.get("CI"),
    reason=f"numba backend unavailable: {NUMBA_ERROR}",
)


def test_the_kernels_compile():
    assert NUMBA_ERROR is None, NUMBA_ERROR


MODULES = {"levenshtein": Levenshtein, "indel": Indel}
# Lengths around the word boundaries of the bit-parallel kernels (64, 128, 192 symbols).
LENGTHS = st.one_of(
    st.integers(0, 8),
    st.sampled_from([63, 64, 65, 127, 128, 129, 130, 191, 192, 193, 250]),
    st.integers(0, 300),
)
# Small alphabets repeat symbols (many matches); large ones go through the hash table.
ALPHABETS = st.sampled_from([1, 2, 4, 30, 70_000, 2**31 - 1])


def _edited(rng: np.random.Generator, seq: list[int], alphabet: int) -> list[int]:
    """``seq`` with a few random insertions, deletions and substitutions (shared affixes)."""
    out = list(seq)
    for _ in range(int(rng.integers(0, 7))):
        i = int(rng.integers(0, len(out) + 1))
        sym = int(rng.integers(0, alphabet))
        op = rng.integers(3)
        if op == 0:
            out.insert(i, sym)
        elif i < len(out):
            if op == 1:
                del out[i]
            else:
                out[i] = sym
    return out


@st.composite
def pairs(draw) -> list[tuple[list[int], list[int]]]:
    """Up to 6 pairs; hypothesis picks lengths, alphabets and whether b is an edit of a (and
    shrinks them), a drawn seed fills in the symbols (fast to generate)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    out = []
    for _ in range(draw(st.integers(1, 6))):
        alphabet = draw(ALPHABETS)
        a = rng.integers(0, alphabet, draw(LENGTHS)).tolist()
        if draw(st.booleans()):
            b = _edited(rng, a, alphabet)
        else:
            b = rng.integers(0, alphabet, draw(LENGTHS)).tolist()
        out.append((a, b))
    return out


def _codes(seqs: list[list[int]]) -> EditCodes:
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64)
    flat = np.array([x for s in seqs for x in s], dtype=np.int64).astype(np.int32)
    return EditCodes(flat, offsets)


def _check(seqs_a, seqs_b, threads: int = -1) -> None:
    a, b = _codes(seqs_a), _codes(seqs_b)
    rows = np.arange(len(seqs_a))
    other = rows[::-1].copy()  # pair a[i] with b[n-1-i]: different rows on each side
    for metric, module in MODULES.items():
        want_raw = [module.distance(seqs_a[i], seqs_b[j]) for i, j in zip(rows, other, strict=True)]
        want_norm = [
            module.normalized_distance(seqs_a[i], seqs_b[j])
            for i, j in zip(rows, other, strict=True)
        ]
        raw = code_distances(a, rows, b, other, False, metric, threads)
        norm = code_distances(a, rows, b, other, True, metric, threads)
        assert raw.dtype == np.int32 and norm.dtype == np.float32
        assert raw.tolist() == want_raw, metric
        np.testing.assert_array_equal(norm, np.array(want_norm, dtype=np.float32), metric)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pairs())
def test_int_sequences_equal_rapidfuzz(pair_list):
    _check([a for a, _ in pair_list], [b for _, b in pair_list])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=150), st.text(max_size=150)), min_size=1, max_size=5))
def test_strings_equal_rapidfuzz(text_pairs):
    a = [x for x, _ in text_pairs]
    b = [y for _, y in text_pairs]
    ca, cb = EditCodes.from_strings(a), EditCodes.from_strings(b)
    rows = np.arange(len(a))
    for metric, module in MODULES.items():
        got = code_distances(ca, rows, cb, rows, True, metric)
        want = np.array([module.normalized_distance(x, y) for x, y in text_pairs], np.float32)
        np.testing.assert_array_equal(got, want)
        raw = code_distances(ca, rows, cb, rows, False, metric)
        assert raw.tolist() == [module.distance(x, y) for x, y in text_pairs]


def test_named_cases():
    cases = [
        ([], []),  # empty/empty: distance 0, normalised 0 (rapidfuzz's convention)
        ([], [1, 2, 3]),
        ([5] * 64, [5] * 63),
        ([5] * 65, [5] * 64 + [6]),
        (list(range(64)), list(range(1, 65))),
        (list(range(130)), list(range(129, -1, -1))),
        ([7] * 200, [7, 8] * 100),
        ([1, 2, 3, 4], [1, 2, 3, 4]),
    ]
    seqs_a = [a for a, _ in cases]
    seqs_b = [b for _, b in cases]
    _check(seqs_a, seqs_b[::-1])  # _check pairs a[i] with b[n-1-i]
    _check(seqs_a, seqs_b[::-1], threads=1)


def test_beyond_block_max_uses_the_dp_and_still_agrees():
    from pairforge.stages.sample.edit_kernels import BLOCK_MAX

    rng = np.random.default_rng(0)
    a = rng.integers(0, 5, BLOCK_MAX + 3).tolist()
    b = a[:100] + rng.integers(0, 5, 50).tolist() + a[140:]
    _check([a, b[:70]], [b, a[:4000]])


def test_many_pairs_threads_and_row_checks():
    rng = np.random.default_rng(1)
    seqs = [rng.integers(0, 50, rng.integers(0, 140)).tolist() for _ in range(400)]
    codes = _codes(seqs)
    # Above edits._PARALLEL_MIN_PAIRS: the calls below run on several threads and chunks.
    a = rng.integers(0, 400, 40_000)
    b = rng.integers(0, 400, 40_000)
    want = [Levenshtein.normalized_distance(seqs[i], seqs[j]) for i, j in zip(a, b, strict=True)]
    for threads in (-1, 1, 2, 64):
        got = code_distances(codes, a, codes, b, threads=threads)
        np.testing.assert_array_equal(got, np.array(want, np.float32))
    assert code_distances(codes, a[:0], codes, b[:0]).shape == (0,)
    with pytest.raises(ValueError, match="aligned"):
        code_distances(codes, a, codes, b[:3])
    with pytest.raises(IndexError, match="b_rows must lie in"):
        code_distances(codes, a[:1], codes, np.array([400]))
    with pytest.raises(ValueError, match="metric"):
        code_distances(codes, a, codes, b, metric="hamming")


def test_from_strings_one_code_per_code_point():
    codes = EditCodes.from_strings(["ab", "", "東京🙂", "a\ud800b"], chunk=2)  # a lone surrogate
    assert codes.offsets.tolist() == [0, 2, 2, 5, 8]
    assert codes.codes.tolist() == [97, 98, 0x6771, 0x4EAC, 0x1F642, 97, 0xD800, 98]
    assert codes.max_len == 3 and len(codes) == 4
    arrow = EditCodes.from_strings(pa.array(["ab", "", "東京🙂"]))
    assert arrow.codes.tolist() == codes.codes[:5].tolist()
    with pytest.raises(ValueError, match="offsets"):
        EditCodes(np.zeros(3, np.int32), np.array([0, 2]))


CORPUS = [
    "The cat sat on the mat.",
    "the dog sat on a mat!",
    "Über naïve 東京 cats, quickly.",
    "A cat; a dog; the end",
    "",
    "x " * 80,
]
CANDS = ["The cat sat on a mat.", "", "a dog; the cat; the end", "x " * 79 + "y"]


@pytest.mark.parametrize("kind", ["word", "char"])
@pytest.mark.parametrize("normalized", [True, False])
@pytest.mark.parametrize("metric", ["levenshtein", "indel"])
def test_scorer_backends_agree(kind, normalized, metric):
    corpus, cands = pa.array(CORPUS), pa.array(CANDS)
    fast = edit_scorer(corpus, cands, kind, normalized, metric, "numba", 1)
    ref = edit_scorer(corpus, cands, kind, normalized, metric, "rapidfuzz", 1)
    assert (fast.backend, ref.backend) == ("numba", "rapidfuzz")
    rng = np.random.default_rng(2)
    a, b, c = (rng.integers(0, n, 60) for n in (len(CORPUS), len(CORPUS), len(CANDS)))
    np.testing.assert_array_equal(fast.corpus(a, b), ref.corpus(a, b))
    np.testing.assert_array_equal(fast.candidates(a, c), ref.candidates(a, c))
    unit = tokenize_words if kind == "word" else (lambda s: s)
    module = MODULES[metric]
    fn = module.normalized_distance if normalized else module.distance
    want = [fn(unit(CORPUS[i]), unit(CANDS[j])) for i, j in zip(a, c, strict=True)]
    np.testing.assert_allclose(fast.candidates(a, c), want, atol=1e-6)


def test_missing_numba_falls_back_with_a_warning(monkeypatch, caplog):
    reason = "ModuleNotFoundError: No module named 'numba'"
    monkeypatch.setattr(edits, "_NUMBA_STATUS", {"reason": reason, "seconds": 0.0, "cache": None})
    with caplog.at_level(logging.WARNING, logger="pairforge"):
        scorer = edit_scorer(pa.array(CORPUS), pa.array(CANDS))
    assert scorer.backend == "rapidfuzz"
    assert scorer.kernels is None and scorer.compile_seconds is None
    assert "numba backend is unavailable (ModuleNotFoundError" in caplog.text
    codes = EditCodes.from_strings(["ab"])
    with pytest.raises(RuntimeError, match="numba edit-distance backend is unavailable"):
        code_distances(codes, [0], codes, [0])
    with pytest.raises(ValueError, match="backend"):
        edit_scorer(pa.array(CORPUS), pa.array(CANDS), backend="cuda")


# One process of the test below: prepare the kernels, then score with read-only row indices
# (as the sample stage passes them from Arrow), and say what numba did.
_KERNEL_PROCESS = """
import json, numpy as np
from pairforge.stages.sample.edits import EditCodes, code_distances, numba_kernels
from pairforge.stages.sample.edit_kernels import pair_kernel
facts = numba_kernels()
codes = EditCodes.from_strings(["kitten", "sitting", "flaw", "lawn"])
rows = np.arange(4)
other = rows[::-1].copy()
other.flags.writeable = False
got = code_distances(codes, rows, codes, other, normalized=False).tolist()
stats = pair_kernel.stats
print(json.dumps({**facts, "got": got, "signatures": len(pair_kernel.signatures),
                  "hits": sum(stats.cache_hits.values()),
                  "misses": sum(stats.cache_misses.values()), "path": stats.cache_path}))
"""


@pytest.mark.slow
def test_kernels_compile_once_and_later_processes_load_them(tmp_path):
    """A fresh cache compiles one specialisation (read-only inputs accepted without a second
    compilation); a second process loads it from the cache instead of compiling."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    runs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", _KERNEL_PROCESS],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    first, second = runs
    words = ["kitten", "sitting", "flaw", "lawn"]
    want = [Levenshtein.distance(a, b) for a, b in zip(words, words[::-1], strict=True)]
    assert first["got"] == second["got"] == want
    assert (first["cache"], first["hits"], first["misses"]) == ("compiled", 0, 1)
    assert (second["cache"], second["hits"], second["misses"]) == ("loaded", 1, 0)
    assert first["signatures"] == second["signatures"] == 1
    assert Path(first["path"]).is_relative_to(tmp_path / "numba")
    saved = sorted(p.name for p in (tmp_path / "numba").rglob("edit_kernels.pair_kernel-*"))
    assert [n.rsplit(".", 1)[-1] for n in saved] == ["nbc", "nbi"], saved
