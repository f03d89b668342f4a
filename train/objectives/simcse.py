"""Unsupervised SimCSE (Gao, Yao and Chen, EMNLP 2021; arXiv 2104.08821).

The positive of a sentence is the same sentence encoded a second time under an independent
dropout mask; the other sentences of the batch are its negatives. Equation numbers refer to the
SimCSE paper (not among ``shared/papers``; METHODS.md section 3 lists the conventions).

Pooling (the ``pooling`` option; default the start model's own, else the paper's
``cls_before_pooler``): as in SimCSE's code, the Linear+Tanh MLP sits over [CLS] in training only
(``cls_before_pooler``, its unsupervised setting, Table 6 of the paper compares poolers); ``mean``
(SimCSE's ``avg``) and ``cls`` (the encoder's own pretrained pooler, kept at evaluation) train the
evaluation vector directly, with no extra MLP.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pairforge.train.distributed import gather_with_grad, row_offset
from pairforge.train.objective_options import Positive, TrainablePooling
from pairforge.train.objectives import columns
from pairforge.train.objectives.base import (
    Batch,
    Encoder,
    Features,
    Objective,
    choose_pooling,
    pool_features,
)
from torch import nn


def cosine_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Pairwise cosine similarities, ``(n, dim) x (k, dim) -> (n, k)``."""
    return F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T


def simcse_loss(z1: torch.Tensor, z2: torch.Tensor, temperature: float = 0.05) -> torch.Tensor:
    """In-batch InfoNCE: row ``i`` of ``z1`` must pick row ``i`` of ``z2`` among all rows of ``z2``.

    ``z1``, ``z2``: ``(batch_size, dim)``, the two views of the same sentences. The denominator
    includes the positive (standard InfoNCE, cross-entropy with labels ``arange(batch_size)``).
    Returns the mean over the batch. Under data parallelism the candidates are every rank's ``z2``
    (``train.distributed.gather_with_grad``), so the negatives span the global batch.
    """
    candidates = gather_with_grad(z2)  # (world_size * batch_size, dim)
    logits = cosine_matrix(z1, candidates) / temperature  # (batch_size, world_size * batch_size)
    labels = torch.arange(z1.shape[0], device=z1.device) + row_offset(z1.shape[0])  # (batch_size,)
    return F.cross_entropy(logits, labels)  # eq. 4


class SimCSEPooler(nn.Module):
    """SimCSE's MLP over [CLS] (Linear + Tanh), used in training only.

    At evaluation SimCSE reads the [CLS] vector before this head (``cls_before_pooler``).
    """

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.activation = nn.Tanh()

    def forward(self, cls: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(cls))  # (batch_size, hidden_size)


def training_head(hidden_size: int, pooling: str) -> nn.Module:
    """SimCSE's training-only MLP for ``cls_before_pooler``; the identity for other poolings."""
    return SimCSEPooler(hidden_size) if pooling == "cls_before_pooler" else nn.Identity()


class SimCSE(Objective):
    """Unsupervised SimCSE: reads ``columns.TEXT``; the encoder must be in train mode (dropout)."""

    name = "simcse"
    columns = (columns.TEXT,)
    pooling = "cls_before_pooler"  # the paper's; an instance takes the start model's (see above)

    def __init__(
        self,
        hidden_size: int,
        temperature: Positive = 0.05,
        pooling: TrainablePooling | None = None,
        start_pooling: str | None = None,
    ) -> None:
        super().__init__()
        self.pooling = choose_pooling(self.name, pooling, start_pooling, type(self).pooling)
        self.pooler = training_head(hidden_size, self.pooling)
        self.temperature = temperature

    def embed(self, features: Features, encoder: Encoder) -> torch.Tensor:
        """The training vectors of ``features``: pooled, then the training-only MLP (if any).
        ``(rows, seq_len)`` inputs -> ``(rows, d)``."""
        pooled, _ = pool_features(encoder, features, self.pooling)  # (rows, d)
        return self.pooler(pooled)  # (rows, d)

    def views(self, features: Features, encoder: Encoder) -> tuple[torch.Tensor, torch.Tensor]:
        """Two dropout views of the same sentences, ``(batch_size, d)`` each."""
        # One pass over the batch stacked twice: dropout masks are drawn per element, so the two
        # copies are two independently perturbed views, as in SimCSE's own code.
        doubled = {key: torch.cat([value, value]) for key, value in features.items()}
        z1, z2 = self.embed(doubled, encoder).chunk(2)  # (batch_size, d) each
        return z1, z2

    def forward(self, batch: Batch, encoder: Encoder) -> dict[str, torch.Tensor]:
        z1, z2 = self.views(batch[columns.TEXT], encoder)
        loss = simcse_loss(z1, z2, self.temperature)
        return {"loss": loss, "contrastive": loss.detach()}
