"""CoT-BERT: two-stage prompts, [PAD] template denoising and an extended InfoNCE (seed 003).

Equation numbers refer to the CoT-BERT paper (``shared/papers/003_*.txt``); facts about the
authors' code come from METHODS.md section 3 and their public training scripts.

- Three templates wrap each sentence (Table 1): anchor, positive and hard negative. The positive
  and the negative are the *same* sentence in another template, so the objective reads only
  ``columns.TEXT``. The sentence vector is the encoder's output at the template's **last**
  [MASK] (the "summarized as [MASK]" stage).
- [PAD] template denoising (section 3.3, training only): the template with ``[X]`` replaced by
  as many [PAD] tokens as the sentence has, attention 1 on them and 0 on the padded tail, is
  encoded too; its last-[MASK] vector is subtracted from the sentence vector.
- Extended InfoNCE (eq. 3): the denominator holds anchor-positive, anchor-negative and
  positive-negative terms; as in the code, logits = cat(sim(z1, z2), sim(z1, z3), sim(z2, z3)) / τ
  of shape [B, 3B] with labels ``arange(B)``.

Inputs are built at the token level: the sentence is tokenized alone, cut to
the trainer's ``max_length`` (the authors' 32) and spliced between the template's prefix and suffix
tokens, so a template is never truncated and the [MASK] positions are known without a search.
:func:`prepare_templates` takes what it needs from the tokenizer once; :func:`build_template_inputs`
(through :meth:`CoTBERT.tokenize`, which the trainer's collator calls) turns raw text into the
three template inputs.

Choices, each a constructor argument (defaults follow the authors' training command):

- ``templates``: ``"bert"`` (Table 1), ``"roberta"`` (the code's RoBERTa variants: single quotes
  set off by spaces), ``"auto"`` (by the encoder's ``model_type``) or three template strings.
- ``mlp``: SimCSE's Linear+Tanh over the denoised vector, in training only (code: on).
- ``denoise_grad``: the template pass is part of the graph (code: on, ``delta_freeze`` off).
- ``positive_negative``: the sim(z2, z3) block of eq. 3 (Table 4 ablation: off).
- Evaluation (``pooling = "mask"``, ``CoTBERT.prompt``) uses the anchor template without
  denoising and without the MLP, as the authors' evaluation does.
- Byte-level BPE (RoBERTa): where the template has a space before ``[X]``, the sentence is
  tokenized with that space, so training tokens equal those of the string-level prompt wrapping
  the evaluator uses (``pipeline.science.models.wrap_prompt``). The authors' code drops that space.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from pairforge.train.objective_options import Positive, Templates
from pairforge.train.objectives import columns
from pairforge.train.objectives.base import Batch, Encoder, Features, Objective, run_encoder
from pairforge.train.objectives.simcse import SimCSEPooler, cosine_matrix

SENTENCE_SLOT = "[X]"
MASK_SLOT = "[MASK]"

# Table 1 of the paper, in order anchor, positive, hard negative.
BERT_TEMPLATES = (
    'The sentence of "[X]" means [MASK], so it can be summarized as [MASK].',
    'The sentence : "[X]" means [MASK], so it can be summarized as [MASK].',
    'The sentence : "[X]" does not mean [MASK], so it cannot be summarized as [MASK].',
)
# The authors' RoBERTa training script: the same words, single quotes set off by spaces.
ROBERTA_TEMPLATES = (
    "The sentence of ' [X] ' means [MASK] , so it can be summarized as [MASK] .",
    "The sentence : ' [X] ' means [MASK] , so it can be summarized as [MASK] .",
    "The sentence : ' [X] ' does not mean [MASK] , so it cannot be summarized as [MASK] .",
)
TEMPLATE_SETS: dict[str, tuple[str, str, str]] = {
    "bert": BERT_TEMPLATES,
    "roberta": ROBERTA_TEMPLATES,
}
# Encoders whose tokenizer is byte-level BPE with RoBERTa's conventions.
ROBERTA_MODEL_TYPES = frozenset(
    {
        "roberta",
        "xlm-roberta",
        "xlm-roberta-xl",
        "camembert",
        "data2vec-text",
        "roberta-prelayernorm",
    }
)


def resolve_templates(
    templates: str | Sequence[str], model_type: str | None = None
) -> tuple[str, str, str]:
    """The (anchor, positive, negative) template strings for a config value.

    ``templates`` is ``"bert"``, ``"roberta"``, ``"auto"`` (``"roberta"`` for RoBERTa-family
    ``model_type``, else ``"bert"``) or a sequence of three strings, each with one ``[X]`` and
    a ``[MASK]`` after it.
    """
    if isinstance(templates, str):
        key = templates
        if key == "auto":
            key = "roberta" if model_type in ROBERTA_MODEL_TYPES else "bert"
        if key not in TEMPLATE_SETS:
            raise ValueError(
                f"CoT-BERT templates {templates!r}: allowed auto, bert, roberta or three strings"
            )
        return TEMPLATE_SETS[key]
    found = tuple(templates)
    if len(found) != 3:
        raise ValueError(
            f"CoT-BERT needs 3 templates (anchor, positive, negative), got {len(found)}"
        )
    for template in found:
        if template.count(SENTENCE_SLOT) != 1:
            raise ValueError(f"CoT-BERT template needs exactly one {SENTENCE_SLOT}: {template!r}")
        if MASK_SLOT not in template.split(SENTENCE_SLOT, 1)[1]:
            raise ValueError(
                f"CoT-BERT template needs a {MASK_SLOT} after {SENTENCE_SLOT}: {template!r}"
            )
    return found  # type: ignore[return-value]


@dataclass(frozen=True)
class TemplateTokens:
    """One template as token ids around the sentence slot.

    ``prefix`` includes the tokenizer's leading special tokens ([CLS] / <s>), ``suffix`` its
    trailing ones; ``mask_offset`` is the index in ``suffix`` of the template's last mask token.
    ``space_before_sentence``: tokenize the sentence with a leading space (see module docstring).
    """

    text: str
    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    mask_offset: int
    space_before_sentence: bool

    def ids(self, sentence_ids: Sequence[int]) -> list[int]:
        return [*self.prefix, *sentence_ids, *self.suffix]

    def mask_position(self, n_sentence_tokens: int) -> int:
        """Index of the last [MASK] in the input built around ``n_sentence_tokens`` tokens."""
        return len(self.prefix) + n_sentence_tokens + self.mask_offset


def _special_ends(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts before and after a single sequence."""
    probe = tokenizer("a", return_special_tokens_mask=True)
    ids, special = probe["input_ids"], probe["special_tokens_mask"]
    front = next((i for i, flag in enumerate(special) if not flag), len(ids))
    back = next((i for i, flag in enumerate(reversed(special)) if not flag), 0)
    return list(ids[:front]), list(ids[len(ids) - back :])


