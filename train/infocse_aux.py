"""InfoCSE's auxiliary MLM network, shared by the objective and its pre-training.

The network (InfoCSE paper, ``shared/papers/001_*.txt``, Figure 1-b): the lower ``k`` Transformer
layers of the encoder (``k = 6`` of BERT-base's 12) encode the masked sentence; their states at
every position except [CLS] are concatenated after the encoder's *final-layer* [CLS] vector and
fed to 2 more Transformer layers, whose outputs predict the masked tokens through an MLM head.

- In joint training (:class:`AuxiliaryMLM`) the lower layers are a **frozen copy**, run without
  gradient, so the MLM gradient reaches the trained encoder only through its [CLS] vector.
- In pre-training (``stages/pretrain/infocse.py``) the lower layers are the backbone's own, and
  the head is shared with the backbone's MLM loss (eq. 6).

A pre-trained network is a folder (``models/infocse-aux`` in the pipeline): ``aux.safetensors``
(the lower layers with the embeddings, the 2 layers, the MLM head), ``aux_config.json`` (what it
was built for) and ``_manifest.json`` written last. The layers are the encoder's own classes
(BertLayer, RobertaLayer, ...), so any encoder with ``embeddings`` and ``encoder.layer`` works.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from pairforge.pipeline.plumbing.errors import ConfigError
from pairforge.pipeline.plumbing.files import apply_umask, atomic_write_json
from pairforge.pipeline.science.models import new_mlm_head
from torch import nn

AUX_FORMAT = "pairforge-infocse-aux"
AUX_FORMAT_VERSION = 1
AUX_WEIGHTS = "aux.safetensors"
AUX_CONFIG = "aux_config.json"
AUX_MANIFEST = "_manifest.json"
IGNORE_INDEX = -100


def encoder_layers(model: nn.Module) -> nn.ModuleList:
    """The Transformer layers of a BERT-style encoder (``model.encoder.layer``)."""
    layers = getattr(getattr(model, "encoder", None), "layer", None)
    if not isinstance(layers, nn.ModuleList) or not hasattr(model, "embeddings"):
        raise ConfigError(
            f"InfoCSE needs a BERT-style encoder (embeddings + encoder.layer); got "
            f"{type(model).__name__}"
        )
    return layers


def attention_bias(config: Any, states: torch.Tensor, attention_mask: torch.Tensor) -> Any:
    """The attention mask in the form the encoder's layers take for ``config``'s attention."""
    from transformers.masking_utils import create_bidirectional_mask

    return create_bidirectional_mask(
        config=config, inputs_embeds=states, attention_mask=attention_mask
    )


def run_layers(
    layers: nn.ModuleList, states: torch.Tensor, attention_mask: torch.Tensor, config: Any
) -> torch.Tensor:
    """``states`` through ``layers`` under ``attention_mask`` ``(batch, seq_len)`` of 0/1."""
    bias = attention_bias(config, states, attention_mask)
    for layer in layers:
        out = layer(states, bias)
        states = out[0] if isinstance(out, tuple) else out
    return states


def masked_lm_loss(
    head: nn.Module, states: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy of ``head`` at the labelled positions, and the share predicted right.

    ``states``: ``(batch, seq_len, dim)``; ``labels``: ``(batch, seq_len)``, ``-100`` where no
    token is to be predicted. Only labelled positions go through the head (the vocabulary
    projection is the costly part). With no labelled position the loss is a graph-connected 0.
    """
    selected = labels != IGNORE_INDEX  # (batch, seq_len)
    if not bool(selected.any()):
        zero = states.sum() * 0.0
        return zero, zero.detach()
    logits = head(states[selected])  # (n_masked, vocab_size)
    targets = labels[selected]  # (n_masked,)
    loss = F.cross_entropy(logits, targets)
    accuracy = (logits.argmax(-1) == targets).float().mean().detach()
    return loss, accuracy


