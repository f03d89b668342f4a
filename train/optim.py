"""Optimiser and learning-rate schedules.

AdamW over every trainable tensor of the encoder and the objective, each once
(``trainable_parameters``); weight decay applies to matrices only (biases and LayerNorm/BatchNorm
weights are exempt, as in Hugging Face's Trainer). Schedules, after ``warmup`` linear steps
from 0:

- ``linear``: linear decay to 0 at the last step (Hugging Face's default, SimCSE's setting);
- ``constant``: the peak rate to the end (DenoSent's ``constant_with_warmup``).
"""

from __future__ import annotations

from typing import Literal

import torch
from pairforge.train.objectives import trainable_parameters
from torch import nn

Schedule = Literal["linear", "constant"]


def build_optimizer(
    modules: list[nn.Module], lr: float, weight_decay: float = 0.0, betas=(0.9, 0.999), eps=1e-8
) -> torch.optim.AdamW:
    decay, no_decay = [], []
    for parameter in trainable_parameters(*modules):
        (decay if parameter.ndim >= 2 else no_decay).append(parameter)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    # The fused kernel (CPU and CUDA) updates every tensor in one pass: the per-tensor loop is a
    # tenth of a MiniLM step on a CPU. Same arithmetic, so results stay deterministic.
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=_fused_ok(groups))


def _fused_ok(groups: list[dict]) -> bool:
    params = [p for g in groups for p in g["params"]]
    return bool(params) and all(
        p.dtype in (torch.float32, torch.float16, torch.bfloat16)
        and p.device.type in ("cpu", "cuda")
        for p in params
    )


def lr_factor(step: int, total: int, warmup: int, schedule: Schedule) -> float:
    """The multiplier of the peak learning rate for optimiser step ``step`` (0-based)."""
    if warmup > 0 and step < warmup:
        return step / warmup
    if schedule == "constant":
        return 1.0
    if schedule == "linear":
        return max(0.0, (total - step) / max(1, total - warmup))
    raise ValueError(f"schedule must be 'linear' or 'constant', not {schedule!r}")


def build_schedule(
    optimizer: torch.optim.Optimizer, total: int, warmup: int, schedule: Schedule
) -> torch.optim.lr_scheduler.LambdaLR:
    lr_factor(0, total, warmup, schedule)  # validates the name
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, total, warmup, schedule)
    )


def warmup_steps(total: int, steps: int, ratio: float) -> int:
    """``steps`` when set, else ``ratio`` of the total (BSL's 10%)."""
    return int(steps) if steps > 0 else int(round(ratio * total))
