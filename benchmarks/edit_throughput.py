"""Edit-distance throughput of the ``sample`` stage: the numba kernels vs rapidfuzz vs a Python loop.

    python benchmarks/edit_throughput.py [--pairs 2000000] [--workers -1] [--repeats 3] \
        [--corpus synthetic|real]

Builds synthetic English-like sentences of about 120 characters (Zipf-distributed vocabulary),
50,000 of them plus a lightly edited copy of each (100,000 texts: the corpus), and pairs each
anchor half of the time with an unrelated sentence (a negative-pool candidate) and half of the
time with its edited copy (a paraphrase-like positive candidate), pairs grouped by anchor as the
``sample`` stage scores its pools. ``--corpus real`` takes the texts instead from the mining
benchmark's corpus (``benchmarks/mine.py``: the Wikipedia and SNLI sentences of
``$PAIRFORGE_SHARED_DATA``, then perturbed copies up to 100,000), each anchor paired with random
corpus sentences and, half of the time, with its perturbed copy or origin. Then, in one run,
times:

- baseline: a Python loop of ``Levenshtein.normalized_distance`` over every pair (characters);
- rapidfuzz ``cpdist`` over Python strings: characters (``pair_distances``, the tests'
  reference in ``tests/stages/sample/edit_oracle.py``), and words pre-encoded with ``WordCodes``
  (``encoded_distances``, the stage's ``edit_backend: rapidfuzz``);
- the numba kernels (``code_distances``) over texts encoded once (``EditCodes``), pairs given as
  row-index arrays, words (the stage's default path) and characters.

Pairs/s exclude the one-time per-sentence encoding, as the stage encodes each distinct sentence
once per run and reuses it across all pairs (pools repeat corpus sentences); the encoding costs
are printed separately, and the default path's rate including them. Every numba row is checked
equal to its rapidfuzz counterpart. Prints the 1-minute load average before and after: the
numbers depend on the machine's cores and on what else runs on them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from pairforge.stages.sample.edits import (
    EditCodes,
    WordCodes,
    code_distances,
    encoded_distances,
    numba_unavailable,
)
from rapidfuzz.distance import Levenshtein

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.stages.sample.edit_oracle import pair_distances  # noqa: E402  (the string reference)

TARGET = 3_000_000  # pairs/s, the stage's default path: word-level normalised Levenshtein


def _vocabulary(rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    freq = 1.0 / np.arange(1, 27) ** 0.8
    lengths = np.clip(rng.poisson(4.5, size), 1, 14)
    words = np.array(["".join(rng.choice(letters, n, p=freq / freq.sum())) for n in lengths])
    zipf = 1.0 / np.arange(1, size + 1)
    return words, zipf / zipf.sum()


def _sentences(
    rng: np.random.Generator, words: np.ndarray, p: np.ndarray, n: int
) -> list[list[str]]:
    """``n`` token lists of 100-140 characters, words drawn from the Zipf distribution ``p``."""
    stream = words[rng.choice(words.size, size=n * 40, p=p)].tolist()
    targets = rng.integers(100, 141, n)
    out: list[list[str]] = []
    pos = 0
    for target in targets:
        tokens: list[str] = []
        length = -1
        while length < target:
            w = stream[pos]
            pos += 1
            tokens.append(w)
            length += len(w) + 1
        out.append(tokens)
    return out


def _perturb(rng: np.random.Generator, tokens: list[str], words: np.ndarray) -> str:
    tokens = list(tokens)
    for _ in range(rng.integers(1, 5)):
        op = rng.integers(3)
        i = int(rng.integers(len(tokens)))
        if op == 0:
            tokens[i] = str(words[rng.integers(words.size)])
        elif op == 1 and len(tokens) > 2:
            del tokens[i]
        else:
            tokens.insert(i, str(words[rng.integers(words.size)]))
    return " ".join(tokens)


def make_corpus(
    n_pairs: int, seed: int, n_unique: int = 50_000
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """A corpus of ``2 * n_unique`` texts (sentences, then their edited copies) and ``n_pairs``
    (anchor row, candidate row) pairs over it, grouped by anchor as the stage scores its pools
    (each anchor's candidates together; the candidates are random rows)."""
    rng = np.random.default_rng(seed)
    words, p = _vocabulary(rng, 20_000)
    tokens = _sentences(rng, words, p, n_unique)
    corpus = [" ".join(t) for t in tokens] + [_perturb(rng, t, words) for t in tokens]
    a_idx = np.sort(rng.integers(0, n_unique, n_pairs))  # grouped by anchor, as pools are
    b_idx = rng.integers(0, n_unique, n_pairs)
    related = rng.random(n_pairs) < 0.5
    c_idx = np.where(related, a_idx + n_unique, b_idx)
    return corpus, a_idx, c_idx


def real_corpus(n_pairs: int, seed: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The mining benchmark's 100k real + perturbed sentences, and pairs grouped by anchor:
    a random corpus sentence, or (half of the time) the anchor's perturbed copy or origin."""
    from mine import build_corpus

    corpus, origin = build_corpus(100_000, seed)
    row_of = {t: i for i, t in enumerate(corpus)}
    related = np.arange(len(corpus))
    for i, o in enumerate(origin):
        if o is not None and o in row_of:
            related[i], related[row_of[o]] = row_of[o], i
    rng = np.random.default_rng(seed)
    a_idx = np.sort(rng.integers(0, len(corpus), n_pairs))
    c_idx = np.where(
        rng.random(n_pairs) < 0.5, related[a_idx], rng.integers(0, len(corpus), n_pairs)
    )
    return corpus, a_idx, c_idx


def make_pairs(n_pairs: int, seed: int, n_unique: int = 50_000) -> tuple[list[str], list[str]]:
    """``n_pairs`` (anchor, candidate) string pairs over ``n_unique`` distinct ~120-char sentences."""
    corpus, a_idx, c_idx = make_corpus(n_pairs, seed, n_unique)
    return [corpus[i] for i in a_idx], [corpus[i] for i in c_idx]


def _time(fn: Callable[[], np.ndarray], repeats: int) -> tuple[float, np.ndarray]:
    best = float("inf")
    out = np.empty(0)
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=2_000_000)
    parser.add_argument("--workers", type=int, default=-1, help="rapidfuzz workers, numba threads")
    parser.add_argument("--repeats", type=int, default=3, help="best of N for every fast row")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--corpus", choices=["synthetic", "real"], default="synthetic", help="see the docstring"
    )
    args = parser.parse_args()
    load_before = os.getloadavg()[0]

    t0 = time.perf_counter()
    make = real_corpus if args.corpus == "real" else make_corpus
    corpus, a_idx, c_idx = make(args.pairs, args.seed)
    anchors = [corpus[i] for i in a_idx]  # references into the corpus, as the stage gathers them
    candidates = [corpus[i] for i in c_idx]
    n = args.pairs
    lengths = np.fromiter(map(len, corpus), dtype=np.int64)
    print(
        f"{args.corpus} corpus: {n:,} pairs over {len(corpus):,} texts, mean length "
        f"{lengths.mean():.1f} chars "
        f"(p5 {np.percentile(lengths, 5):.0f}, p95 {np.percentile(lengths, 95):.0f}), "
        f"{os.cpu_count()} CPU cores visible, generated in {time.perf_counter() - t0:.1f} s"
    )

    t0 = time.perf_counter()
    reason = numba_unavailable()  # compiles the kernels, or loads them from numba's cache
    jit_s = time.perf_counter() - t0
    if reason is not None:
        raise SystemExit(f"numba backend unavailable: {reason}")

    # The one-time encodings, as edit_scorer does them (each distinct text once per run).
    t0 = time.perf_counter()
    _, (word_codes,) = WordCodes.fit_codes(corpus)  # numba backend: fit + integer codes
    word_codes_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    word_strings = WordCodes(corpus).encode(corpus)  # rapidfuzz backend: fit + code strings
    word_strings_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    char_codes = EditCodes.from_strings(corpus)
    char_codes_s = time.perf_counter() - t0
    enc_a = [word_strings[i] for i in a_idx]
    enc_c = [word_strings[i] for i in c_idx]

    w, reps = args.workers, args.repeats
    rows: list[tuple[str, float, str | None]] = []  # (label, seconds, rapidfuzz row compared)
    outs: dict[str, np.ndarray] = {}

    def run(key: str, label: str, fn: Callable[[], np.ndarray], same_as: str | None = None):
        t, out = _time(fn, reps if key != "loop" else 1)
        rows.append((label, t, same_as))
        outs[key] = out
        if same_as is not None:
            np.testing.assert_array_equal(out, outs[same_as], err_msg=f"{key} != {same_as}")

    dist = Levenshtein.normalized_distance
    run(
        "loop",
        "Python loop, char Levenshtein.normalized_distance (baseline)",
        lambda: np.array(
            [dist(a, c) for a, c in zip(anchors, candidates, strict=True)], dtype=np.float32
        ),
    )
    run(
        "rf-char",
        f"rapidfuzz cpdist, char, workers={w}",
        lambda: pair_distances(anchors, candidates, workers=w),
    )
    run(
        "rf-char-1",
        "rapidfuzz cpdist, char, workers=1",
        lambda: pair_distances(anchors, candidates, workers=1),
    )
    run(
        "rf-char-indel",
        f"rapidfuzz cpdist, char, Indel, workers={w}",
        lambda: pair_distances(anchors, candidates, workers=w, metric="indel"),
    )
    run(
        "rf-word",
        f"rapidfuzz cpdist, word (WordCodes strings), workers={w} [edit_backend: rapidfuzz]",
        lambda: encoded_distances(enc_a, enc_c, workers=w),
    )
    run(
        "rf-word-indel",
        f"rapidfuzz cpdist, word (WordCodes strings), Indel, workers={w}",
        lambda: encoded_distances(enc_a, enc_c, workers=w, metric="indel"),
    )
    run(
        "nb-word",
        f"numba, word (EditCodes), threads={w} [default path]",
        lambda: code_distances(word_codes, a_idx, word_codes, c_idx, threads=w),
        "rf-word",
    )
    run(
        "nb-word-1",
        "numba, word (EditCodes), threads=1",
        lambda: code_distances(word_codes, a_idx, word_codes, c_idx, threads=1),
        "rf-word",
    )
    run(
        "nb-word-indel",
        f"numba, word (EditCodes), Indel, threads={w}",
        lambda: code_distances(word_codes, a_idx, word_codes, c_idx, metric="indel", threads=w),
        "rf-word-indel",
    )
    run(
        "nb-char",
        f"numba, char (EditCodes), threads={w}",
        lambda: code_distances(char_codes, a_idx, char_codes, c_idx, threads=w),
        "rf-char",
    )
    run(
        "nb-char-1",
        "numba, char (EditCodes), threads=1",
        lambda: code_distances(char_codes, a_idx, char_codes, c_idx, threads=1),
        "rf-char",
    )
    run(
        "nb-char-indel",
        f"numba, char (EditCodes), Indel, threads={w}",
        lambda: code_distances(char_codes, a_idx, char_codes, c_idx, metric="indel", threads=w),
        "rf-char-indel",
    )
    np.testing.assert_allclose(outs["rf-char"], outs["loop"], atol=0, rtol=0)
    load_after = os.getloadavg()[0]

    t_loop = rows[0][1]
    seconds = dict(zip(outs, (t for _, t, _ in rows), strict=True))
    print(
        "\n| method | seconds | pairs/s | vs loop | vs rapidfuzz, same unit |\n|---|---:|---:|---:|---:|"
    )
    for label, t, same_as in rows:
        vs_rf = f"{seconds[same_as] / t:.1f}x" if same_as else ""
        print(f"| {label} | {t:.3f} | {n / t:,.0f} | {t_loop / t:.1f}x | {vs_rf} |")

    default_s = seconds["nb-word"]
    print(
        f"\nOne-time costs, per run (not per pair), for the {len(corpus):,} texts: numba JIT "
        f"compile or cache load {jit_s:.2f} s; word codes: WordCodes.fit_codes (numba backend) "
        f"{word_codes_s:.2f} s, WordCodes fit + encode strings (rapidfuzz backend) "
        f"{word_strings_s:.2f} s; character codes (EditCodes.from_strings) {char_codes_s:.2f} s."
    )
    print(
        f"Default path including its word encoding, {n:,} pairs over {len(corpus):,} texts "
        f"({n / len(corpus):.0f} pairs per text): {n / (default_s + word_codes_s):,.0f} pairs/s; "
        f"rapidfuzz backend likewise: {n / (seconds['rf-word'] + word_strings_s):,.0f} pairs/s. "
        "(The stage encodes the corpus and the candidates once: with mine.k = 64 negatives and "
        "8 candidates per sentence that is (64 + 8) / (1 + 8) = 8 pairs per text.)"
    )
    print(f"numba rows equal their rapidfuzz counterparts exactly: checked on all {n:,} pairs.")
    print(f"1-minute load average: {load_before:.2f} before, {load_after:.2f} after.")
    rate = n / default_s
    verdict = "met" if rate >= TARGET else "NOT met"
    print(
        f"\ntarget {TARGET:,} pairs/s for the stage's default path (numba, word-level normalised "
        f"Levenshtein, encoding excluded): {verdict} ({rate:,.0f} pairs/s)"
    )


if __name__ == "__main__":
    main()
