"""Pooling: how an encoder's token states become one vector per sentence (``pool``).

- ``cls``: the [CLS] state through the model's pooler (BERT's Linear+Tanh) when it has one;
- ``cls_before_pooler``: the raw [CLS] state (SimCSE's evaluation setting);
- ``mean``: mean of the token states under the attention mask (BSL, sentence-transformers);
- ``mask``: the state at the **last** [MASK] token of a prompt (DenoSent, CoT-BERT); the text is
  first cut (``cut_sentences``) and wrapped in the prompt template (``wrap_prompt``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pairforge.pipeline.plumbing.errors import ConfigError

Pooling = Literal["cls", "cls_before_pooler", "mean", "mask"]
POOLINGS: tuple[str, ...] = ("cls", "cls_before_pooler", "mean", "mask")
# DenoSent's prompt; "[X]" is replaced by the sentence, "[MASK]" by the tokenizer's mask token.
DEFAULT_PROMPT = '"[X]" means [MASK].'


def check_pooling(pooling: str) -> None:
    """ConfigError naming the allowed poolings unless ``pooling`` is one of them."""
    if pooling not in POOLINGS:
        raise ConfigError(f"pooling {pooling!r}: allowed {', '.join(POOLINGS)}")


def wrap_prompt(texts: Sequence[str], template: str, mask_token: str) -> list[str]:
    """Each text put into ``template`` at ``[X]``, with ``[MASK]`` as the tokenizer's mask token."""
    if "[X]" not in template or "[MASK]" not in template:
        raise ConfigError(f"prompt template {template!r} must contain [X] and [MASK]")
    head, tail = template.replace("[MASK]", mask_token).split("[X]", 1)
    return [f"{head}{t}{tail}" for t in texts]


def cut_sentences(tokenizer: Any, sentences: Sequence[str], max_tokens: int) -> list[str]:
    """Each sentence cut after its first ``max_tokens`` tokens (special tokens not counted).

    The cut is made in the original string at the end offset of the last kept token, so casing
    and spacing survive, and a sentence that fits is returned as it is; this needs a fast
    (Rust-backed) tokenizer for the offsets. Cutting before wrapping keeps the prompt's [MASK]
    from being truncated away (DenoSent's code likewise truncates the sentence first).
    """
    encoded = tokenizer(
        list(sentences), add_special_tokens=False, return_offsets_mapping=True, truncation=False
    )
    cut = []
    for sentence, offsets in zip(sentences, encoded["offset_mapping"], strict=True):
        fits = len(offsets) <= max_tokens
        cut.append(sentence if fits else sentence[: offsets[max_tokens - 1][1]])
    return cut


def pool(
    outputs: Any,
    attention_mask: Any,
    pooling: Pooling,
    input_ids: Any = None,
    mask_token_id: int | None = None,
):
    """One vector per sentence from a transformers encoder output, ``(batch, dim)``.

    ``mask`` pooling needs ``input_ids`` and ``mask_token_id`` and takes the last mask position of
    each row; a row without one raises ValueError.
    """
    import torch

    hidden = outputs.last_hidden_state  # (batch, seq, dim)
    if pooling == "cls":
        pooled = getattr(outputs, "pooler_output", None)
        return pooled if pooled is not None else hidden[:, 0]
    if pooling == "cls_before_pooler":
        return hidden[:, 0]
    if pooling == "mean":
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (batch, seq, 1)
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    if pooling == "mask":
        if input_ids is None or mask_token_id is None:
            raise ValueError("mask pooling needs input_ids and mask_token_id")
        is_mask = input_ids == mask_token_id  # (batch, seq)
        if not bool(is_mask.any(1).all()):
            raise ValueError("mask pooling: a row has no mask token (was the prompt truncated?)")
        positions = torch.arange(is_mask.shape[1], device=is_mask.device).expand_as(is_mask)
        last = torch.where(is_mask, positions, -1).max(1).values  # (batch,)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    raise ConfigError(f"pooling {pooling!r}: allowed {', '.join(POOLINGS)}")
