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

What the trainer (``train/loop.py``) reads from an objective class, so that a new objective plugs
in by subclassing and registering, with no change to the trainer:

- ``columns``: the training-data columns it reads (checked before training starts).
- ``pooling``: how the *trained encoder* turns a sentence into its vector at evaluation, in the
  dev evaluation during training and in the exported sentence-transformers model: one of
  ``pipeline.science.models.POOLINGS`` (``cls``, ``cls_before_pooler``, ``mean``, ``mask``). Training-only
  heads (projectors, MLPs, BatchNorm, predictors) are never part of it. Objectives whose paper
  leaves the pooling open (SimCSE, DebCSE, InfoCSE, BSL) take it as the ``pooling`` option, one of
  :data:`TRAINABLE_POOLINGS`, and default to the start model's own (``start_pooling``, read from
  its sentence-transformers config) through :func:`choose_pooling`; prompt objectives (DenoSent,
  CoT-BERT) keep ``mask``, which is part of their method. The trainer logs once when the pooling
  trained differs from the start model's.
- ``prompt``: for ``mask`` pooling, the template (``[X]`` = the sentence, ``[MASK]`` = the mask
  token) whose last [MASK] state is the sentence vector; ``None`` otherwise. An instance may set
  its own (e.g. from a constructor argument).
- ``sample_one``: list-valued columns of which the collator passes *one* item per row, drawn at
  random (seeded by step), shaped ``(batch_size, seq_len)``; other list columns are passed whole,
  ``(batch_size, n, seq_len)``, rows with fewer items cycling their own.
- :meth:`Objective.tokenize`: how the texts of one column become encoder inputs; the default
  applies ``prompt`` when there is one (sentence truncated to ``max_length`` tokens, then
  wrapped) and plain truncation to ``max_length`` otherwise. Override it for per-column templates.
