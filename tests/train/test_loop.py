"""The trainer end to end on a tiny BERT: every objective learns, outputs are complete, a finished
run is not redone, and a changed setting retrains."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import yaml
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.errors import ConfigError, PairforgeError
from pairforge.pipeline.science.models import load_sentence_encoder
from pairforge.stages.train import stage as T

from tests.train.builders import pairs_rows, write_pairs

TINY_OPTIONS = {
    "simcse": {},
    "debcse": {},
    "denosent": {"num_decoder_layers": 2, "decoder_feedforward": 64},
    "bsl": {"k": 2, "delta": 0.99},
}


def config(tmp_path, model_dir, sts_dir, objective, pairs=None, **overrides) -> T.TrainConfig:
    values = {
        "input": str(pairs),
        "output": str(tmp_path / "models"),
        "model": str(model_dir),
        "objective": objective,
        "batch_size": 8,
        "lr": 3e-3,
        "max_steps": 30,
        "max_length": 16,
        "save_every": 10,
        "eval_every": 15,
        "eval_batch_size": 4,
        "sts_dir": str(sts_dir),
        "log_every": 1,
        "threads": 1,  # tiny models gain nothing from more, and a busy machine loses a lot
        "recipes": {objective: {"options": TINY_OPTIONS.get(objective, {})}},
        "metrics": str(tmp_path / "metrics" / "train.json"),
        "plots": str(tmp_path / "plots" / "train"),
        "reports": str(tmp_path / "reports"),
    }
    values.update(overrides)
    return T.TrainConfig(**values)


@pytest.fixture
def pairs(tmp_path, tiny_sentences):
    return write_pairs(tmp_path / "pairs", pairs_rows(tiny_sentences), rows_per_shard=3)


@pytest.mark.parametrize("objective", ["simcse", "debcse", "denosent", "bsl"])
def test_every_objective_learns_through_the_trainer(
    objective, tmp_path, pairs, tiny_model_dir, sts_dir
):
    cfg = config(tmp_path, tiny_model_dir, sts_dir, objective, pairs, eval_every=0)
    metrics = T.run(cfg, progress=False)
    history = json.loads((tmp_path / "models" / objective / "history.json").read_text())
    losses = [h["loss"] for h in history["history"]]
    assert len(losses) == 30 and all(np.isfinite(losses))
    assert np.mean(losses[-3:]) < np.mean(losses[:3]), losses
    # Batch order and dropout alone can pass or fail the check above: without any optimiser step
    # the two means differ by less than the loss moves from step to step. So the run is also
    # compared with a frozen one on the same batches and dropout masks, at an lr too small to move
    # a float32 weight (the config wants lr > 0): their first losses, before any step, are equal,
    # and every one of the last 10 is lower for the run that learns.
    frozen_cfg = config(
        tmp_path / "frozen", tiny_model_dir, sts_dir, objective, pairs, eval_every=0, lr=1e-30
    )
    T.run(frozen_cfg, progress=False)
    frozen_history = tmp_path / "frozen" / "models" / objective / "history.json"
    frozen = [h["loss"] for h in json.loads(frozen_history.read_text())["history"]]
    assert len(frozen) == 30 and losses[0] == frozen[0]
    assert all(t < f for t, f in zip(losses[-10:], frozen[-10:], strict=True)), (losses, frozen)
    assert metrics[objective]["steps"] == 30 and metrics[objective]["best_dev"] is None
    model = tmp_path / "models" / objective / "model"
    info = json.loads((model / "pairforge.json").read_text())
    assert info["step"] == 30 and info["objective"] == objective
    assert not (tmp_path / "models" / objective / "checkpoints").exists()
    assert (
        (tmp_path / "plots" / "train" / f"{objective}.csv")
        .read_text()
        .startswith("step,epoch,loss,lr")
    )
    assert (tmp_path / "reports" / f"train_{objective}.png").stat().st_size > 1000


def test_dev_evaluation_keeps_the_best_and_a_rerun_is_a_no_op(
    tmp_path, pairs, tiny_model_dir, sts_dir, caplog
):
    cfg = config(tmp_path, tiny_model_dir, sts_dir, "simcse", pairs, eval_every=10)
    first = T.run(cfg, progress=False)["simcse"]
    history = json.loads((tmp_path / "models" / "simcse" / "history.json").read_text())
    dev = history["dev_history"]
    assert [d["step"] for d in dev] == [10, 20, 30]
    best = max(dev, key=lambda d: d["score"])
    assert (first["best_step"], first["best_dev"]) == (best["step"], best["score"])
    model = tmp_path / "models" / "simcse" / "model"
    info = json.loads((model / "pairforge.json").read_text())
    assert info["step"] == best["step"] and info["dev"]["score"] == best["score"]
    # The exported best model scores on the dev sets what the trainer measured.
    from pairforge.pipeline.science import sts

    embedder, _ = load_sentence_encoder(str(model))
    again = sts.evaluate(embedder, sts_dir, ["stsb_dev", "sickr_dev"], align_uniform=False)
    assert again["avg"] == pytest.approx(best["score"], abs=1e-3)
    mtime = (model / "model.safetensors").stat().st_mtime_ns
    with caplog.at_level(logging.INFO, logger="pairforge"):
        assert T.run(cfg, progress=False)["simcse"] == first
    assert "is up to date" in caplog.text
    assert (model / "model.safetensors").stat().st_mtime_ns == mtime
    changed = config(tmp_path, tiny_model_dir, sts_dir, "simcse", pairs, eval_every=10, lr=1e-3)
    assert T.run(changed, progress=False)["simcse"]["seconds"] is not None
    assert json.loads((model / "pairforge.json").read_text())["settings"]["lr"] == 1e-3


def test_a_model_without_mlm_head_gets_one_initialised_and_says_so(
    tmp_path, pairs, tiny_encoder_dir, sts_dir, caplog
):
    cfg = config(tmp_path, tiny_encoder_dir, sts_dir, "denosent", pairs, max_steps=2, eval_every=0)
    with caplog.at_level(logging.WARNING, logger="pairforge"):
        metrics = T.run(cfg, progress=False)
    assert metrics["denosent"]["mlm_head"] == "initialised"
    assert "has no pretrained MLM head; initialised cls.predictions" in caplog.text
    info = json.loads((tmp_path / "models" / "denosent" / "model" / "pairforge.json").read_text())
    assert info["load_report"]["mlm_head"] == "initialised"


def test_missing_columns_unknown_objective_and_options_are_clear_errors(
    tmp_path, tiny_sentences, tiny_model_dir, sts_dir
):
    only_text = write_pairs(tmp_path / "text_only", {S.TEXT: tiny_sentences})
    cfg = config(tmp_path, tiny_model_dir, sts_dir, "debcse", only_text)
    with pytest.raises(
        PairforgeError,
        match=r"objective 'debcse' needs training-data columns \['positive_texts', 'negative_texts'\]",
    ):
        T.run(cfg, progress=False)
    with pytest.raises(ConfigError, match="unknown 'simclr'; known objectives:"):
        T.run(config(tmp_path, tiny_model_dir, sts_dir, "simclr", only_text), progress=False)
    # A misspelt option fails with the config, before any model loads.
    with pytest.raises(
        ConfigError,
        match=r"train.recipes.simcse.options: unknown option 'tau' \(accepted: temperature, pooling\)",
    ):
        config(
            tmp_path,
            tiny_model_dir,
            sts_dir,
            "simcse",
            only_text,
            recipes={"simcse": {"options": {"tau": 1}}},
        )


def test_recipes_override_shared_keys_and_the_command_line_beats_both():
    cfg = T.TrainConfig(
        objective="simcse",
        lr=1e-5,
        max_steps=100,
        recipes={"bsl": {"lr": 1e-4, "max_steps": 7, "options": {"k": 4}}},
    )
    simcse, bsl = T.settings_for(cfg, "simcse"), T.settings_for(cfg, "bsl")
    assert (simcse.lr, simcse.max_steps, simcse.options) == (1e-5, 100, {})
    assert (bsl.lr, bsl.max_steps, bsl.options) == (1e-4, 7, {"k": 4})
    forced = T.settings_for(cfg, "bsl", frozenset({"max_steps"}))
    assert (forced.lr, forced.max_steps) == (1e-4, 100)


def test_the_paper_profile_holds_each_papers_settings():
    from pairforge.stages.profile import preset_path

    paper = T.TrainConfig(**yaml.safe_load(preset_path("paper").read_text())["train"])
    simcse, debcse = T.settings_for(paper, "simcse"), T.settings_for(paper, "debcse")
    assert (simcse.batch_size, simcse.lr, simcse.max_length, simcse.epochs) == (64, 3e-5, 32, 1.0)
    assert simcse.eval_every == 125 and simcse.options == {"temperature": 0.05}
    assert debcse.lr == 2.5e-5 and debcse.eval_tasks == ("stsb_dev", "sickr_dev")
    denosent = T.settings_for(paper, "denosent")
    assert (denosent.schedule, denosent.warmup_steps, denosent.max_steps, denosent.lr) == (
        "constant", 500, 5000, 4e-5,
    )  # fmt: skip
    assert denosent.options["contrastive_weight"] == 5.0 and denosent.eval_every == 50
    bsl = T.settings_for(paper, "bsl")
    assert (bsl.lr, bsl.max_length, bsl.warmup_ratio, bsl.options["delta"]) == (
        1e-4,
        64,
        0.1,
        0.999,
    )
    assert paper.model == "bert-base-uncased"


def test_a_non_finite_loss_stops_the_run_naming_the_step(
    tmp_path, pairs, tiny_model_dir, sts_dir, monkeypatch
):
    import torch
    from pairforge.train.objectives.simcse import SimCSE

    forward, calls = SimCSE.forward, [0]

    def poisoned(self, batch, encoder):
        calls[0] += 1
        out = forward(self, batch, encoder)
        return {**out, "loss": out["loss"] * float("nan")} if calls[0] == 3 else out

    monkeypatch.setattr(SimCSE, "forward", poisoned)
    cfg = config(tmp_path, tiny_model_dir, sts_dir, "simcse", pairs, log_every=5, save_every=4)
    with pytest.raises(PairforgeError, match="the loss is nan at step 3; lower the learning rate"):
        T.run(cfg, progress=False)
    # Checked before the step-4 checkpoint: no checkpoint holds the NaN weights.
    assert not list((tmp_path / "models/simcse/checkpoints").glob("step-*"))
    assert torch.get_num_threads() == 1  # the run restored the process's settings
