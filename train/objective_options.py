"""The options each objective accepts (``train.recipes.<objective>.options``), typed, without torch.

Declared apart from the objectives' package (``train/objectives/``, which imports torch) so that
params are checked before anything heavy loads: ``pairforge profile check`` and the start of ``pairforge train``
reject an unknown objective, a misspelt option or a wrong type in one line, before any model.

One class per objective, ``<Objective>Options``, registered in :data:`OPTIONS` under the
objective's name. Its fields are the constructor arguments that a recipe may set, with the
constructor's types and defaults; what the trainer provides (``hidden_size``, ``tokenizer``,
``encoder``, ``start_pooling``, the MLM head, ...) is not an option. A new option is a new field
here beside the constructor argument; a new objective is a new class and an entry in
:data:`OPTIONS`. ``tests/train/test_objective_options.py`` checks every class against its objective's
constructor, so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pairforge.pipeline.plumbing.errors import ConfigError
from pairforge.pipeline.science.models.pooling import DEFAULT_PROMPT
from pydantic import BaseModel, ConfigDict, Field

# Poolings an objective can train without a prompt; None: the start model's own, else the paper's.
TrainablePooling = Literal["cls", "cls_before_pooler", "mean"]
NegativeSpace = Literal["normalised", "raw"]


class ObjectiveOptions(BaseModel):
    """Base of the option classes: unknown options are errors, and values are checked as they
    are (strict: no "0.05" string made a float), since the trainer passes them on unchanged."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class SimCSEOptions(ObjectiveOptions):
    temperature: float = Field(0.05, gt=0)
    pooling: TrainablePooling | None = None


class SimCSEHardNegativesOptions(SimCSEOptions):
    """SimCSE's options: the objective is SimCSE with more negatives in the loss."""


class SimCSETranslationOptions(SimCSEOptions):
    """SimCSE's options: the objective is SimCSE with a translation as the positive."""


class DebCSEOptions(ObjectiveOptions):
    temperature: float = Field(0.05, gt=0)
    positive_in_denominator: bool = True
    negative_space: NegativeSpace = "normalised"
    pooling: TrainablePooling | None = None


class DenoSentOptions(ObjectiveOptions):
    num_decoder_layers: int = Field(16, ge=1)
    num_decoder_heads: int = Field(1, ge=1)
    decoder_feedforward: int = Field(2048, ge=1)
    decoder_dropout: float = Field(0.1, ge=0, lt=1)
    noise_dropout: float = Field(0.825, ge=0, lt=1)
    temperature: float = Field(0.05, gt=0)
    contrastive_weight: float = Field(5.0, ge=0)
    denoising_weight: float = Field(7.0, ge=0)
    template: str = DEFAULT_PROMPT


class BSLOptions(ObjectiveOptions):
    k: int = Field(8, ge=1)
    num_mlps: int = Field(1, ge=1)
    delta: float = Field(0.999, ge=0, le=1)
    pooling: TrainablePooling | None = None


class InfoCSEOptions(ObjectiveOptions):
    aux_path: str | None = None
    lower_layers: int | None = Field(None, ge=1)
    head_layers: int = Field(2, ge=1)
    temperature: float = Field(0.05, gt=0)
    mlm_weight: float = Field(1e-5, ge=0)
    mask_rate: float = Field(0.4, gt=0, le=1)
    pooling: TrainablePooling | None = None


class CoTBERTOptions(ObjectiveOptions):
    templates: Literal["auto", "bert", "roberta"] | list[str] = "auto"
    temperature: float = Field(0.05, gt=0)
    denoise: bool = True
    denoise_grad: bool = True
    positive_negative: bool = True
    mlp: bool = True


class CombinedOptions(ObjectiveOptions):
    temperature: float = Field(0.05, gt=0)
    positive_in_denominator: bool = True
    negative_space: NegativeSpace = "normalised"
    pooling: TrainablePooling | None = None
    denoising_weight: float = Field(1.0, ge=0)
    num_decoder_layers: int = Field(16, ge=1)
    num_decoder_heads: int = Field(1, ge=1)
    decoder_feedforward: int = Field(2048, ge=1)
    decoder_dropout: float = Field(0.1, ge=0, lt=1)
    noise_dropout: float = Field(0.825, ge=0, lt=1)


# objective name (``train.objective``, the key of ``train.recipes``) -> its options.
OPTIONS: dict[str, type[ObjectiveOptions]] = {
    "simcse": SimCSEOptions,
    "simcse_hn": SimCSEHardNegativesOptions,
    "simcse_bt": SimCSETranslationOptions,
    "debcse": DebCSEOptions,
    "denosent": DenoSentOptions,
    "bsl": BSLOptions,
    "infocse": InfoCSEOptions,
    "cotbert": CoTBERTOptions,
    "combined": CombinedOptions,
}


def check_options(objective: str, options: Mapping[str, Any], key: str) -> ObjectiveOptions:
    """``options`` validated for ``objective`` (a name in :data:`OPTIONS`); a ConfigError naming
    ``key`` otherwise: an unknown option with the accepted ones, or the first invalid value."""
    from pairforge.pipeline.plumbing.config import validate_section

    model = OPTIONS[objective]
    unknown = sorted(set(options) - set(model.model_fields))
    if unknown:
        raise ConfigError(
            f"{key}: unknown option {unknown[0]!r} (accepted: {', '.join(model.model_fields)})"
        )
    return validate_section(key, model, dict(options))
