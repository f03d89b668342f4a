"""DenoSent: a denoising objective plus a contrastive one (AAAI 2024).

Equation numbers refer to the DenoSent paper (``shared/papers/000_*.txt``); facts about the
authors' code come from METHODS.md section 3.

- Sentence vector: the encoder's last hidden state at the [MASK] of the prompt
  ``"[X]" means [MASK].`` (:func:`build_prompt_inputs`, :func:`mask_pool`), followed in training by a
  ``Linear(d, d)`` projector. The evaluation embedding is the pooled vector without the projector.
- Denoising (eq. 4): a non-causal Transformer decoder (:class:`DenoSentDecoder`) whose only memory
  is the projected sentence vector ``[B, 1, d]`` rebuilds every token of the prompt-wrapped
  *positive* (the back-translation: the discrete noise) from the positive's embedding-layer
  output, detached and passed through ``Dropout(0.825)`` (the continuous noise).
- Contrastive (eq. 5): in-batch InfoNCE between the projected vectors of a sentence and of its
  back-translation.

Paper-vs-code choices. The defaults follow the authors' published training command, with which
their released checkpoint was trained (79.56 avg STS in their README, against 79.33 in the paper);
temperature and loss weights interact, so they are taken as one set rather than mixed:

- temperature: code 0.05 (default); paper 0.03.
- total loss (eq. 6): code ``5 * contrastive + 7 * denoising`` (default); paper ``1 + 1``.
- eq. 5 as printed sums only negatives in the denominator; as in the code, the positive is
  included (cross-entropy over the [B, B] cosine matrix).
- eq. 4 sums token losses; as in the code, they are averaged over non-pad tokens.
- sentence truncation: 32 word pieces of the sentence itself, before wrapping; the code's 32 also
  counts [CLS] and [SEP], leaving 30 word pieces.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pairforge.pipeline.science.models.pooling import DEFAULT_PROMPT
from pairforge.train.objective_options import Count, Dropout, NonNegative, Positive
from pairforge.train.objectives import columns
from pairforge.train.objectives.base import Batch, Encoder, Objective, run_encoder
from pairforge.train.objectives.prompts import (  # noqa: F401 - re-exported for callers of this module
    MASK_SLOT,
    SENTENCE_SLOT,
    build_prompt_inputs,
    check_template,
)
from pairforge.train.objectives.simcse import simcse_loss
from torch import nn


def mask_positions(input_ids: torch.Tensor, mask_token_id: int) -> torch.Tensor:
    """Index of the last mask token in each row, ``(batch_size, seq_len) -> (batch_size,)``.

    The last one is the template's: the template puts [MASK] after the sentence, so a mask token
    inside the sentence text itself comes earlier.
    """
    is_mask = input_ids == mask_token_id  # (batch_size, seq_len)
    if not bool(is_mask.any(dim=1).all()):
        raise ValueError("every row must contain the mask token; wrap inputs with the prompt")
    positions = torch.arange(input_ids.shape[1], device=input_ids.device)
    return torch.where(is_mask, positions, -1).amax(dim=1)


def mask_pool(hidden_states: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The vector at ``positions``, ``(batch_size, seq_len, dim), (batch_size,) -> (batch_size, dim)``."""
    rows = torch.arange(hidden_states.shape[0], device=hidden_states.device)
    return hidden_states[rows, positions]


def denoising_loss(
    logits: torch.Tensor, target_ids: torch.Tensor, pad_token_id: int
) -> torch.Tensor:
    """Token cross-entropy of the reconstruction, averaged over the non-pad targets.

    ``logits``: ``(batch_size, seq_len, vocab_size)``; ``target_ids``: ``(batch_size, seq_len)``.
    """
    return F.cross_entropy(  # eq. 4
        logits.reshape(-1, logits.shape[-1]), target_ids.reshape(-1), ignore_index=pad_token_id
    )


def denosent_loss(
    contrastive: torch.Tensor,
    denoising: torch.Tensor,
    contrastive_weight: float = 5.0,
    denoising_weight: float = 7.0,
) -> torch.Tensor:
    """Weighted sum of the two objectives; the paper's weights are 1 and 1."""
    return contrastive_weight * contrastive + denoising_weight * denoising  # eq. 6