- :meth:`Objective.build`: construction from a :class:`BuildContext`. The default fills each
  constructor argument from the ``options`` params first, then by name from the context:
  ``hidden_size``, ``encoder`` (the online encoder), ``tokenizer``, ``config`` (the encoder's
  Hugging Face config), ``mask_token_id``, ``pad_token_id``, ``vocab_size``, ``start_pooling``
  (the start model's pooling, ``None`` when its folder does not say) and ``output_head`` /
  ``mlm_head`` (the pretrained MLM head; asking for it makes the trainer load the masked-LM
  variant of the model: :meth:`Objective.wants_mlm_head`). An option that names no constructor
  argument is a ConfigError that lists the allowed ones.
- :meth:`Objective.after_optimizer_step`: called after every optimiser step (BSL's EMA).

State that must survive a resume (target networks, running statistics) lives in the module's
``state_dict``, which the trainer checkpoints with the encoder.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, get_args

import torch
from pairforge.train.objective_options import TrainablePooling
from pairforge.train.objectives.prompts import build_prompt_inputs
from torch import nn

Features = Mapping[str, torch.Tensor]
Batch = Mapping[str, Features]
Encoder = Callable[..., Any]

# Keys of a column's features that are passed on to the encoder; anything else a collator adds
# (offsets, lengths) stays out of the encoder call.
ENCODER_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# Constructor argument names through which an objective asks for the pretrained MLM head.
MLM_HEAD_ARGUMENTS = frozenset({"output_head", "mlm_head"})
# Poolings an objective can train without a prompt (``mask`` needs one: DenoSent, CoT-BERT).
TRAINABLE_POOLINGS: tuple[str, ...] = get_args(TrainablePooling)


@dataclass
class BuildContext:
    """What the trainer offers an objective's constructor (see :meth:`Objective.build`).

    ``mlm_head`` is the masked-LM head of the pretrained model (``BertForMaskedLM.cls``), or
    ``None`` when the objective did not ask for it. ``start_pooling`` is the start model's own
    pooling (``pipeline.science.models.POOLINGS``) when its folder declares one (a sentence-transformers
    Pooling module or a pairforge export), else ``None``.
    """

    encoder: Any
    tokenizer: Any
    mlm_head: Any = None
    start_pooling: str | None = None

    def arguments(self) -> dict[str, Any]:
        config = self.encoder.config
        provided = {
            "encoder": self.encoder,
            "tokenizer": self.tokenizer,
            "config": config,
            "hidden_size": int(config.hidden_size),
            "vocab_size": int(config.vocab_size),
            "mask_token_id": self.tokenizer.mask_token_id,
            "pad_token_id": self.tokenizer.pad_token_id,
            "start_pooling": self.start_pooling,
        }
        if self.mlm_head is not None:
            provided.update(output_head=self.mlm_head, mlm_head=self.mlm_head)
        return provided


class Objective(nn.Module):
    """Base class of the training objectives: see the module docstring for the contract."""

    name: ClassVar[str]
    columns: ClassVar[tuple[str, ...]]
    pooling: str = "cls_before_pooler"
    prompt: str | None = None
    sample_one: ClassVar[tuple[str, ...]] = ()

    def forward(self, batch: Batch, encoder: Encoder) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def tokenize(
        self, tokenizer: Any, column: str, texts: Sequence[str], max_length: int
    ) -> dict[str, torch.Tensor]:
        """Encoder inputs for the ``texts`` of ``column``, ``(len(texts), seq_len)`` tensors."""
        if self.prompt is not None:
            return dict(build_prompt_inputs(tokenizer, texts, self.prompt, max_length))
        return dict(
            tokenizer(
                list(texts),
                padding=True,
                truncation=True,
                max_length=max_length,
                return_tensors="pt",
            )
        )

    @classmethod
    def wants_mlm_head(cls) -> bool:
        """True when the constructor takes the pretrained MLM head (``output_head``/``mlm_head``)."""
        return bool(set(inspect.signature(cls.__init__).parameters) & MLM_HEAD_ARGUMENTS)

    @classmethod
    def build(cls, context: BuildContext, options: Mapping[str, Any]) -> Objective:
        """The objective for ``context``, constructor arguments from ``options`` then the context.

        Raises ValueError naming the objective and the allowed options for an option that is not
        a constructor argument, or for a required argument that neither provides.
        """
        parameters = dict(inspect.signature(cls.__init__).parameters)
        parameters.pop("self", None)
        provided = context.arguments()
        unknown = sorted(set(options) - set(parameters))
        allowed = sorted(set(parameters) - set(provided))
        if unknown:
            raise ValueError(
                f"objective {cls.name!r}: unknown option(s) {unknown}; allowed options: {allowed}"
            )
        kwargs: dict[str, Any] = {}
        for name, parameter in parameters.items():
            if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                continue
            if name in options:
                kwargs[name] = options[name]
            elif name in provided:
                kwargs[name] = provided[name]
            elif parameter.default is inspect.Parameter.empty:
                raise ValueError(f"objective {cls.name!r}: option {name!r} is required")
        return cls(**kwargs)

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


def choose_pooling(
    objective: str, requested: str | None, start_pooling: str | None, paper_default: str
) -> str:
    """The pooling an objective trains with: the ``pooling`` option when given, else the start
    model's own when it is one of :data:`TRAINABLE_POOLINGS`, else the paper's default.

    Raises ValueError naming the objective and the allowed values for any other option value.
    """
    if requested is not None:
        if requested not in TRAINABLE_POOLINGS:
            raise ValueError(
                f"objective {objective!r}: pooling {requested!r} is not one of "
                f"{', '.join(TRAINABLE_POOLINGS)} (leave it out to keep the start model's)"
            )
        return requested
    if start_pooling in TRAINABLE_POOLINGS:
        return start_pooling
    return paper_default


def pool_features(
    encoder: Encoder, features: Features, pooling: str, output_hidden_states: bool = False
) -> tuple[torch.Tensor, Any]:
    """(sentence vectors, encoder output) of one column with ``pooling`` (not ``mask``).

    The vectors are ``(batch_size, dim)``, or ``(batch_size * n, dim)`` for a list-valued column
    (:func:`run_encoder` flattens it); they are what the evaluator computes for the same pooling
    (``pipeline.science.models.pool``), so training and evaluation read the same vector.
    """
    from pairforge.pipeline.science.models import pool

    outputs = run_encoder(encoder, features, output_hidden_states=output_hidden_states)
    mask = features["attention_mask"]
    mask = mask.reshape(-1, mask.shape[-1])  # (batch_size [* n], seq_len)
    return pool(outputs, mask, pooling), outputs


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
