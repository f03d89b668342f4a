"""Pre-training of InfoCSE's auxiliary network (InfoCSE paper section 3.1; Condenser's recipe).

The backbone (the encoder with its MLM head) and the auxiliary network share the lower ``k``
layers. One masked input feeds two MLM losses that share the output projection (eq. 6):

- the backbone's own MLM loss on its final-layer states (eq. 4);
- the auxiliary loss: 2 extra layers over concat(final-layer [CLS], layer-``k`` states except
  [CLS]) predict the same masked tokens through the same head (eq. 5).

:func:`pretrain` runs a fixed number of optimiser steps and is resumable: every
``checkpoint_every`` steps it writes model, optimiser and loss history to
``<output>/_checkpoint/state.pt`` (temporary name, fsync, rename), and a run started again with
the same fingerprint continues from the last checkpoint. Each step's data, masking and dropout
depend only on (seed, step), so a resumed run ends with the same weights as an uninterrupted one.

The result (``train/infocse_aux.py`` layout) is the auxiliary network for joint training plus,
when the backbone trained, ``encoder/``: the pre-trained backbone as a Hugging Face folder. The
authors start joint training from that backbone (Condenser), which the ``train`` stage can do by
naming it as its model.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pairforge.pipeline.plumbing.files import apply_umask, atomic_write_json
from pairforge.pipeline.plumbing.progress import Progress
from pairforge.pipeline.science.models import mlm_head_of
from pairforge.train.infocse_aux import (
    AuxiliaryMLM,
    encoder_layers,
    mask_tokens,
    masked_lm_loss,
    run_layers,
    save_auxiliary,
)
from torch import nn

log = logging.getLogger("pairforge")

CHECKPOINT_DIR = "_checkpoint"
CHECKPOINT_FILE = "state.pt"
ENCODER_DIR = "encoder"
HISTORY_FILE = "history.json"


@dataclass(frozen=True)
class PretrainSettings:
    """Hyperparameters of the pre-training run, taken from the ``pretrain`` config by field name
    (``of``), with ``steps`` resolved (the config's 0 means "from epochs").

    ``PretrainConfig`` (``stages/pretrain/stage.py``) declares these keys, their validation and their
    defaults; this view declares none. It exists because ``train/`` must not import the stage
    module, and its fields are what the result's ``settings`` record holds.
    """

    lower_layers: int
    head_layers: int
    mask_rate: float
    aux_weight: float
    train_backbone: bool
    max_length: int
    batch_size: int
    steps: int
    learning_rate: float
    weight_decay: float
    warmup_ratio: float
    seed: int
    checkpoint_every: int

    @classmethod
    def of(cls, config: Any, steps: int) -> PretrainSettings:
        """The view of ``config`` (a ``PretrainConfig``, or anything with its field names) with
        ``steps`` optimiser steps."""
        values = {f.name: getattr(config, f.name) for f in fields(cls) if f.name != "steps"}
        return cls(steps=steps, **values)


class PretrainModel(nn.Module):
    """Backbone + shared MLM head (``mlm_model``, a ``*ForMaskedLM``) + the 2 auxiliary layers.

    The auxiliary layers start as copies of the backbone's top ``head_layers`` layers. With
    ``train_backbone=False`` the backbone (and BERT's output projection, tied to its word
    embeddings) stays fixed; the head's transform and the auxiliary layers train.
    """

    def __init__(
        self,
        mlm_model: nn.Module,
        lower_layers: int = 6,
        head_layers: int = 2,
        aux_weight: float = 1.0,
        train_backbone: bool = True,
    ) -> None:
        super().__init__()
        self.mlm_model = mlm_model
        head = mlm_head_of(mlm_model)
        if head is None:
            raise ValueError(f"{type(mlm_model).__name__} has no MLM head")
        layers = encoder_layers(self.backbone)
        if not 1 <= lower_layers <= len(layers):
            raise ValueError(f"lower_layers={lower_layers}: the encoder has {len(layers)} layers")
        n = len(layers)
        self.aux_layers = nn.ModuleList(
            copy.deepcopy(layers[max(n - head_layers + i, 0)]) for i in range(head_layers)
        )
        self.lower_layers = lower_layers
        self.aux_weight = aux_weight
        self.train_backbone = train_backbone
        if not train_backbone:
            self.backbone.requires_grad_(False)

    @property
    def backbone(self) -> nn.Module:
        return self.mlm_model.base_model

    @property
    def head(self) -> nn.Module:
        return mlm_head_of(self.mlm_model)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """Both MLM losses on one masked batch, ``(batch, seq_len)`` inputs."""
        with torch.set_grad_enabled(self.train_backbone and torch.is_grad_enabled()):
            out = self.backbone(
                input_ids=input_ids,
                attention_mask=attention_mask,
                token_type_ids=token_type_ids,
                output_hidden_states=True,
                return_dict=True,
            )
        final = out.last_hidden_state  # (batch, seq_len, d)
        lower = out.hidden_states[self.lower_layers]  # (batch, seq_len, d), after layer k
        mlm, mlm_accuracy = masked_lm_loss(self.head, final, labels)  # eq. 4
        states = torch.cat([final[:, :1], lower[:, 1:]], dim=1)  # 12-cls + 6-hiddens
        states = run_layers(self.aux_layers, states, attention_mask, self.backbone.config)
        aux, aux_accuracy = masked_lm_loss(self.head, states, labels)  # eq. 5
        return {
            "loss": mlm + self.aux_weight * aux,  # eq. 6
            "mlm": mlm.detach(),
            "aux_mlm": aux.detach(),
            "mlm_accuracy": mlm_accuracy,
            "aux_mlm_accuracy": aux_accuracy,
        }

    def export_auxiliary(self) -> AuxiliaryMLM:
        """The joint-training network: copies of the lower layers, the 2 layers and the head."""
        backbone = self.backbone
        return AuxiliaryMLM(
            copy.deepcopy(backbone.config),
            copy.deepcopy(backbone.embeddings),
            nn.ModuleList(
                copy.deepcopy(layer) for layer in encoder_layers(backbone)[: self.lower_layers]
            ),
            copy.deepcopy(self.aux_layers),
            copy.deepcopy(self.head),
        )


def batch_indices(
    step: int, batch_size: int, n: int, seed: int, cache: dict | None = None
) -> np.ndarray:
    """Row indices of step ``step``'s batch: consecutive slices of per-epoch permutations.

    A function of (step, seed) only, so a resumed run reads exactly the rows it would have.
    """
    cache = {} if cache is None else cache
    indices: list[np.ndarray] = []
    start, need = step * batch_size, batch_size
    while need:
        epoch, offset = divmod(start, n)
        if epoch not in cache:
            cache.clear()
            cache[epoch] = np.random.default_rng([seed, epoch]).permutation(n)
        part = cache[epoch][offset : offset + need]
        indices.append(part)
        start, need = start + len(part), need - len(part)
    return np.concatenate(indices)


def learning_rate(step: int, settings: PretrainSettings) -> float:
    """Linear warm-up over ``warmup_ratio`` of the steps, then linear decay to 0."""
    warmup = int(settings.steps * settings.warmup_ratio)
    if step < warmup:
        return settings.learning_rate * (step + 1) / warmup
    return settings.learning_rate * max(
        0.0, (settings.steps - step) / max(1, settings.steps - warmup)
    )


def _save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _load_checkpoint(path: Path, fingerprint: str) -> dict[str, Any] | None:
    for stale in path.parent.glob(".*.tmp-*"):
        stale.unlink(missing_ok=True)  # half-written by a killed run
    if not path.exists():
        return None
    state = torch.load(path, map_location="cpu", weights_only=True)
    if state.get("fingerprint") != fingerprint:
        log.info("pretrain: checkpoint is from other params, data or code; starting over")
        return None
    return state


def pretrain(
    mlm_model: nn.Module,
    tokenizer: Any,
    sentences: Sequence[str],
    output: str | Path,
    settings: PretrainSettings,
    fingerprint: str,
    meta: dict[str, Any] | None = None,
    device: str = "cpu",
    progress: bool = True,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> dict[str, Any]:
    """Pre-train the auxiliary network on ``sentences`` and write it to ``output``.

    ``mlm_model``: the encoder with an MLM head (``AutoModelForMaskedLM``); ``meta`` is added to
    ``aux_config.json``. ``on_step(step, values)`` is called after each finished step (and its
    checkpoint, when one is due). Returns ``steps``, ``resumed_from``, ``seconds`` (this run's
    training time; also recorded in ``aux_config.json``) and ``history``.
    """
    if not sentences:
        raise ValueError("pretrain: no sentences to train on")
    output = Path(output)
    checkpoint = output / CHECKPOINT_DIR / CHECKPOINT_FILE
    model, optimizer = _model_and_optimizer(mlm_model, settings, device)
    history, start = _resume(checkpoint, fingerprint, model, optimizer, settings.steps)
    specials = tokenizer.all_special_ids
    bar = Progress("pretrain", total=settings.steps, unit="steps", skipped=start, enabled=progress)
    began = time.monotonic()
    order_cache: dict = {}
    for step in range(start, settings.steps):
        # Data, masking and dropout are functions of (seed, step): resumable to the bit.
        torch.manual_seed(settings.seed * 1_000_003 + step)
        rows = batch_indices(step, settings.batch_size, len(sentences), settings.seed, order_cache)
        batch = _masked_batch(tokenizer, [sentences[i] for i in rows], specials, settings, device)
        values = _optimizer_step(model, optimizer, batch, step, settings)
        history.append(values)
        done = step + 1
        if done % settings.checkpoint_every == 0 and done < settings.steps:
            _save_checkpoint(
                checkpoint, _training_state(done, model, optimizer, history, fingerprint)
            )
        bar.advance(done=1, rows=len(rows))
        if on_step is not None:
            on_step(done, values)
    bar.close()
    summary = {
        "steps": settings.steps,
        "resumed_from": start,
        "seconds": round(time.monotonic() - began, 3),
    }
    _write_result(model, tokenizer, output, settings, history, {**(meta or {}), **summary})
    shutil.rmtree(output / CHECKPOINT_DIR, ignore_errors=True)
    return {**summary, "history": history}


def _model_and_optimizer(
    mlm_model: nn.Module, settings: PretrainSettings, device: str
) -> tuple[PretrainModel, torch.optim.AdamW]:
    """The :class:`PretrainModel` over ``mlm_model`` on ``device``, in train mode, and AdamW
    over the parameters that train (``settings``' learning rate and weight decay)."""
    model = PretrainModel(
        mlm_model,
        settings.lower_layers,
        settings.head_layers,
        settings.aux_weight,
        settings.train_backbone,
    ).to(device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=settings.learning_rate, weight_decay=settings.weight_decay
    )
    return model, optimizer


def _resume(
    checkpoint: Path,
    fingerprint: str,
    model: PretrainModel,
    optimizer: torch.optim.Optimizer,
    steps: int,
) -> tuple[list[dict[str, float]], int]:
    """``(history, steps done)`` of the checkpoint with ``fingerprint``, its model and optimizer
    states loaded into ``model`` and ``optimizer``; ``([], 0)`` when there is none."""
    state = _load_checkpoint(checkpoint, fingerprint)
    if state is None:
        return [], 0
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    history, start = list(state["history"]), int(state["step"])
    log.info("pretrain: resuming after step %d of %d", start, steps)
    return history, start


def _masked_batch(
    tokenizer: Any,
    texts: list[str],
    specials: list[int],
    settings: PretrainSettings,
    device: str,
) -> dict[str, torch.Tensor | None]:
    """``texts`` tokenised (padded, cut at ``max_length``) on ``device`` and masked at
    ``mask_rate`` (never ``specials``): ``input_ids`` (masked), ``attention_mask``, ``labels``
    and ``token_type_ids`` (None when the tokenizer gives none), each ``(batch, seq_len)``."""
    encoded = tokenizer(
        texts,
        padding=True,
        truncation=True,
        max_length=settings.max_length,
        return_tensors="pt",
    ).to(device)
    masked, labels = mask_tokens(
        encoded["input_ids"],
        encoded["attention_mask"],
        specials,
        tokenizer.mask_token_id,
        len(tokenizer),
        settings.mask_rate,
    )
    return {
        "input_ids": masked,
        "attention_mask": encoded["attention_mask"],
        "labels": labels,
        "token_type_ids": encoded.get("token_type_ids"),
    }


def _optimizer_step(
    model: PretrainModel,
    optimizer: torch.optim.Optimizer,
    batch: dict[str, torch.Tensor | None],
    step: int,
    settings: PretrainSettings,
) -> dict[str, float]:
    """One optimiser step on ``batch`` at step ``step``'s learning rate; returns the step's
    record: ``step`` (counted from 1), ``lr`` and the model's losses and accuracies."""
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(step, settings)
    out = model(
        batch["input_ids"], batch["attention_mask"], batch["labels"], batch["token_type_ids"]
    )
    optimizer.zero_grad(set_to_none=True)
    out["loss"].backward()
    optimizer.step()
    values = {"step": step + 1, "lr": optimizer.param_groups[0]["lr"]}
    values.update({key: float(value.detach()) for key, value in out.items()})
    return values


def _training_state(
    step: int,
    model: PretrainModel,
    optimizer: torch.optim.Optimizer,
    history: list[dict[str, float]],
    fingerprint: str,
) -> dict[str, Any]:
    """What a checkpoint holds after ``step`` steps: model and optimizer states, the history so
    far and the run's fingerprint."""
    return {
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "history": history,
        "fingerprint": fingerprint,
    }


def _write_result(
    model: PretrainModel,
    tokenizer: Any,
    output: Path,
    settings: PretrainSettings,
    history: list[dict[str, float]],
    meta: dict[str, Any],
) -> None:
    """``encoder/`` and the history first, the auxiliary network (manifest last) at the end.

    ``encoder/`` is written only when the backbone trained; otherwise it is the input model.
    """
    model = model.to("cpu")
    output.mkdir(parents=True, exist_ok=True)  # no checkpoint nor encoder/ may have made it
    final = output / ENCODER_DIR
    shutil.rmtree(final, ignore_errors=True)
    if settings.train_backbone:
        tmp = output / f".{ENCODER_DIR}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        model.backbone.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        apply_umask(tmp)  # safetensors writes 0600
        os.replace(tmp, final)
    atomic_write_json(output / HISTORY_FILE, history)
    save_auxiliary(
        model.export_auxiliary(),
        output,
        {"settings": asdict(settings), **meta},
    )


def read_history(output: str | Path) -> list[dict[str, float]]:
    """The per-step losses a finished run wrote."""
    return json.loads((Path(output) / HISTORY_FILE).read_text())
