"""DebCSE's alternative normalisation contrastive loss (CIKM 2023, section 4.3).

Equation numbers refer to the DebCSE paper (``shared/papers/002_*.txt``). ``h`` is a raw sentence
embedding from the encoder, ``z = BatchNorm(h)`` its normalised version (:class:`DebCSEHead`):

    L = L(z_i, h_i+) + L(z_i+, h_i)                                                 (eq. 7)
    L(z_i, h_i+) = -log exp(cos(z_i, h_i+)/τ)
                   / (Σ_k^m exp(cos(z_i, z_k-)/τ) + Σ_j^{N-m} exp(cos(z_i, z_j)/τ))    (eq. 8)

and eq. 9 is eq. 8 with the roles of anchor and positive swapped. Two readings of the printed
equations are parameters here:

- ``positive_in_denominator`` (default ``True``): the printed denominator sums over negatives only.
  The default adds the positive term, which makes each term the standard InfoNCE (a
  cross-entropy that is bounded below by 0) that SimCSE, whose settings DebCSE says it follows,
  uses; ``False`` is the equation as printed: it can go below zero, and its gradient on the
  positive similarity never fades, even once the positive dominates every negative.
- ``negative_space`` (default ``"normalised"``): the printed negatives are ``z`` vectors. Which
  sentences the in-batch ``z_j`` are is not spelled out; here they are the other rows of the side
  the query is predicting (``z_j+`` in eq. 8, ``z_j`` in eq. 9), the same rows as in SimCSE's
  [B, B] matrix. The default keeps the printed mix: the positive is scored against a raw ``h``
  (which carries the encoder's shared, anisotropic direction) and the negatives against centred
  ``z``, so the loss rewards raw embeddings that already look batch-normalised, which is how we
  read the paper's "indirect normalization". ``"raw"`` compares the query with raw ``h`` for every candidate (hard negatives
  and in-batch), so with the positive included each term is exactly the cross-entropy over the
  matrix ``cos(z, h+)`` extended by the hard-negative columns.

Hard negatives are each anchor's own ``m`` mined negatives, shared by eqs. 8 and 9 as printed;
other anchors' hard negatives are not added to the denominator. ``m = 0`` (no mined negatives)
leaves the in-batch negatives only.

The raw embedding ``h`` is the sentence vector of the ``pooling`` option (default: the start
model's own, e.g. ``mean`` for a sentence-transformers MiniLM; else ``cls_before_pooler``, the
[CLS] state of SimCSE's setting, which DebCSE follows): the paper names no pooler, and forcing
[CLS] on an encoder trained with mean pooling costs STS points before any training.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from pairforge.train.distributed import gather_with_grad, row_offset
from pairforge.train.objective_options import NegativeSpace, Positive, TrainablePooling
from pairforge.train.objectives import columns
from pairforge.train.objectives.base import (
    Batch,
    Encoder,
    Objective,
    choose_pooling,
    pool_features,
)
from torch import nn


def _debias_info_nce(
    query: torch.Tensor,
    target: torch.Tensor,
    in_batch: torch.Tensor,
    hard: torch.Tensor | None,
    temperature: float,
    positive_in_denominator: bool,
) -> torch.Tensor:
    """Per-row loss of one Debias-InfoNCE term (eq. 8 or 9), shape ``(batch_size,)``.

    ``query``, ``target``, ``in_batch``: ``(batch_size, dim)``; row ``i`` of ``target`` is the
    positive of query ``i``, rows ``j != i`` of ``in_batch`` are its in-batch negatives.
    ``hard``: ``(batch_size, m, dim)``, query ``i``'s own hard negatives, or ``None``.
    """
    q = F.normalize(query, dim=-1)  # (batch_size, dim)
    positive = (q * F.normalize(target, dim=-1)).sum(-1) / temperature  # (batch_size,)
    # Under data parallelism the in-batch candidates are every rank's rows.
    candidates = F.normalize(gather_with_grad(in_batch), dim=-1)  # (world_size * batch_size, dim)
    in_batch_logits = q @ candidates.T / temperature  # (batch_size, world_size * batch_size)
    # Row i's own pair is the positive and is scored above (possibly in another space), so the
    # diagonal leaves the in-batch negatives.
    rows = torch.arange(q.shape[0], device=q.device)
    own_pair = torch.zeros_like(in_batch_logits, dtype=torch.bool)
    own_pair[rows, rows + row_offset(q.shape[0])] = True
    logits = [in_batch_logits.masked_fill(own_pair, float("-inf"))]
    if hard is not None and hard.shape[1] > 0:
        hard_logits = torch.einsum("bd,bmd->bm", q, F.normalize(hard, dim=-1)) / temperature
        logits.append(hard_logits)  # (batch_size, m)
    if positive_in_denominator:
        logits.append(positive.unsqueeze(1))  # (batch_size, 1)
    denominator = torch.logsumexp(torch.cat(logits, dim=1), dim=1)  # (batch_size,)
    return denominator - positive  # eq. 8 / eq. 9


def debcse_loss(
    z_anchor: torch.Tensor,
    h_anchor: torch.Tensor,
    z_positive: torch.Tensor,
    h_positive: torch.Tensor,
    z_negatives: torch.Tensor | None = None,
    h_negatives: torch.Tensor | None = None,
    *,
    temperature: float = 0.05,
    positive_in_denominator: bool = True,
    negative_space: NegativeSpace = "normalised",
) -> torch.Tensor:
    """Alternative normalisation loss (eq. 7), averaged over the batch.

    ``z_*`` are the BatchNorm-normalised versions of the raw embeddings ``h_*``. Anchors and
    positives are ``(batch_size, dim)``; negatives ``(batch_size, m, dim)`` with ``m >= 0``, or
    ``None`` for no hard negatives. Only the negatives of ``negative_space`` are read: ``z_negatives``
    for ``"normalised"``, ``h_negatives`` for ``"raw"``. See the module docstring for the switches.
    """
    if negative_space == "normalised":
        hard, anchor_side, positive_side = z_negatives, z_anchor, z_positive
    elif negative_space == "raw":
        hard, anchor_side, positive_side = h_negatives, h_anchor, h_positive
    else:
        raise ValueError(f"negative_space must be 'normalised' or 'raw', not {negative_space!r}")
    batch_size = z_anchor.shape[0]
    num_hard = 0 if hard is None else hard.shape[1]
    if not positive_in_denominator and batch_size == 1 and num_hard == 0:
        raise ValueError(
            "debcse_loss without the positive in the denominator needs negatives: "
            "batch_size is 1 and there are no hard negatives"
        )
    forward = _debias_info_nce(  # eq. 8: predict z_i from h_i+
        z_anchor, h_positive, positive_side, hard, temperature, positive_in_denominator
    )
    backward = _debias_info_nce(  # eq. 9: predict z_i+ from h_i
        z_positive, h_anchor, anchor_side, hard, temperature, positive_in_denominator
    )
    return (forward + backward).mean()  # eq. 7


class DebCSEHead(nn.Module):
    """The "alternative normalisation" ``z = BatchNorm(h)``, used in training only.

    Each group of sentences (anchors, positives, hard negatives) is normalised with its own batch
    statistics, as each view is in BYOL and SimSiam, which the paper cites for the idea.
    """

    def __init__(self, hidden_size: int, affine: bool = True) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(hidden_size, affine=affine)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """``(n, dim) -> (n, dim)``, or ``(batch_size, m, dim)`` with the ``m`` axis flattened."""
        return self.norm(h.reshape(-1, h.shape[-1])).reshape(h.shape)


class DebCSE(Objective):
    """DebCSE with mined positives and hard negatives.

    The embeddings ``h`` are the encoder's vectors under ``pooling``, with no MLP on top (the
    paper names none; the BatchNorm head is the training-only part), so ``h`` is also the
    evaluation vector.

    Reads ``columns.ANCHOR_TEXT`` ``(batch_size, seq_len)``, ``columns.POSITIVE_TEXTS`` with one of
    the anchor's mined positives per row ``(batch_size, seq_len)`` (the collator picks it), and
    ``columns.NEGATIVE_TEXTS`` ``(batch_size, m, seq_len)``, ``m >= 0``.
    """

    name = "debcse"
    # One of the anchor's sampled positives per row and step; all its hard negatives.
    sample_one = (columns.POSITIVE_TEXTS,)
    columns = (columns.ANCHOR_TEXT, columns.POSITIVE_TEXTS, columns.NEGATIVE_TEXTS)
    pooling = "cls_before_pooler"  # without a start model's own (see the module docstring)

    def __init__(
        self,
        hidden_size: int,
        temperature: Positive = 0.05,
        positive_in_denominator: bool = True,
        negative_space: NegativeSpace = "normalised",
        pooling: TrainablePooling | None = None,
        start_pooling: str | None = None,
    ) -> None:
        super().__init__()
        self.pooling = choose_pooling(self.name, pooling, start_pooling, type(self).pooling)
        self.head = DebCSEHead(hidden_size)
        self.temperature = temperature
        self.positive_in_denominator = positive_in_denominator
        self.negative_space = negative_space

    def embed(
        self, batch: Batch, encoder: Encoder, positive_hidden_states: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, Any]:
        """(h_anchor, h_positive, h_negatives, the positives' encoder output) of a batch.

        ``h_anchor``, ``h_positive``: ``(batch_size, d)``; ``h_negatives``: ``(batch_size, m, d)``
        or ``None`` when ``m = 0``. With ``positive_hidden_states`` the positives' output holds
        every layer's states (the combined objective's decoder reads the embedding layer's).
        """
        h_anchor, _ = pool_features(encoder, batch[columns.ANCHOR_TEXT], self.pooling)
        h_positive, positive_out = pool_features(
            encoder, batch[columns.POSITIVE_TEXTS], self.pooling, positive_hidden_states
        )
        negatives = batch[columns.NEGATIVE_TEXTS]
        batch_size, num_hard = negatives["input_ids"].shape[:2]
        h_negatives = None
        if num_hard > 0:
            flat, _ = pool_features(encoder, negatives, self.pooling)  # (batch_size * m, d)
            h_negatives = flat.reshape(batch_size, num_hard, -1)  # (batch_size, m, d)
        return h_anchor, h_positive, h_negatives, positive_out

    def contrastive(
        self, h_anchor: torch.Tensor, h_positive: torch.Tensor, h_negatives: torch.Tensor | None
    ) -> torch.Tensor:
        """The loss of eq. 7 over raw embeddings, normalised here by the BatchNorm head."""
        z_negatives = None if h_negatives is None else self.head(h_negatives)
        return debcse_loss(
            self.head(h_anchor),
            h_anchor,
            self.head(h_positive),
            h_positive,
            z_negatives,
            h_negatives,
            temperature=self.temperature,
            positive_in_denominator=self.positive_in_denominator,
            negative_space=self.negative_space,
        )

    def forward(self, batch: Batch, encoder: Encoder) -> dict[str, torch.Tensor]:
        h_anchor, h_positive, h_negatives, _ = self.embed(batch, encoder)
        loss = self.contrastive(h_anchor, h_positive, h_negatives)
        return {"loss": loss, "contrastive": loss.detach()}
