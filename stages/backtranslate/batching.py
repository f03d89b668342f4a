"""Batches for translation: sorted by length, bounded by padded tokens and by sentences.

Sorting by length keeps padding (wasted compute) small; the token budget counts padded source
tokens (rows x longest row), which is what the encoder and the decoder's cross-attention pay for.
The plan is greedy and memoryless at batch boundaries: planning the items that remain after the
first k batches gives exactly batches k+1.., which is what makes a resumed shard (whose finished
batches are in the cache) translate the same batches as an uninterrupted run.
"""

from __future__ import annotations

from collections.abc import Sequence


def plan_batches(
    lengths: Sequence[int],
    max_tokens: int,
    max_sentences: int,
    keys: Sequence[str] | None = None,
) -> list[list[int]]:
    """Indexes of ``lengths`` grouped into batches, shortest first.

    A batch holds at most ``max_sentences`` items and at most ``max_tokens`` padded tokens
    (``len(batch) * max(length)``); an item longer than ``max_tokens`` gets a batch of its own.
    Ties in length are broken by ``keys`` (then index), so the plan depends only on the items.
    """
    if max_tokens < 1 or max_sentences < 1:
        raise ValueError("max_tokens and max_sentences must be >= 1")
    order = sorted(
        range(len(lengths)),
        key=lambda i: (lengths[i], keys[i] if keys is not None else "", i),
    )
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        width = max(longest, lengths[i])
        if current and (
            len(current) + 1 > max_sentences or (len(current) + 1) * width > max_tokens
        ):
            batches.append(current)
            current, width = [], lengths[i]
        current.append(i)
        longest = width
    if current:
        batches.append(current)
    return batches
