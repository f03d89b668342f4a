"""Prompt templates: a sentence put into a template around a [MASK] whose state is its vector.

A template holds ``[X]`` (the sentence) and ``[MASK]`` (replaced by the tokenizer's mask token),
e.g. DenoSent's ``"[X]" means [MASK].``. Objectives with ``pooling = "mask"`` tokenise through
:func:`build_prompt_inputs`; the evaluator and the exported model use the same template.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pairforge.pipeline.science.models import cut_sentences

SENTENCE_SLOT = "[X]"
MASK_SLOT = "[MASK]"


def check_template(template: str) -> None:
    """ValueError unless ``template`` holds exactly one ``[X]`` and at least one ``[MASK]``."""
    if template.count(SENTENCE_SLOT) != 1 or MASK_SLOT not in template:
        raise ValueError(
            f"prompt template needs one {SENTENCE_SLOT} and a {MASK_SLOT}: {template!r}"
        )


def wrap(template: str, sentences: Sequence[str], mask_token: str) -> list[str]:
    """Each sentence put into the template, ``[MASK]`` spelled as the tokenizer's mask token."""
    check_template(template)
    head, tail = template.replace(MASK_SLOT, mask_token).split(SENTENCE_SLOT)
    return [f"{head}{sentence}{tail}" for sentence in sentences]


def build_prompt_inputs(
    tokenizer: Any,
    sentences: Sequence[str],
    template: str = '"[X]" means [MASK].',
    max_sentence_tokens: int = 32,
) -> Any:
    """Tokenizer output for ``sentences`` wrapped in the prompt, padded to the longest row.

    Each sentence is first truncated to ``max_sentence_tokens`` tokens, then put in the template's
    ``[X]``; the template's ``[MASK]`` becomes the tokenizer's mask token. Returns the tokenizer's
    ``BatchEncoding`` of ``(batch_size, seq_len)`` tensors.
    """
    check_template(template)
    texts = wrap(
        template,
        cut_sentences(tokenizer, sentences, max_sentence_tokens),
        tokenizer.mask_token,
    )
    return tokenizer(texts, padding=True, return_tensors="pt")