def _init_decoder_weights(module: nn.Module) -> None:
    # nn.TransformerDecoder deep-copies one layer, so every layer would start identical; each
    # weight matrix is drawn afresh instead, from BERT's N(0, 0.02), the scale the authors'
    # init_weights gives Linear layers.
    for sub in module.modules():
        if isinstance(sub, nn.Linear):
            nn.init.normal_(sub.weight, std=0.02)
            if sub.bias is not None:
                nn.init.zeros_(sub.bias)
        elif isinstance(sub, nn.MultiheadAttention):
            if sub.in_proj_weight is not None:
                nn.init.normal_(sub.in_proj_weight, std=0.02)
            if sub.in_proj_bias is not None:
                nn.init.zeros_(sub.in_proj_bias)
        elif isinstance(sub, nn.LayerNorm):
            nn.init.ones_(sub.weight)
            nn.init.zeros_(sub.bias)


class DenoSentDecoder(nn.Module):
    """Non-causal Transformer decoder that rebuilds a sentence from its pooled vector.

    ``output_head`` maps decoder states to vocabulary logits: pass the encoder's MLM head (e.g.
    ``BertForMaskedLM.cls``, as the authors do) or leave it ``None`` for a fresh
    ``Linear(hidden_size, vocab_size)``. ``dim_feedforward`` defaults to 2048, PyTorch's default,
    which the authors' code keeps (with ``d = 768``, 16 layers hold about 126M parameters).
    """

    def __init__(
        self,
        hidden_size: int,
        vocab_size: int | None = None,
        output_head: nn.Module | None = None,
        num_layers: int = 16,
        num_heads: int = 1,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        noise_dropout: float = 0.825,
    ) -> None:
        super().__init__()
        layer = nn.TransformerDecoderLayer(
            d_model=hidden_size,
            nhead=num_heads,
            dim_feedforward=dim_feedforward,
            dropout=dropout,
            batch_first=True,
        )
        self.layers = nn.TransformerDecoder(layer, num_layers=num_layers)
        _init_decoder_weights(self.layers)
        self.noise = nn.Dropout(noise_dropout)
        if output_head is None:
            if vocab_size is None:
                raise ValueError("DenoSentDecoder needs output_head or vocab_size")
            output_head = nn.Linear(hidden_size, vocab_size)
        self.output_head = output_head

    def forward(
        self,
        memory: torch.Tensor,
        target_embeddings: torch.Tensor,
        target_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Vocabulary logits ``(batch_size, seq_len, vocab_size)`` for every target position.

        ``memory``: the sentence vector, ``(batch_size, dim)`` or ``(batch_size, 1, dim)``.
        ``target_embeddings``: embedding-layer output of the target sentence,
        ``(batch_size, seq_len, dim)``; no gradient flows back through it.
        ``target_padding_mask``: ``(batch_size, seq_len)``, ``True`` at padding.
        """
        if memory.dim() == 2:
            memory = memory.unsqueeze(1)  # (batch_size, 1, dim)
        # Detached: the decoder must learn to use the memory, not to shape its own input.
        noisy = self.noise(target_embeddings.detach())  # (batch_size, seq_len, dim)
        states = self.layers(  # eq. 1 (cross-attention to the memory) and eq. 3 (no causal mask)
            tgt=noisy, memory=memory, tgt_mask=None, tgt_key_padding_mask=target_padding_mask
        )
        return self.output_head(states)  # (batch_size, seq_len, vocab_size)


def build_denoiser(
    hidden_size: int,
    vocab_size: int | None = None,
    output_head: nn.Module | None = None,
    num_decoder_layers: int = 16,
    num_decoder_heads: int = 1,
    decoder_feedforward: int = 2048,
    decoder_dropout: float = 0.1,
    noise_dropout: float = 0.825,
) -> tuple[nn.Linear, DenoSentDecoder]:
    """DenoSent's training-only projector ``Linear(d, d)`` and its decoder (whose memory is the
    projected vector), as DenoSent and Combined take them: the arguments are their recipe
    options. Built in this order, which fixes their initial weights under a seed."""
    projector = nn.Linear(hidden_size, hidden_size)
    decoder = DenoSentDecoder(
        hidden_size,
        vocab_size=vocab_size,
        output_head=output_head,
        num_layers=num_decoder_layers,
        num_heads=num_decoder_heads,
        dim_feedforward=decoder_feedforward,
        dropout=decoder_dropout,
        noise_dropout=noise_dropout,
    )
    return projector, decoder


def reconstruction_loss(
    decoder: DenoSentDecoder,
    memory: torch.Tensor,
    target_embeddings: torch.Tensor,
    target_ids: torch.Tensor,
    pad_token_id: int,
) -> torch.Tensor:
    """Eq. 4: the decoder rebuilds ``target_ids`` ``(batch_size, seq_len)`` from ``memory``
    ``(batch_size, d)`` and the targets' embedding-layer output ``(batch_size, seq_len, d)``."""
    logits = decoder(  # (batch_size, seq_len, vocab_size)
        memory, target_embeddings, target_padding_mask=target_ids == pad_token_id
    )
    return denoising_loss(logits, target_ids, pad_token_id)


