"""BSL: bootstrapped sentence representation learning (ACL 2021), BYOL for sentences.

Equation numbers refer to the BSL paper (``shared/papers/004_*.txt``, section 3.1). The online
network is the encoder ``f_θ`` (mean pooling) plus a predictor ``p_θ``; the target network
``f_ξ`` is a copy of the encoder that gets no gradient and follows the online encoder by an
exponential moving average after every optimiser step. The online encoder is the one kept for
inference.

Paper-vs-code choices: the predictor is the paper's single MLP ``d -> kd -> kd -> d`` (``k = 8``);
the authors' code stacks three such MLPs (``num_mlps=3``). The target runs in whatever mode the
objective is in, so in training it keeps dropout on, as in the authors' code.

Pooling (the ``pooling`` option): the paper's mean pooling, or the start model's own when its
folder declares one; online and target networks pool alike.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from pairforge.train.objective_options import Count, Decay, TrainablePooling
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


def negative_cosine(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``D(z, h) = -cos(z, h)``, averaged over the batch; the target is a stop-gradient.

    The paper writes D as the mean squared error between the l2-normalised vectors and simplifies
    it to ``-cos``: ``||z/|z| - h/|h|||² = 2 - 2 cos(z, h)``, the same objective up to a factor
    of 2 and a constant, so with the same optimum and gradients half as large. This form lies in
    ``[-1, 1]``.
    """
    return -F.cosine_similarity(prediction, target.detach(), dim=-1).mean()  # eq. 1


def bsl_loss(
    p1: torch.Tensor, h2: torch.Tensor, p2: torch.Tensor, h1: torch.Tensor
) -> torch.Tensor:
    """Symmetric BSL loss ``½ D(p1, sg(h2)) + ½ D(p2, sg(h1))``.

    ``p1``, ``p2``: online predictions for views 1 and 2; ``h1``, ``h2``: target embeddings of
    views 1 and 2; all ``(batch_size, dim)``. The targets get no gradient.
    """
    return 0.5 * negative_cosine(p1, h2) + 0.5 * negative_cosine(p2, h1)  # eq. 2


@torch.no_grad()
def ema_update(target: nn.Module, online: nn.Module, delta: float = 0.999) -> None:
    """``ξ <- δ ξ + (1 - δ) θ`` for every parameter, in place.

    ``target`` and ``online`` must have the same parameters, by name and in order. Buffers (e.g.
    BatchNorm statistics) are left alone, as in BYOL.
    """
    pairs = zip(target.named_parameters(), online.named_parameters(), strict=True)
    for (target_name, xi), (online_name, theta) in pairs:
        if target_name != online_name:
            raise ValueError(f"parameter mismatch: target {target_name}, online {online_name}")
        xi.mul_(delta).add_(theta, alpha=1.0 - delta)  # eq. 4


def make_target(online: nn.Module) -> nn.Module:
    """The target network: a deep copy of ``online`` that requires no gradient."""
    target = copy.deepcopy(online)
    target.requires_grad_(False)
    return target


class BSLPredictor(nn.Module):
    """The predictor ``p_θ``: ``num_mlps`` MLPs ``d -> kd -> kd -> d`` with BatchNorm + ReLU on
    the intermediate layers."""

    def __init__(self, hidden_size: int, k: int = 8, num_mlps: int = 1) -> None:
        super().__init__()
        inner = k * hidden_size
        layers: list[nn.Module] = []
        for _ in range(num_mlps):
            layers += [
                nn.Linear(hidden_size, inner),
                nn.BatchNorm1d(inner),
                nn.ReLU(),
                nn.Linear(inner, inner),
                nn.BatchNorm1d(inner),
                nn.ReLU(),
                nn.Linear(inner, hidden_size),
            ]
        self.mlp = nn.Sequential(*layers)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.mlp(h)  # (batch_size, hidden_size)


class BSL(Objective):
    """BSL over two views (``columns.VIEW1_TEXT``, ``columns.VIEW2_TEXT``).

    Built from the online encoder, of which it keeps the target copy (frozen, moved with the
    objective by ``.to()``); ``forward`` must then be given that same online encoder, and the
    trainer calls :meth:`after_optimizer_step` after every optimiser step.
    """

    name = "bsl"
    columns = (columns.VIEW1_TEXT, columns.VIEW2_TEXT)
    pooling = "mean"  # the paper's; the online encoder, so pooled, is the one kept for inference

    def __init__(
        self,
        encoder: nn.Module,
        hidden_size: int,
        k: Count = 8,
        num_mlps: Count = 1,
        delta: Decay = 0.999,
        pooling: TrainablePooling | None = None,
        start_pooling: str | None = None,
    ) -> None:
        super().__init__()
        self.pooling = choose_pooling(self.name, pooling, start_pooling, type(self).pooling)
        self.predictor = BSLPredictor(hidden_size, k=k, num_mlps=num_mlps)
        self.target = make_target(encoder)
        self.delta = delta

    def _embed(self, encoder: Encoder, features: Features) -> torch.Tensor:
        return pool_features(encoder, features, self.pooling)[0]  # (batch_size, d)

    def forward(self, batch: Batch, encoder: Encoder) -> dict[str, torch.Tensor]:
        view1, view2 = batch[columns.VIEW1_TEXT], batch[columns.VIEW2_TEXT]
        p1 = self.predictor(self._embed(encoder, view1))  # (batch_size, d)
        p2 = self.predictor(self._embed(encoder, view2))
        with torch.no_grad():
            h1 = self._embed(self.target, view1)  # (batch_size, d)
            h2 = self._embed(self.target, view2)
        loss = bsl_loss(p1, h2, p2, h1)
        return {"loss": loss, "prediction": loss.detach()}

    def after_optimizer_step(self, encoder: nn.Module) -> None:
        ema_update(self.target, encoder, self.delta)
