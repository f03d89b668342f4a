"""Sampled decoding that depends on the sentence alone, the same on both engines.

Neither engine's own sampler can do this: CTranslate2 seeds one generator per worker thread,
once (``set_random_seed`` does not reach it afterwards: CTranslate2 issue #1757), and
``torch.manual_seed`` before ``generate`` makes a row's samples depend on the rows batched with
it. So the engines only compute next-token logits and this module picks the token:

- every (input, decoding, candidate index) has its own stream of uniforms (Philox keyed by
  a 64-bit seed from ``sample_seed``), one uniform per output position;
- at position ``t`` the logits are warped as Hugging Face does (temperature, then top-k, then
  top-p), and the token is drawn by inverse CDF with the stream's ``t``-th uniform over the
  candidates ordered by probability, ties by token id.

The token at each position is then a function of the input, the tokens already chosen and the
seed: which batch the input is in, where a resumed run started and how many threads run it do
not enter (the logits themselves are batch-independent wherever the engine's arithmetic is; see
docs/augment.md, "What is reproducible").
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pairforge.stages.backtranslate.decoding import Decoding

if TYPE_CHECKING:
    import numpy as np
    import torch

# Part of every sampled translation's cache key: a change to how tokens are drawn must not
# reuse samples drawn the old way.
SAMPLER = "inverse-cdf/philox/v1"


def sample_seed(seed: int, decoding: Decoding, source: Sequence[int], index: int) -> int:
    """The 64-bit seed of candidate ``index`` for the source token ids ``source`` (what the model
    sees of a text) under ``decoding`` and the run ``seed``."""
    parts = (str(seed), decoding.label(), str(index), " ".join(map(str, source)))
    digest = hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def row_seeds(seed: int, decoding: Decoding, batch: Sequence[Sequence[int]]) -> list[int]:
    """``decoding.n`` seeds per input of ``batch``, input-major (the rows an engine decodes)."""
    return [sample_seed(seed, decoding, ids, j) for ids in batch for j in range(decoding.n)]


def uniforms(seed: int, steps: int) -> np.ndarray:
    """The first ``steps`` uniforms in [0, 1) of the stream keyed by ``seed`` (float64)."""
    import numpy as np

    return np.random.Generator(np.random.Philox(key=seed)).random(steps)


def choose_tokens(logits: torch.Tensor, u: torch.Tensor, decoding: Decoding) -> torch.Tensor:
    """One token id per row of ``logits`` (rows, vocab), drawn with the row's uniform ``u`` (rows,).

    Tokens the engine disabled (``-inf``, or CTranslate2's lowest float) are never drawn. Each
    row is computed on its own values only, so a row's token does not depend on the others.
    """
    import torch

    x = logits.float() / decoding.temperature  # (rows, vocab)
    vocab = x.shape[-1]
    k = vocab if decoding.top_k <= 0 else min(decoding.top_k, vocab)
    if k < vocab:
        values, ids = torch.topk(x, k, dim=-1)
        # topk's order among equal values is unspecified: sort by id, then stably by value.
        ids, perm = torch.sort(ids, dim=-1)
        values = values.gather(-1, perm)
    else:
        values = x
        ids = torch.arange(vocab, device=x.device).expand_as(x)
    values, perm = torch.sort(values, dim=-1, descending=True, stable=True)  # (rows, k)
    ids = ids.gather(-1, perm)
    finite = values > torch.finfo(torch.float32).min / 2
    probs = torch.softmax(values.masked_fill(~finite, float("-inf")), dim=-1)
    probs = torch.nan_to_num(probs, nan=0.0)
    if decoding.top_p < 1.0:
        # Keep the smallest prefix whose mass reaches top_p (the first token always).
        before = torch.cumsum(probs, dim=-1) - probs
        probs = probs.masked_fill(before >= decoding.top_p, 0.0)
    cdf = torch.cumsum(probs, dim=-1)  # (rows, k)
    target = u.to(cdf.device, torch.float64).unsqueeze(-1) * cdf[:, -1:].double()
    pick = (cdf.double() <= target).sum(dim=-1, keepdim=True)
    # Rounding can put the target at the very end: fall back to the last token with mass.
    last = (probs > 0).long().cumsum(dim=-1).argmax(dim=-1, keepdim=True)
    pick = torch.minimum(pick, last)
    return ids.gather(-1, pick).squeeze(-1)


def uniforms_table(seeds: list[int], steps: int) -> np.ndarray:
    """``uniforms`` of each seed, stacked: (len(seeds), steps)."""
    import numpy as np

    if not seeds:
        return np.zeros((0, steps))
    return np.stack([uniforms(s, steps) for s in seeds])
