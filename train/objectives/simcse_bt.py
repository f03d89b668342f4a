"""SimCSE with a back-translation as the positive: in-batch InfoNCE over (sentence, translation).

Unsupervised SimCSE (``simcse.py``) whose second view is not the sentence under another dropout
mask but one of its round-trip translations (the ``positive_text`` column the ``sample`` stage
writes, DenoSent's noisy view). Row ``i``'s positive is its own translation; the other rows'
translations are its negatives. It isolates what a real translation adds as a positive, with
nothing else of DebCSE (no mined negatives, no weighting): ``benchmarks/quality.py`` trains it
beside SimCSE and DebCSE.

Both sides go through the same encoder, pooling and training-only MLP, with dropout, as the
dropout views of SimCSE do; pooling is SimCSE's option (default the start model's own, else
``cls_before_pooler``). A row without a translation is skipped by the data reader and counted.
"""

from __future__ import annotations

import torch
from pairforge.train.objectives import columns
from pairforge.train.objectives.base import Batch, Encoder
from pairforge.train.objectives.simcse import SimCSE, simcse_loss


class SimCSETranslation(SimCSE):
    """SimCSE with translation positives: reads ``columns.TEXT`` and ``columns.POSITIVE_TEXT``,
    each ``(batch_size, seq_len)``; the encoder in train mode. SimCSE's constructor, options,
    pooling and training MLP; only the positive differs."""

    name = "simcse_bt"
    columns = (columns.TEXT, columns.POSITIVE_TEXT)

    def forward(self, batch: Batch, encoder: Encoder) -> dict[str, torch.Tensor]:
        z1 = self.embed(batch[columns.TEXT], encoder)  # (batch_size, d)
        z2 = self.embed(batch[columns.POSITIVE_TEXT], encoder)  # (batch_size, d)
        loss = simcse_loss(z1, z2, self.temperature)
        return {"loss": loss, "contrastive": loss.detach()}