def prepare_templates(
    tokenizer: Any, templates: Sequence[str] = BERT_TEMPLATES
) -> tuple[TemplateTokens, ...]:
    """Tokenize each template once: the token ids before and after ``[X]``."""
    front, back = _special_ends(tokenizer)
    prepared = []
    for template in templates:
        head, tail = (
            part.replace(MASK_SLOT, tokenizer.mask_token) for part in template.split(SENTENCE_SLOT)
        )
        space = head[-1:].isspace()
        head_ids = tokenizer(head.rstrip() if space else head, add_special_tokens=False)
        tail_ids = tokenizer(tail, add_special_tokens=False)["input_ids"]
        masks = [i for i, token in enumerate(tail_ids) if token == tokenizer.mask_token_id]
        if not masks:
            raise ValueError(f"CoT-BERT template {template!r}: no mask token after {SENTENCE_SLOT}")
        prepared.append(
            TemplateTokens(
                text=template,
                prefix=tuple(front + head_ids["input_ids"]),
                suffix=tuple(tail_ids + back),
                mask_offset=masks[-1],
                space_before_sentence=space,
            )
        )
    return tuple(prepared)


def sentence_token_ids(
    tokenizer: Any, sentences: Sequence[str], max_tokens: int = 32, space_before: bool = False
) -> list[list[int]]:
    """Each sentence's token ids without special tokens, cut after ``max_tokens`` tokens."""
    texts = [f" {s}" if space_before else s for s in sentences]
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [ids[:max_tokens] for ids in encoded]


