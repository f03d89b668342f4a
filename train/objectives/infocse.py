"""InfoCSE: SimCSE plus an auxiliary MLM network fed by the [CLS] vector (EMNLP Findings 2022).

Equation numbers refer to the InfoCSE paper (``shared/papers/001_*.txt``); facts about the
authors' code come from METHODS.md section 3 and their public training script.

- Contrastive (eq. 3): unsupervised SimCSE over ``columns.TEXT`` (two dropout views, in-batch
  negatives, Linear+Tanh MLP over [CLS] in training only). Evaluation reads the final-layer
  [CLS] before that MLP (``pooling = "cls_before_pooler"``, the paper's Table 9).
- Auxiliary MLM (section 3.2): the sentence is masked (rate 40%, BERT's 80/10/10 replacement,
  special tokens never masked), encoded by the frozen lower layers of the auxiliary network
  (``train/infocse_aux.py``), and its tokens are predicted by the 2 trainable layers over
  concat(the encoder's final [CLS] of the first view, the lower states except [CLS], detached).
  The gradient of this loss reaches the encoder only through that [CLS] vector.
- Total (eq. 7): ``contrastive + λ * mlm`` with λ = 1e-5 (Table 8).
- Pooling (the ``pooling`` option, as SimCSE's): default the start model's own, else the
  paper's ``cls_before_pooler``. With another pooling the pooled vector is what feeds the
  auxiliary network in place of [CLS] (the sentence representation, as section 3.2 intends), and
  the MLP is dropped as in SimCSE (``simcse.training_head``).

The auxiliary network should be pre-trained first (``pairforge pretrain``; without it STS-B dev
drops 85.49 -> 83.73, Table 4): pass its folder as ``aux_path``. Without one the network is the
encoder's own lower and top layers (the paper's "w/o pre-training" ablation) and a warning says so;
an encoder without an MLM head (MiniLM) gets a newly initialised head, also with a warning.
``InfoCSE.init_report`` records all of it (flags ``aux_pretrained``, ``mlm_head_initialised``)
for the trainer's metrics.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from pairforge.pipeline.plumbing.errors import ConfigError
from pairforge.pipeline.science.models import head_is_untrained
from pairforge.train.infocse_aux import (  # noqa: F401 - mask_tokens re-exported with the objective
    AuxiliaryMLM,
    encoder_layers,
    load_auxiliary,
    mask_tokens,
)
from pairforge.train.objective_options import Count, NonNegative, Positive, Share, TrainablePooling
from pairforge.train.objectives import columns
from pairforge.train.objectives.base import (
    Batch,
    Encoder,
    Objective,
    choose_pooling,
    pool_features,
)
from pairforge.train.objectives.simcse import simcse_loss, training_head
from torch import nn

log = logging.getLogger("pairforge")

PAPER_LOWER_LAYERS = 6


def infocse_loss(contrastive: torch.Tensor, mlm: torch.Tensor, mlm_weight: float) -> torch.Tensor:
    """Joint loss of eq. 7: ``contrastive + λ * mlm``."""
    return contrastive + mlm_weight * mlm  # eq. 7


class InfoCSE(Objective):
    """SimCSE + the auxiliary MLM network over ``columns.TEXT``: see the module docstring.

    The auxiliary network comes from ``aux_path`` (a pre-trained one, ``pairforge pretrain``) or,
    without it, from copies of ``encoder``'s layers and of ``mlm_head`` (the encoder checkpoint's
    MLM head; None, or a head still at its initial values, gets a new head). ``lower_layers``
    defaults to the paper's 6, or half the encoder's layers when it has fewer. ``mlm_weight=0``
    trains plain SimCSE. What was sourced how is in :attr:`init_report`, each fallback also a
    logged warning.
    """

    name = "infocse"
    columns = (columns.TEXT,)
    pooling = "cls_before_pooler"

    def __init__(
        self,
        hidden_size: int,
        tokenizer: Any,
        encoder: nn.Module | None = None,
        config: Any = None,
        mlm_head: nn.Module | None = None,
        aux_path: str | None = None,
        lower_layers: Count | None = None,
        head_layers: Count = 2,
        temperature: Positive = 0.05,
        mlm_weight: NonNegative = 1e-5,
        mask_rate: Share = 0.4,
        pooling: TrainablePooling | None = None,
        start_pooling: str | None = None,
    ) -> None:
        super().__init__()
        if not 0.0 < mask_rate <= 1.0:
            raise ValueError(f"InfoCSE mask_rate must be in (0, 1], got {mask_rate}")
        if tokenizer.mask_token_id is None:
            raise ValueError("InfoCSE needs a tokenizer with a mask token")
        self.pooling = choose_pooling(self.name, pooling, start_pooling, type(self).pooling)
        self.pooler = training_head(hidden_size, self.pooling)
        self.special_token_ids = sorted(set(tokenizer.all_special_ids))
        self.mask_token_id = int(tokenizer.mask_token_id)
        self.vocab_size = len(tokenizer)
        self.temperature = temperature
        self.mlm_weight = mlm_weight
        self.mask_rate = mask_rate
        self.auxiliary: AuxiliaryMLM | None = None
        self.init_report: dict[str, Any] = {"mlm_weight": mlm_weight}
        if mlm_weight != 0:
            config = config if config is not None else getattr(encoder, "config", None)
            self.auxiliary, report = _source_auxiliary(
                encoder, config, mlm_head, aux_path, lower_layers, head_layers
            )
            self.init_report.update(report)
            for warning in report["warnings"]:
                log.warning("infocse: %s", warning)

    def forward(self, batch: Batch, encoder: Encoder) -> dict[str, torch.Tensor]:
        features = batch[columns.TEXT]
        batch_size = features["input_ids"].shape[0]
        # SimCSE's two dropout views in one pass over the batch stacked twice.
        doubled = {key: torch.cat([value, value]) for key, value in features.items()}
        # (2 * batch_size, d): with cls_before_pooler the final-layer [CLS] before the MLP
        cls, _ = pool_features(encoder, doubled, self.pooling)
        z1, z2 = self.pooler(cls).chunk(2)  # (batch_size, d) each
        contrastive = simcse_loss(z1, z2, self.temperature)  # eq. 3
        mlm = accuracy = contrastive.new_zeros(())
        if self.auxiliary is not None:
            masked, labels = mask_tokens(
                features["input_ids"],
                features["attention_mask"],
                self.special_token_ids,
                self.mask_token_id,
                self.vocab_size,
                self.mask_rate,
            )
            mlm, accuracy = self.auxiliary(  # section 3.2
                cls[:batch_size],
                masked,
                features["attention_mask"],
                labels,
                features.get("token_type_ids"),
            )
        loss = infocse_loss(contrastive, mlm, self.mlm_weight)
        return {
            "loss": loss,
            "contrastive": contrastive.detach(),
            "mlm": mlm.detach(),
            "mlm_accuracy": accuracy.detach(),
        }


def _source_auxiliary(
    encoder: nn.Module | None,
    config: Any,
    mlm_head: nn.Module | None,
    aux_path: str | None,
    lower_layers: int | None,
    head_layers: int,
) -> tuple[AuxiliaryMLM, dict[str, Any]]:
    """The auxiliary network and a report of where its parts came from (with warnings)."""
    warnings: list[str] = []
    if aux_path:
        if config is None:
            raise ConfigError("InfoCSE with aux_path needs the encoder's config")
        auxiliary, meta = load_auxiliary(aux_path, config)
        if lower_layers is not None and lower_layers != meta["lower_layers"]:
            raise ConfigError(
                f"InfoCSE lower_layers={lower_layers}, but the auxiliary network in "
                f"{aux_path!r} was pre-trained with {meta['lower_layers']}"
            )
        initialised = bool(meta.get("mlm_head_initialised", False))
        if initialised:
            warnings.append(
                f"the auxiliary network in {aux_path!r} was pre-trained from a newly initialised "
                "MLM head (its encoder checkpoint had none)"
            )
        return auxiliary, {
            "aux_pretrained": True,
            "aux_path": str(aux_path),
            "mlm_head": "pretrained_aux",
            "mlm_head_initialised": initialised,
            "lower_layers": meta["lower_layers"],
            "warnings": warnings,
        }
    if encoder is None:
        raise ConfigError("InfoCSE without aux_path needs the encoder to copy its layers from")
    n_layers = len(encoder_layers(encoder))
    if lower_layers is None:
        lower_layers = PAPER_LOWER_LAYERS
        if n_layers < PAPER_LOWER_LAYERS:
            lower_layers = max(1, n_layers // 2)
            warnings.append(
                f"the encoder has {n_layers} layers, fewer than the paper's {PAPER_LOWER_LAYERS}: "
                f"the auxiliary network uses the lower {lower_layers}"
            )
    if mlm_head is not None and head_is_untrained(mlm_head):
        mlm_head = None
    auxiliary = AuxiliaryMLM.from_encoder(encoder, lower_layers, head_layers, mlm_head)
    warnings.append(
        "the auxiliary MLM network is not pre-trained (no aux_path): it starts from the "
        "encoder's lower and top layers (the paper reports STS-B dev 85.49 -> 83.73 without "
        "pre-training; run `pairforge pretrain`)"
    )
    if mlm_head is None:
        warnings.append(
            "the encoder checkpoint has no MLM head: the auxiliary MLM head is newly initialised "
            "(output projection copied from the word embeddings)"
        )
    return auxiliary, {
        "aux_pretrained": False,
        "aux_path": None,
        "mlm_head": "encoder" if mlm_head is not None else "initialised",
        "mlm_head_initialised": mlm_head is None,
        "lower_layers": lower_layers,
        "warnings": warnings,
    }
