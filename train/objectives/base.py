"""What every training objective shares: the calling convention and a few tensor helpers.

An objective is an ``nn.Module`` that owns only its training-time parts (heads, predictors,
decoders, target networks) and is called as ``objective(batch, encoder)``:

- ``batch`` maps each column the objective needs (``columns``) to the tokenizer output for that
  column: ``input_ids``, ``attention_mask`` and optionally ``token_type_ids``, each
  ``(batch_size, seq_len)``; list-valued columns add one axis, ``(batch_size, n, seq_len)``.
- ``encoder`` is a Hugging Face style encoder (e.g. ``BertModel``): called with those tensors as
  keyword arguments, it returns an object with ``last_hidden_state`` and, when asked for with
  ``output_hidden_states=True``, ``hidden_states``.

The result is a dict with the scalar ``loss`` to back-propagate and its detached parts for logging.
The maths lives in plain functions over tensors in each objective's module, so tests call them
without a model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

import torch
from torch import nn

Features = Mapping[str, torch.Tensor]
Batch = Mapping[str, Features]
Encoder = Callable[..., Any]

# Keys of a column's features that are passed on to the encoder; anything else a collator adds
# (offsets, lengths) stays out of the encoder call.
ENCODER_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class Objective(nn.Module):
    """Base class of the training objectives: see the module docstring for the contract."""

    name: ClassVar[str]
    columns: ClassVar[tuple[str, ...]]

    def forward(self, batch: Batch, encoder: Encoder) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def after_optimizer_step(self, encoder: Encoder) -> None:
        """Hook for the trainer to call after every optimiser step (BSL's EMA update)."""


def run_encoder(encoder: Encoder, features: Features, output_hidden_states: bool = False) -> Any:
    """Call ``encoder`` on one column's features, flattening a list axis if there is one.

    Features of shape ``(batch_size, n, seq_len)`` are encoded as ``(batch_size * n, seq_len)``;
    the caller reshapes the pooled result back.
    """
    inputs = {
        key: value.reshape(-1, value.shape[-1])
        for key, value in features.items()
        if key in ENCODER_INPUTS
    }
    return encoder(**inputs, output_hidden_states=output_hidden_states, return_dict=True)


def cls_pool(last_hidden_state: torch.Tensor) -> torch.Tensor:
    """The first token's vector, ``(batch_size, seq_len, dim) -> (batch_size, dim)``."""
    return last_hidden_state[:, 0]


def trainable_parameters(*modules: nn.Module) -> Iterator[nn.Parameter]:
    """Parameters of ``modules`` that require grad, each once.

    Objectives can share parameters with the encoder (DenoSent's output layer is the MLM head,
    tied to the word embeddings) and hold frozen ones (BSL's target network); an optimiser built
    from this iterator sees every trainable tensor exactly once.
    """
    seen: set[int] = set()
    for module in modules:
        for parameter in module.parameters():
            if parameter.requires_grad and id(parameter) not in seen:
                seen.add(id(parameter))
                yield parameter