def build_template_inputs(
    sentence_ids: Sequence[Sequence[int]],
    templates: Sequence[TemplateTokens],
    pad_token_id: int,
) -> dict[str, torch.Tensor]:
    """The sentences wrapped in every template, padded to one length so the templates stack.

    Returns ``input_ids`` and ``attention_mask`` of shape ``(batch_size, n_templates, seq_len)``,
    ``token_type_ids`` (zeros, same shape), ``mask_positions`` ``(batch_size, n_templates)``: the
    index of each input's last [MASK], and ``sentence_lengths`` ``(batch_size,)``.
    """
    rows = [[template.ids(ids) for template in templates] for ids in sentence_ids]
    seq_len = max((len(ids) for row in rows for ids in row), default=0)
    input_ids = torch.full((len(rows), len(templates), seq_len), pad_token_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    for b, row in enumerate(rows):
        for t, ids in enumerate(row):
            input_ids[b, t, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            attention[b, t, : len(ids)] = 1
    lengths = torch.tensor([len(ids) for ids in sentence_ids], dtype=torch.long)
    positions = torch.tensor(
        [[template.mask_position(len(ids)) for template in templates] for ids in sentence_ids],
        dtype=torch.long,
    ).reshape(len(rows), len(templates))
    return {
        "input_ids": input_ids,
        "attention_mask": attention,
        "token_type_ids": torch.zeros_like(input_ids),
        "mask_positions": positions,
        "sentence_lengths": lengths,
    }


def build_pad_template_inputs(
    lengths: Sequence[int], template: TemplateTokens, pad_token_id: int
) -> dict[str, torch.Tensor]:
    """The template with ``[X]`` replaced by ``n`` [PAD] tokens, one row per ``n`` in ``lengths``.

    Attention is 1 on the template and on those [PAD]s, 0 on the padded tail (section 3.3), so
    position ids line up with the real sentence's. Returns ``input_ids``, ``attention_mask``,
    ``token_type_ids`` ``(n_rows, seq_len)`` and ``mask_positions`` ``(n_rows,)``.
    """
    rows = [template.ids([pad_token_id] * n) for n in lengths]
    seq_len = max((len(ids) for ids in rows), default=0)
    input_ids = torch.full((len(rows), seq_len), pad_token_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    for i, ids in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention[i, : len(ids)] = 1
    positions = torch.tensor([template.mask_position(n) for n in lengths], dtype=torch.long)
    return {
        "input_ids": input_ids,
        "attention_mask": attention,
        "token_type_ids": torch.zeros_like(input_ids),
        "mask_positions": positions,
    }


def extended_infonce(
    z1: torch.Tensor,
    z2: torch.Tensor,
    z3: torch.Tensor,
    temperature: float = 0.05,
    positive_negative: bool = True,
) -> torch.Tensor:
    """CoT-BERT's loss: row ``i`` of ``z1`` must pick row ``i`` of ``z2`` (eq. 3).

    ``z1``, ``z2``, ``z3``: anchors, positives, hard negatives, ``(batch_size, dim)``. The
    denominator sums a(i, j+) + a(i, j-) + a(i+, j-) over ``j``, with a = exp(cos / τ); without
    ``positive_negative`` the a(i+, j-) block is left out (Table 4's ablation). Mean over the batch.
    """
    blocks = [cosine_matrix(z1, z2), cosine_matrix(z1, z3)]  # (batch_size, batch_size) each
    if positive_negative:
        blocks.append(cosine_matrix(z2, z3))
    logits = torch.cat(blocks, dim=1) / temperature  # (batch_size, 3 * batch_size)
    labels = torch.arange(z1.shape[0], device=z1.device)  # (batch_size,)
    return F.cross_entropy(logits, labels)  # eq. 3


def gather_rows(hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``hidden[i, positions[i]]``: ``(n, seq_len, dim), (n,) -> (n, dim)``."""
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), positions]


class CoTBERT(Objective):
    """CoT-BERT over ``columns.TEXT``: see the module docstring.

    ``tokenizer`` is the encoder's tokenizer (a fast one): the templates are tokenized with it
    once, and :meth:`tokenize` turns a batch of sentences into the three template inputs.
    ``config`` (the encoder's Hugging Face config) picks the template set when ``templates`` is
    ``"auto"``.
    """

    name = "cotbert"
    columns = (columns.TEXT,)
    pooling = "mask"

    def __init__(
        self,
        hidden_size: int,
        tokenizer: Any,
        config: Any = None,
        templates: Templates = "auto",
        temperature: Positive = 0.05,
        denoise: bool = True,
        denoise_grad: bool = True,
        positive_negative: bool = True,
        mlp: bool = True,
    ) -> None:
        super().__init__()
        if tokenizer.mask_token_id is None or tokenizer.pad_token_id is None:
            raise ValueError("CoT-BERT needs a tokenizer with a mask token and a pad token")
        self.template_texts = resolve_templates(templates, getattr(config, "model_type", None))
        self.templates = prepare_templates(tokenizer, self.template_texts)
        if len({template.space_before_sentence for template in self.templates}) != 1:
            raise ValueError(
                "CoT-BERT templates must agree on a space before [X]: the sentence is tokenized "
                "once for all three"
            )
        # Evaluation reads the anchor template's last [MASK], without denoising or the MLP.
        self.prompt = self.template_texts[0]
        self.pad_token_id = int(tokenizer.pad_token_id)
        self.temperature = temperature
        self.denoise = denoise
        self.denoise_grad = denoise_grad
        self.positive_negative = positive_negative
        self.pooler = SimCSEPooler(hidden_size) if mlp else None

    def tokenize(
        self, tokenizer: Any, column: str, texts: Sequence[str], max_length: int
    ) -> dict[str, torch.Tensor]:
        """The three template inputs of ``texts``: :func:`build_template_inputs`.

        Each sentence is cut after ``max_length`` tokens (the authors' 32) before wrapping, so
        the templates are never truncated. Shapes ``(batch_size, 3, seq_len)``, plus
        ``mask_positions`` ``(batch_size, 3)`` and ``sentence_lengths`` ``(batch_size,)``.
        """
        ids = sentence_token_ids(
            tokenizer, texts, max_length, self.templates[0].space_before_sentence
        )
        return build_template_inputs(ids, self.templates, self.pad_token_id)

    def template_vectors(self, lengths: torch.Tensor, encoder: Encoder) -> torch.Tensor:
        """The [PAD]-template vector of every template for every length in ``lengths``.

        Returns ``(n_templates, batch_size, dim)``; each distinct length is encoded once.
        """
        unique, inverse = torch.unique(lengths, return_inverse=True)
        inputs = [
            build_pad_template_inputs(unique.tolist(), template, self.pad_token_id)
            for template in self.templates
        ]
        seq_len = max(part["input_ids"].shape[1] for part in inputs)
        pads = {"input_ids": self.pad_token_id, "attention_mask": 0, "token_type_ids": 0}
        stacked = {
            key: torch.cat(
                [F.pad(part[key], (0, seq_len - part[key].shape[1]), value=pad) for part in inputs]
            ).to(lengths.device)
            for key, pad in pads.items()
        }
        positions = torch.cat([part["mask_positions"] for part in inputs]).to(lengths.device)
        with torch.set_grad_enabled(self.denoise_grad and torch.is_grad_enabled()):
            hidden = run_encoder(encoder, stacked).last_hidden_state  # (3 * n_unique, L, d)
            vectors = gather_rows(hidden, positions)  # (3 * n_unique, d)
        vectors = vectors.reshape(len(self.templates), len(unique), -1)
        return vectors[:, inverse]  # (n_templates, batch_size, d)

    def sentence_vectors(self, features: Features, encoder: Encoder) -> torch.Tensor:
        """Last-[MASK] vectors of the three template inputs, denoised when ``denoise`` is on.

        ``features``: :meth:`tokenize` output. Returns ``(batch_size, 3, dim)``, before the MLP.
        """
        if "mask_positions" not in features:
            raise ValueError(
                "CoT-BERT batches hold the three template inputs: build them with "
                "CoTBERT.tokenize (or build_template_inputs)"
            )
        batch_size, n_templates = features["mask_positions"].shape
        hidden = run_encoder(encoder, features).last_hidden_state  # (batch_size * 3, L, d)
        h = gather_rows(hidden, features["mask_positions"].reshape(-1))  # (batch_size * 3, d)
        h = h.reshape(batch_size, n_templates, -1)  # (batch_size, 3, d)
        if self.denoise:
            noise = self.template_vectors(features["sentence_lengths"], encoder)  # (3, B, d)
            h = h - noise.transpose(0, 1)  # section 3.3
        return h

    def forward(self, batch: Batch, encoder: Encoder) -> dict[str, torch.Tensor]:
        h = self.sentence_vectors(batch[columns.TEXT], encoder)  # (batch_size, 3, d)
        z = self.pooler(h) if self.pooler is not None else h  # (batch_size, 3, d)
        loss = extended_infonce(z[:, 0], z[:, 1], z[:, 2], self.temperature, self.positive_negative)
        return {"loss": loss, "contrastive": loss.detach()}
