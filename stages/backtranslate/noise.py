"""DebCSE's discrete noise: several distinct inputs per sentence for the generator.

DebCSE (CIKM'23, section 4.2) injects one or two high-frequency words, or masks one or two words
at random positions, *before* the sentence goes to the back-translation model, so that one
sentence yields several different positive candidates. Every noised copy is recorded:

- ``none``: the sentence as it is (always the first variant);
- ``insert:<word>@<pos>[,<word>@<pos>]``: ``word`` inserted before the word at index ``pos`` of
  the original whitespace-split sentence (``pos == len(words)`` appends);
- ``mask@<pos>[,<pos>]``: the word at index ``pos`` replaced by the mask token (deleted when
  the token is empty: a rule-based translator copies an unknown token into its output).

Randomness is seeded per sentence (``seed`` and the sentence id), so a sentence gets the same
noise whichever shard, worker or run it is in.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

NONE = "none"
KINDS = ("insert", "mask")
_WORD = re.compile(r"^[a-z]+$")
# Draws per copy before giving up on a distinct one (short sentences have few distinct noises).
_ATTEMPTS = 16


@dataclass(frozen=True)
class NoiseSettings:
    """The noise one route draws: backtranslate's ``noise`` config taken by field name (``of``),
    with the words to insert resolved and the seed given.

    ``NoiseConfig`` (``stages/backtranslate/stage.py``) declares these keys, their validation and their
    defaults; this view declares none. It exists so that this module depends on nothing
    above it, and because two values are not the config's: ``vocabulary`` (the config's words,
    or the corpus's frequent ones when it has none) and ``seed`` (the stage's, then the route's).
    """

    copies: int
    kinds: tuple[str, ...]
    min_words: int
    max_words: int
    vocabulary: tuple[str, ...]
    mask_token: str
    seed: int

    @classmethod
    def of(cls, config: Any, vocabulary: Sequence[str], seed: int) -> NoiseSettings:
        """The view of ``config`` (a ``NoiseConfig``, or anything with its field names)."""
        given = {"vocabulary": tuple(vocabulary), "seed": seed}
        values = {f.name: getattr(config, f.name) for f in fields(cls) if f.name not in given}
        return cls(**{**values, "kinds": tuple(values["kinds"]), **given})


def frequent_words(texts: Iterable[str], top: int) -> list[str]:
    """The ``top`` most frequent lower-case alphabetic words (ties broken alphabetically)."""
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(w for w in text.lower().split() if _WORD.match(w))
    return [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]]


def _rng(seed: int, sentence_id: str) -> np.random.Generator:
    digest = hashlib.blake2b(f"{seed}\x1f{sentence_id}".encode(), digest_size=8).digest()
    return np.random.default_rng(int.from_bytes(digest, "little"))


def _draw(
    rng: np.random.Generator, words: Sequence[str], settings: NoiseSettings
) -> tuple[str, str] | None:
    kinds = [k for k in settings.kinds if k != "insert" or settings.vocabulary]
    if not kinds:
        return None
    kind = kinds[int(rng.integers(len(kinds)))]
    k = int(rng.integers(settings.min_words, settings.max_words + 1))
    n = len(words)
    if kind == "insert":
        positions = sorted(int(p) for p in rng.integers(0, n + 1, size=k))
        inserted = [
            settings.vocabulary[int(i)] for i in rng.integers(len(settings.vocabulary), size=k)
        ]
        out = list(words)
        # Insert from the right so that earlier positions keep their meaning.
        for pos, word in sorted(zip(positions, inserted, strict=True), reverse=True):
            out.insert(pos, word)
        label = "insert:" + ",".join(f"{w}@{p}" for p, w in zip(positions, inserted, strict=True))
        return label, " ".join(out)
    if n <= k:  # masking would leave nothing of the sentence
        return None
    positions = sorted(int(p) for p in rng.choice(n, size=k, replace=False))
    out = list(words)
    for pos in positions:
        out[pos] = settings.mask_token  # an empty token deletes the word
    return "mask@" + ",".join(str(p) for p in positions), " ".join(w for w in out if w)


def noise_variants(
    sentence_id: str, text: str, settings: NoiseSettings
) -> tuple[list[tuple[str, str]], int]:
    """``([(noise label, noised text), ...], collisions)``: the clean sentence first, then up to
    ``settings.copies`` noised copies with distinct labels and texts. ``collisions`` counts copies
    that could not be made distinct (very short sentences) and were left out."""
    variants = [(NONE, text)]
    if settings.copies <= 0:
        return variants, 0
    rng = _rng(settings.seed, sentence_id)
    words = text.split()
    seen_labels = {NONE}
    seen_texts = {text}
    collisions = 0
    for _ in range(settings.copies):
        for _ in range(_ATTEMPTS):
            drawn = _draw(rng, words, settings)
            if drawn is not None and drawn[0] not in seen_labels and drawn[1] not in seen_texts:
                variants.append(drawn)
                seen_labels.add(drawn[0])
                seen_texts.add(drawn[1])
                break
        else:
            collisions += 1
    return variants, collisions


def noise_kind(label: str) -> str:
    """``none``, ``insert`` or ``mask`` of a noise label."""
    return NONE if label == NONE else label.split(":", 1)[0].split("@", 1)[0]