def mask_tokens(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    special_token_ids: Iterable[int],
    mask_token_id: int,
    vocab_size: int,
    rate: float = 0.4,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking: ``rate`` of the real tokens are picked; of those 80% become the mask token,
    10% a random token, 10% stay. Special tokens and padding are never picked.

    ``input_ids``, ``attention_mask``: ``(batch, seq_len)``. Returns the masked ids and the labels
    (the original id where picked, ``-100`` elsewhere), both ``(batch, seq_len)``.
    """
    specials = torch.tensor(sorted(set(special_token_ids)), device=input_ids.device)
    eligible = attention_mask.bool() & ~torch.isin(input_ids, specials)  # (batch, seq_len)

    def draw(p: float) -> torch.Tensor:
        uniform = torch.rand(input_ids.shape, generator=generator, device=input_ids.device)
        return uniform < p

    picked = draw(rate) & eligible
    labels = torch.where(picked, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    to_mask = draw(0.8) & picked
    to_random = draw(0.5) & picked & ~to_mask
    random_ids = torch.randint(
        vocab_size, input_ids.shape, generator=generator, device=input_ids.device
    )
    masked = torch.where(to_mask, torch.full_like(input_ids, mask_token_id), input_ids)
    masked = torch.where(to_random, random_ids, masked)
    return masked, labels


class AuxiliaryMLM(nn.Module):
    """Frozen lower layers + trainable head layers + MLM head (joint-training form).

    ``embeddings`` and ``lower`` are frozen (``requires_grad=False``) and run under
    ``torch.no_grad``; ``head_layers`` and ``mlm_head`` train. Build it with
    :meth:`from_encoder` (copies of a loaded encoder) or :func:`load_auxiliary`.
    """

    def __init__(
        self,
        config: Any,
        embeddings: nn.Module,
        lower: nn.ModuleList,
        head_layers: nn.ModuleList,
        mlm_head: nn.Module,
    ) -> None:
        super().__init__()
        self.config = config
        self.embeddings = embeddings
        self.lower = lower
        self.head_layers = head_layers
        self.mlm_head = mlm_head
        for module in (self.embeddings, self.lower):
            module.requires_grad_(False)

    @classmethod
    def from_encoder(
        cls,
        encoder: nn.Module,
        lower_layers: int = 6,
        head_layers: int = 2,
        mlm_head: nn.Module | None = None,
    ) -> AuxiliaryMLM:
        """Copies of ``encoder``'s embeddings and lower layers; head layers from its top layers.

        This is the paper's "w/o pre-training" network (Table 4): the lower ``lower_layers`` and
        the upper ``head_layers`` layers of the encoder. ``mlm_head`` (copied, so never tied to
        the trained encoder) or, when None, a new head whose projection starts from the word
        embeddings.
        """
        layers = encoder_layers(encoder)
        if not 1 <= lower_layers <= len(layers):
            raise ConfigError(
                f"InfoCSE lower_layers={lower_layers}: the encoder has {len(layers)} layers"
            )
        n = len(layers)
        top = [layers[max(n - head_layers + i, 0)] for i in range(head_layers)]
        if mlm_head is None:
            words = encoder.embeddings.word_embeddings.weight
            mlm_head = new_mlm_head(encoder.config, words)
        else:
            mlm_head = copy.deepcopy(mlm_head)
        return cls(
            copy.deepcopy(encoder.config),
            copy.deepcopy(encoder.embeddings),
            nn.ModuleList(copy.deepcopy(layer) for layer in layers[:lower_layers]),
            nn.ModuleList(copy.deepcopy(layer) for layer in top),
            mlm_head,
        )

    @classmethod
    def from_config(cls, config: Any, lower_layers: int, head_layers: int) -> AuxiliaryMLM:
        """Randomly initialised network of ``config``'s architecture (to load weights into)."""
        from transformers import AutoModel

        config = copy.deepcopy(config)
        base = AutoModel.from_config(config)
        layers = encoder_layers(base)
        if len(layers) < lower_layers:
            config.num_hidden_layers = lower_layers
            base = AutoModel.from_config(config)
            layers = encoder_layers(base)
        return cls(
            base.config,
            base.embeddings,
            nn.ModuleList(layers[:lower_layers]),
            nn.ModuleList(copy.deepcopy(layers[0]) for _ in range(head_layers)),
            new_mlm_head(config),
        )

    def lower_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """States after the frozen lower layers, ``(batch, seq_len, dim)``, without gradient."""
        with torch.no_grad():
            states = self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
            return run_layers(self.lower, states, attention_mask, self.config)

    def head_states(
        self, cls: torch.Tensor, lower_states: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        """The head layers over concat(final [CLS], lower states except [CLS]).

        ``cls``: ``(batch, dim)`` from the trained encoder (the only path of gradient into it);
        ``lower_states``: ``(batch, seq_len, dim)``, used detached.
        """
        states = torch.cat([cls.unsqueeze(1), lower_states[:, 1:].detach()], dim=1)
        return run_layers(self.head_layers, states, attention_mask, self.config)

    def forward(
        self,
        cls: torch.Tensor,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """MLM loss and accuracy on the masked sentence ``input_ids`` given the [CLS] vectors."""
        lower = self.lower_states(input_ids, attention_mask, token_type_ids)
        states = self.head_states(cls, lower, attention_mask)
        return masked_lm_loss(self.mlm_head, states, labels)


def save_auxiliary(aux: AuxiliaryMLM, folder: str | Path, meta: dict[str, Any]) -> None:
    """Write the network to ``folder``: weights and config atomically, the manifest last."""
    from safetensors.torch import save_model

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # The manifest vouches for the files: it goes first and comes back last.
    (folder / AUX_MANIFEST).unlink(missing_ok=True)
    tmp = folder / f".{AUX_WEIGHTS}.tmp-{os.getpid()}"
    save_model(aux, str(tmp))
    apply_umask(tmp)  # safetensors writes 0600
    os.replace(tmp, folder / AUX_WEIGHTS)
    config = {
        "format": AUX_FORMAT,
        "format_version": AUX_FORMAT_VERSION,
        "model_type": aux.config.model_type,
        "hidden_size": aux.config.hidden_size,
        "vocab_size": aux.config.vocab_size,
        "lower_layers": len(aux.lower),
        "head_layers": len(aux.head_layers),
        **meta,
    }
    atomic_write_json(folder / AUX_CONFIG, config)
    atomic_write_json(
        folder / AUX_MANIFEST, {"format": AUX_FORMAT, "files": [AUX_WEIGHTS, AUX_CONFIG]}
    )


def read_aux_config(folder: str | Path) -> dict[str, Any]:
    """The ``aux_config.json`` of a complete pre-trained network; ConfigError otherwise."""
    folder = Path(folder)
    if not (folder / AUX_MANIFEST).exists():
        why = "the folder does not exist" if not folder.exists() else "it is incomplete"
        raise ConfigError(
            f"InfoCSE auxiliary network {str(folder)!r}: {why}; run `pairforge pretrain` first"
        )
    config = json.loads((folder / AUX_CONFIG).read_text())
    if config.get("format") != AUX_FORMAT or config.get("format_version") != AUX_FORMAT_VERSION:
        raise ConfigError(f"{folder}/{AUX_CONFIG}: not a {AUX_FORMAT} v{AUX_FORMAT_VERSION} file")
    return config


def load_auxiliary(folder: str | Path, encoder_config: Any) -> tuple[AuxiliaryMLM, dict[str, Any]]:
    """The pre-trained network in ``folder``, checked against the encoder it will serve."""
    from safetensors.torch import load_model

    meta = read_aux_config(folder)
    for key in ("model_type", "hidden_size", "vocab_size"):
        if meta[key] != getattr(encoder_config, key):
            raise ConfigError(
                f"InfoCSE auxiliary network {str(folder)!r} was pre-trained for {key}="
                f"{meta[key]!r}, but the encoder has {getattr(encoder_config, key)!r}; "
                "pre-train it for this encoder"
            )
    aux = AuxiliaryMLM.from_config(encoder_config, meta["lower_layers"], meta["head_layers"])
    load_model(aux, str(Path(folder) / AUX_WEIGHTS), strict=True)
    aux.embeddings.requires_grad_(False)
    aux.lower.requires_grad_(False)
    return aux, meta
