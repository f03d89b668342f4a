"""SimCSE with mined hard negatives: dropout positives, in-batch and mined negatives.

Unsupervised SimCSE (``simcse.py``) whose denominator also holds the mined negatives of the
``negative_texts`` column, as supervised SimCSE adds its NLI contradictions (SimCSE paper, eq. 5:
every hard negative of the batch is a candidate for every anchor, as in sentence-transformers'
``MultipleNegativesRankingLoss``). The positive stays the sentence itself under another dropout
mask, so only the negatives differ from SimCSE: ``benchmarks/quality.py`` trains it on the
negatives of each miner to compare the miners with everything else held equal. With no hard
negatives the loss is SimCSE's exactly.

Pooling and the training-only MLP are SimCSE's (the ``pooling`` option; default the start
model's own, else ``cls_before_pooler``); the hard negatives go through the same encoder,
pooling and MLP, with dropout, as the views do.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pairforge.train.distributed import gather_with_grad, row_offset
from pairforge.train.objectives import columns
from pairforge.train.objectives.base import Batch, Encoder
from pairforge.train.objectives.simcse import SimCSE, cosine_matrix


def simcse_hn_loss(
    z1: torch.Tensor,
    z2: torch.Tensor,
    hard: torch.Tensor | None = None,
    temperature: float = 0.05,
) -> torch.Tensor:
    """InfoNCE of row ``i`` of ``z1`` picking row ``i`` of ``z2`` among every row of ``z2`` and
    every hard negative of the batch.

    ``z1``, ``z2``: ``(batch_size, dim)``, two dropout views of the same sentences; ``hard``:
    ``(batch_size, m, dim)``, the mined negatives of each row, or ``None`` / ``m = 0`` (then it
    is :func:`simcse.simcse_loss`). Under data parallelism the candidates are every rank's.
    Returns the mean over the batch.
    """
    candidates = [gather_with_grad(z2)]  # (world_size * batch_size, dim)
    if hard is not None and hard.shape[1] > 0:
        flat = hard.reshape(-1, hard.shape[-1])  # (batch_size * m, dim)
        candidates.append(gather_with_grad(flat))  # (world_size * batch_size * m, dim)
    logits = cosine_matrix(z1, torch.cat(candidates)) / temperature  # (batch_size, n_candidates)
    labels = torch.arange(z1.shape[0], device=z1.device) + row_offset(z1.shape[0])  # (batch_size,)
    return F.cross_entropy(logits, labels)  # SimCSE eq. 5 with dropout positives


class SimCSEHardNegatives(SimCSE):
    """SimCSE plus mined negatives: reads ``columns.TEXT`` ``(batch_size, seq_len)`` and all of
    ``columns.NEGATIVE_TEXTS`` ``(batch_size, m, seq_len)``; the encoder in train mode.

    SimCSE's constructor, options, pooling, training MLP and dropout views; only the loss's
    candidates differ (the mined negatives, through the same encoder, pooling and MLP)."""

    name = "simcse_hn"
    columns = (columns.TEXT, columns.NEGATIVE_TEXTS)

    def forward(self, batch: Batch, encoder: Encoder) -> dict[str, torch.Tensor]:
        z1, z2 = self.views(batch[columns.TEXT], encoder)  # (batch_size, d) each
        negatives = batch[columns.NEGATIVE_TEXTS]
        batch_size, num_hard = negatives["input_ids"].shape[:2]
        hard = None
        if num_hard > 0:
            flat = self.embed(negatives, encoder)  # (batch_size * m, d)
            hard = flat.reshape(batch_size, num_hard, -1)  # (batch_size, m, d)
        loss = simcse_hn_loss(z1, z2, hard, self.temperature)
        return {"loss": loss, "contrastive": loss.detach()}
