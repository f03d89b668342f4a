"""Schedules, the optimiser's parameter groups, and the checkpoint store's bookkeeping."""

from __future__ import annotations

import pytest
import torch
from pairforge.train.checkpoint import CheckpointStore, rng_state, set_rng_state
from pairforge.train.optim import build_optimizer, build_schedule, lr_factor, warmup_steps
from torch import nn


def test_linear_and_constant_schedules_with_warmup():
    assert [lr_factor(s, 10, 2, "linear") for s in (0, 1, 2, 6, 10)] == [0.0, 0.5, 1.0, 0.5, 0.0]
    assert [lr_factor(s, 10, 2, "constant") for s in (0, 1, 2, 9)] == [0.0, 0.5, 1.0, 1.0]
    assert lr_factor(0, 10, 0, "linear") == 1.0
    assert warmup_steps(5000, 500, 0.0) == 500 and warmup_steps(200, 0, 0.1) == 20
    with pytest.raises(ValueError, match="schedule must be"):
        lr_factor(0, 10, 0, "cosine")


def test_optimizer_decays_matrices_only_and_schedule_drives_the_rate():
    model = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4))
    optimizer = build_optimizer([model], lr=0.1, weight_decay=0.01)
    decayed, exempt = optimizer.param_groups
    assert [p.shape for p in decayed["params"]] == [torch.Size([4, 3])]
    assert decayed["weight_decay"] == 0.01 and exempt["weight_decay"] == 0.0
    assert len(exempt["params"]) == 3
    schedule = build_schedule(optimizer, total=4, warmup=0, schedule="linear")
    rates = []
    for _ in range(4):
        optimizer.step()
        schedule.step()
        rates.append(round(schedule.get_last_lr()[0], 6))
    assert rates == [0.075, 0.05, 0.025, 0.0]


def test_checkpoint_store_keeps_the_newest_and_forgets_another_run(tmp_path):
    store = CheckpointStore(tmp_path, "run-a", keep=2)
    assert store.prepare() is False  # nothing to resume
    for step in (10, 20, 30):
        store.save(step, {"step": step, "rng": rng_state()})
    assert store.steps() == [20, 30] and store.latest() == 30
    assert store.load(30)["step"] == 30
    (store.folder / ".step-000040.tmp-123").mkdir()  # a write killed half way
    assert CheckpointStore(tmp_path, "run-a").prepare() is True
    assert not (store.folder / ".step-000040.tmp-123").exists() and store.latest() == 30
    assert CheckpointStore(tmp_path, "run-b").prepare() is False
    assert CheckpointStore(tmp_path, "run-b").steps() == []


def test_rng_state_round_trip_replays_every_generator():
    import random

    import numpy as np

    state = rng_state()
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first