class DenoSent(Objective):
    """DenoSent over prompt-wrapped inputs (:func:`build_prompt_inputs`).

    Reads ``columns.TEXT`` (the sentence) and ``columns.POSITIVE_TEXT`` (its back-translation),
    both prompt-wrapped. The encoder must return ``hidden_states`` when asked: the first one is the
    embedding-layer output that feeds the decoder. A weight of 0 skips that objective.
    """

    name = "denosent"
    columns = (columns.TEXT, columns.POSITIVE_TEXT)
    pooling = "mask"  # the [MASK] state, without the training-only projector

    def __init__(
        self,
        hidden_size: int,
        mask_token_id: int,
        pad_token_id: int,
        output_head: nn.Module | None = None,
        vocab_size: int | None = None,
        num_decoder_layers: Count = 16,
        num_decoder_heads: Count = 1,
        decoder_feedforward: Count = 2048,
        decoder_dropout: Dropout = 0.1,
        noise_dropout: Dropout = 0.825,
        temperature: Positive = 0.05,
        contrastive_weight: NonNegative = 5.0,
        denoising_weight: NonNegative = 7.0,
        template: str = DEFAULT_PROMPT,
    ) -> None:
        super().__init__()
        if contrastive_weight == 0 and denoising_weight == 0:
            raise ValueError("DenoSent needs a non-zero contrastive or denoising weight")
        check_template(template)
        self.prompt = template
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
        self.mask_token_id = mask_token_id
        self.pad_token_id = pad_token_id
        self.temperature = temperature
        self.contrastive_weight = contrastive_weight
        self.denoising_weight = denoising_weight

    def _sentence_vector(self, hidden: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        pooled = mask_pool(hidden, mask_positions(input_ids, self.mask_token_id))  # (batch, d)
        return self.projector(pooled)  # (batch_size, d)

    def forward(self, batch: Batch, encoder: Encoder) -> dict[str, torch.Tensor]:
        sentence, positive = batch[columns.TEXT], batch[columns.POSITIVE_TEXT]
        sentence_out = run_encoder(encoder, sentence)
        z = self._sentence_vector(sentence_out.last_hidden_state, sentence["input_ids"])
        positive_out = run_encoder(encoder, positive, output_hidden_states=True)

        contrastive = denoising = z.new_zeros(())
        if self.contrastive_weight != 0:
            z_positive = self._sentence_vector(
                positive_out.last_hidden_state, positive["input_ids"]
            )
            contrastive = simcse_loss(z, z_positive, self.temperature)  # eq. 5
        if self.denoising_weight != 0:
            denoising = reconstruction_loss(
                self.decoder,
                z,
                positive_out.hidden_states[0],  # (batch_size, seq_len, d), embedding-layer output
                positive["input_ids"],  # (batch_size, seq_len)
                self.pad_token_id,
            )
        loss = denosent_loss(contrastive, denoising, self.contrastive_weight, self.denoising_weight)
        return {
            "loss": loss,
            "contrastive": contrastive.detach(),
            "denoising": denoising.detach(),
        }
