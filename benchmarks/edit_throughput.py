"""Edit-distance throughput of the mining stage: rapidfuzz cpdist vs a plain Python loop.

    python benchmarks/edit_throughput.py [--pairs 2000000] [--workers -1]

Builds synthetic English-like sentences of about 120 characters (Zipf-distributed vocabulary),
pairs each anchor half of the time with an unrelated sentence (a negative-pool candidate) and half
of the time with a lightly edited copy (a paraphrase-like positive candidate), then times:

- baseline: a Python loop of ``Levenshtein.normalized_distance`` over every pair;
- ``pair_distances`` (one ``rapidfuzz.process.cpdist`` call), char-level normalised Levenshtein,
  with all cores and with one, plus the indel metric and word-level distances for comparison.

Prints pairs/s per method and whether the 3M pairs/s target of the default path was met. The
numbers depend on the machine's core count: cpdist scales with ``workers``, the loop does not.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import numpy as np
from rapidfuzz.distance import Levenshtein

from stages.mining.edits import pair_distances

TARGET = 3_000_000  # pairs/s, char-level normalised Levenshtein, workers=-1


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


def make_pairs(n_pairs: int, seed: int, n_unique: int = 50_000) -> tuple[list[str], list[str]]:
    """``n_pairs`` (anchor, candidate) pairs over ``n_unique`` distinct ~120-char sentences."""
    rng = np.random.default_rng(seed)
    words, p = _vocabulary(rng, 20_000)
    tokens = _sentences(rng, words, p, n_unique)
    sentences = [" ".join(t) for t in tokens]
    edited = [_perturb(rng, t, words) for t in tokens]
    a_idx = rng.integers(0, n_unique, n_pairs)
    b_idx = rng.integers(0, n_unique, n_pairs)
    related = rng.random(n_pairs) < 0.5
    anchors = [sentences[i] for i in a_idx]
    candidates = [
        edited[i] if r else sentences[j] for i, j, r in zip(a_idx, b_idx, related, strict=True)
    ]
    return anchors, candidates


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
    parser.add_argument("--workers", type=int, default=-1)
    parser.add_argument("--repeats", type=int, default=3, help="best of N for the cpdist rows")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    t0 = time.perf_counter()
    anchors, candidates = make_pairs(args.pairs, args.seed)
    lengths = np.fromiter((len(s) for s in anchors + candidates), dtype=np.int64)
    print(
        f"{args.pairs:,} pairs, mean length {lengths.mean():.1f} chars "
        f"(p5 {np.percentile(lengths, 5):.0f}, p95 {np.percentile(lengths, 95):.0f}), "
        f"{os.cpu_count()} CPU cores visible, generated in {time.perf_counter() - t0:.1f} s"
    )

    dist = Levenshtein.normalized_distance
    t_loop, base = _time(
        lambda: np.array(
            [dist(a, c) for a, c in zip(anchors, candidates, strict=True)], dtype=np.float32
        ),
        1,
    )
    rows = [("Python loop, Levenshtein.normalized_distance (baseline)", t_loop)]

    def run(label: str, repeats: int = args.repeats, **kw) -> np.ndarray:
        t, out = _time(lambda: pair_distances(anchors, candidates, **kw), repeats)
        rows.append((label, t))
        return out

    w = args.workers
    main_out = run(f"cpdist char normalised Levenshtein, workers={w} (default path)", workers=w)
    run("cpdist char normalised Levenshtein, workers=1", workers=1)
    run(f"cpdist char normalised Indel, workers={w}", workers=w, metric="indel")
    run(
        f"pair_distances word normalised Levenshtein, workers={w} (incl. tokenising)",
        1,
        kind="word",
        workers=w,
    )

    assert np.abs(main_out - base).max() < 1e-6, "cpdist and the loop disagree"
    print(f"\n{'method':<76} {'seconds':>8} {'pairs/s':>12} {'vs loop':>8}")
    for label, t in rows:
        print(f"{label:<76} {t:>8.2f} {args.pairs / t:>12,.0f} {t_loop / t:>7.1f}x")
    rate = args.pairs / rows[1][1]
    verdict = "met" if rate >= TARGET else "NOT met"
    print(f"\ntarget {TARGET:,} pairs/s for the default path: {verdict} ({rate:,.0f} pairs/s)")


if __name__ == "__main__":
    main()
