"""DebCSE's contrastive loss plus DenoSent's denoising term (``objective: combined``).

A recipe over two existing modules, not a new method: DenoSent (``shared/papers/000_*.txt``)
shows that its denoising objective "is complementary to the contrastive objective" (abstract;
Table 1: both 79.33 avg STS, contrastive alone 77.96, denoising alone 76.19), and DebCSE
(``shared/papers/002_*.txt``) is the stronger contrastive part here, trained on the mined pairs.

    L = L_DebCSE(h_i, h_i+, {h_ik-}) + λ · L_denoise(t_i+ | W h_i)

- ``L_DebCSE``: DebCSE's eq. 7 (``debcse.DebCSE.contrastive``) over the anchor, one of its mined
  positives (drawn per step) and its mined hard negatives; ``h`` is the encoder's vector under the
  ``pooling`` option (default: the start model's own), the one evaluated and exported.
- ``L_denoise``: DenoSent's eq. 4 (``denosent.denoising_loss``): its non-causal Transformer
  decoder (``denosent.DenoSentDecoder``), whose only memory is ``W h_i`` (DenoSent's training-only
  ``Linear(d, d)`` projector over the anchor's vector), rebuilds every token ``t_i+`` of the
  anchor's mined positive (a back-translation or rewrite: the discrete noise) from that positive's
  embedding-layer output, detached and through ``Dropout(noise_dropout)`` (the continuous noise);
  token cross-entropy averaged over the non-pad tokens.
- ``λ``: ``denoising_weight``, default 1 (DenoSent's eq. 6 weighs its two terms equally; its code
  uses 5 and 7). ``λ = 0`` is DebCSE exactly.

What differs from DenoSent: no prompt (DenoSent's [MASK] pooling is replaced by the pooling DebCSE
trains, so the combined model is evaluated like DebCSE) and the target sentence is the mined
positive as tokenised, not wrapped in the prompt. The decoder's output layer is the encoder's MLM
head when it has one, as in DenoSent.
"""

from __future__ import annotations

import torch
from pairforge.train.objective_options import (
    Count,
    Dropout,
    NegativeSpace,
    NonNegative,
    Positive,
    TrainablePooling,
)
from pairforge.train.objectives import columns
from pairforge.train.objectives.base import Batch, Encoder, Objective, choose_pooling
from pairforge.train.objectives.debcse import DebCSE
from pairforge.train.objectives.denosent import build_denoiser, reconstruction_loss
from torch import nn


def combined_loss(
    contrastive: torch.Tensor, denoising: torch.Tensor, denoising_weight: float = 1.0
) -> torch.Tensor:
    """``L_DebCSE + λ · L_denoise``, both scalars (see the module docstring)."""
    return contrastive + denoising_weight * denoising


class Combined(Objective):
    """DebCSE over the mined pairs plus DenoSent's denoising of the mined positive.

    Reads DebCSE's columns: ``columns.ANCHOR_TEXT``, ``columns.POSITIVE_TEXTS`` (one per row and
    step) and ``columns.NEGATIVE_TEXTS``. The encoder must return ``hidden_states`` when asked (the
    first is the embedding-layer output that feeds the decoder).
    """

    name = "combined"
    columns = DebCSE.columns
    sample_one = DebCSE.sample_one
    pooling = DebCSE.pooling

    def __init__(
        self,
        hidden_size: int,
        pad_token_id: int,
        output_head: nn.Module | None = None,
        vocab_size: int | None = None,
        temperature: Positive = 0.05,
        positive_in_denominator: bool = True,
        negative_space: NegativeSpace = "normalised",
        pooling: TrainablePooling | None = None,
        start_pooling: str | None = None,
        denoising_weight: NonNegative = 1.0,
        num_decoder_layers: Count = 16,
        num_decoder_heads: Count = 1,
        decoder_feedforward: Count = 2048,
        decoder_dropout: Dropout = 0.1,
        noise_dropout: Dropout = 0.825,
    ) -> None:
        super().__init__()
        if denoising_weight < 0:
            raise ValueError(f"combined: denoising_weight must be >= 0, got {denoising_weight}")
        self.debcse = DebCSE(
            hidden_size,
            temperature=temperature,
            positive_in_denominator=positive_in_denominator,
            negative_space=negative_space,
            pooling=choose_pooling(self.name, pooling, start_pooling, DebCSE.pooling),
        )
        self.pooling = self.debcse.pooling
        self.projector, self.decoder = build_denoiser(
            hidden_size,
            vocab_size,
            output_head,
            num_decoder_layers,
            num_decoder_heads,
            decoder_feedforward,
            decoder_dropout,
            noise_dropout,
        )
        self.pad_token_id = pad_token_id
        self.denoising_weight = denoising_weight

    def losses(
        self,
        h_anchor: torch.Tensor,
        h_positive: torch.Tensor,
        h_negatives: torch.Tensor | None,
        positive_embeddings: torch.Tensor,
        positive_ids: torch.Tensor,
    ) -> dict[str, torch.Tensor]:
        """The loss and its parts from embeddings, no encoder needed.

        ``h_anchor``, ``h_positive``: ``(batch_size, d)``; ``h_negatives``: ``(batch_size, m, d)``
        or ``None``; ``positive_embeddings``: the positives' embedding-layer output
        ``(batch_size, seq_len, d)``; ``positive_ids``: their token ids ``(batch_size, seq_len)``.
        """
        contrastive = self.debcse.contrastive(h_anchor, h_positive, h_negatives)
        denoising = contrastive.new_zeros(())
        if self.denoising_weight != 0:
            denoising = reconstruction_loss(
                self.decoder,
                self.projector(h_anchor),
                positive_embeddings,
                positive_ids,
                self.pad_token_id,
            )
        loss = combined_loss(contrastive, denoising, self.denoising_weight)
        return {"loss": loss, "contrastive": contrastive.detach(), "denoising": denoising.detach()}

    def forward(self, batch: Batch, encoder: Encoder) -> dict[str, torch.Tensor]:
        h_anchor, h_positive, h_negatives, positive_out = self.debcse.embed(
            batch, encoder, positive_hidden_states=self.denoising_weight != 0
        )
        positive_ids = batch[columns.POSITIVE_TEXTS]["input_ids"]  # (batch_size, seq_len)
        embeddings = (
            positive_out.hidden_states[0]  # (batch_size, seq_len, d), embedding-layer output
            if self.denoising_weight != 0
            else h_positive.new_zeros(())
        )
        return self.losses(h_anchor, h_positive, h_negatives, embeddings, positive_ids)
