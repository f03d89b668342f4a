"""Pre-training of InfoCSE's auxiliary network: data order, schedule, what trains, and a run
killed with SIGKILL that resumes to exactly the weights of an uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from pairforge.stages.pretrain.infocse import (
    CHECKPOINT_DIR,
    CHECKPOINT_FILE,
    ENCODER_DIR,
    PretrainModel,
    PretrainSettings,
    batch_indices,
    learning_rate,
    pretrain,
    read_history,
)
from pairforge.stages.pretrain.stage import PretrainConfig
from pairforge.train.infocse_aux import AUX_MANIFEST, AUX_WEIGHTS, read_aux_config
from pairforge.train.objectives import columns
from pairforge.train.objectives.infocse import InfoCSE
from safetensors.torch import load_file
from transformers import BertForMaskedLM, BertTokenizerFast

from tests.conftest import ROOT

SETTINGS = PretrainSettings.of(
    PretrainConfig(lower_layers=1, batch_size=4, checkpoint_every=2, learning_rate=1e-3, seed=3),
    steps=6,
)

# Run in a subprocess: pre-train from the saved tiny model and SIGKILL ourselves right after
# step KILL_AT has finished (its checkpoint, if one was due, written).
KILLED_RUN = textwrap.dedent(
    """
    import json, os, signal, sys
    from transformers import BertForMaskedLM, BertTokenizerFast
    from pairforge.stages.pretrain.infocse import PretrainSettings, pretrain

    model_dir, out, settings, kill_at = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
    sentences = json.loads(open(os.path.join(model_dir, "sentences.json")).read())

    def kill(step, values):
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    pretrain(
        BertForMaskedLM.from_pretrained(model_dir), BertTokenizerFast.from_pretrained(model_dir),
        sentences, out, PretrainSettings(**settings), "fingerprint", progress=False, on_step=kill,
    )
    """
)


@pytest.fixture
def saved_model(tiny_mlm, tiny_tokenizer, tiny_sentences, tmp_path) -> Path:
    folder = tmp_path / "tiny"
    tiny_mlm.save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    (folder / "sentences.json").write_text(json.dumps(tiny_sentences))
    return folder


def load(folder: Path) -> tuple[BertForMaskedLM, BertTokenizerFast, list[str]]:
    sentences = json.loads((folder / "sentences.json").read_text())
    return (
        BertForMaskedLM.from_pretrained(folder),
        BertTokenizerFast.from_pretrained(folder),
        sentences,
    )


def test_batch_indices_walk_seeded_permutations_epoch_after_epoch():
    n, batch = 10, 4
    rows = np.concatenate([batch_indices(step, batch, n, seed=7) for step in range(5)])
    assert sorted(rows[:10]) == list(range(10)) and sorted(rows[10:20]) == list(range(10))
    assert not np.array_equal(rows[:10], rows[10:20])  # each epoch has its own order
    assert np.array_equal(batch_indices(3, batch, n, seed=7), rows[12:16])
    assert not np.array_equal(batch_indices(0, batch, n, seed=8), rows[:4])


def test_learning_rate_warms_up_then_decays_to_zero():
    settings = PretrainSettings.of(PretrainConfig(warmup_ratio=0.2, learning_rate=1.0), steps=10)
    values = [learning_rate(step, settings) for step in range(10)]
    assert values[:3] == pytest.approx([0.5, 1.0, 1.0])
    assert values[2:] == pytest.approx([(10 - s) / 8 for s in range(2, 10)])


def test_frozen_backbone_trains_only_the_heads(tiny_mlm, tiny_tokenizer, tiny_sentences):
    torch.manual_seed(0)
    model = PretrainModel(tiny_mlm, lower_layers=1, train_backbone=False)
    backbone = {name: p.detach().clone() for name, p in model.backbone.named_parameters()}
    aux = [p.detach().clone() for p in model.aux_layers.parameters()]
    transform = model.head.predictions.transform.dense.weight.detach().clone()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    encoded = tiny_tokenizer(tiny_sentences, padding=True, return_tensors="pt")
    labels = encoded["input_ids"].clone()
    labels[encoded["attention_mask"] == 0] = -100
    out = model(encoded["input_ids"], encoded["attention_mask"], labels)
    assert out["loss"].item() == pytest.approx(out["mlm"].item() + out["aux_mlm"].item(), rel=1e-6)
    out["loss"].backward()
    optimizer.step()
    assert all(torch.equal(backbone[name], p) for name, p in model.backbone.named_parameters())
    assert all(
        not torch.equal(a, b) for a, b in zip(aux, model.aux_layers.parameters(), strict=True)
    )
    assert not torch.equal(transform, model.head.predictions.transform.dense.weight)


def test_pretrain_writes_a_network_the_objective_loads(saved_model):
    model, tokenizer, sentences = load(saved_model)
    out = saved_model.parent / "aux"
    result = pretrain(model, tokenizer, sentences, out, SETTINGS, "fp", {"note": 1}, progress=False)
    assert result["steps"] == 6 and result["resumed_from"] == 0 and len(result["history"]) == 6
    assert (out / AUX_MANIFEST).exists() and not (out / CHECKPOINT_DIR).exists()
    meta = read_aux_config(out)
    assert meta["note"] == 1 and meta["lower_layers"] == 1 and meta["settings"]["steps"] == 6
    assert read_history(out) == result["history"]
    # The exported lower layers are the trained backbone's; encoder/ is that backbone.
    backbone = BertForMaskedLM.from_pretrained(out / ENCODER_DIR).bert
    objective = InfoCSE(32, tokenizer, config=backbone.config, aux_path=str(out))
    lower = objective.auxiliary.lower[0].attention.self.query.weight
    assert torch.equal(lower, backbone.encoder.layer[0].attention.self.query.weight)
    assert torch.equal(lower, model.bert.encoder.layer[0].attention.self.query.weight)
    features = dict(tokenizer(sentences[:4], padding=True, return_tensors="pt"))
    assert torch.isfinite(objective({columns.TEXT: features}, backbone)["loss"])
    with pytest.raises(ValueError, match="no sentences"):
        pretrain(model, tokenizer, [], out, SETTINGS, "fp", progress=False)


@pytest.mark.slow
def test_killed_run_resumes_to_identical_weights(saved_model):
    settings = json.dumps(SETTINGS.__dict__)
    killed = saved_model.parent / "killed"
    script = saved_model.parent / "run.py"
    script.write_text(KILLED_RUN)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    args = [sys.executable, str(script), str(saved_model), str(killed), settings]
    proc = subprocess.run([*args, "5"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert (killed / CHECKPOINT_DIR / CHECKPOINT_FILE).exists()
    assert not (killed / AUX_MANIFEST).exists()
    # A half-written checkpoint from a kill mid-write is ignored (and cleaned up) on resume.
    (killed / CHECKPOINT_DIR / f".{CHECKPOINT_FILE}.tmp-1").write_bytes(b"torn")

    model, tokenizer, sentences = load(saved_model)
    resumed = pretrain(model, tokenizer, sentences, killed, SETTINGS, "fingerprint", progress=False)
    assert resumed["resumed_from"] == 4  # the step-4 checkpoint; step 5 is redone
    model, tokenizer, sentences = load(saved_model)
    straight = saved_model.parent / "straight"
    reference = pretrain(
        model, tokenizer, sentences, straight, SETTINGS, "fingerprint", progress=False
    )
    assert resumed["history"] == reference["history"]
    for name in (AUX_WEIGHTS, f"{ENCODER_DIR}/model.safetensors"):
        a, b = load_file(killed / name), load_file(straight / name)
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), (name, key)
    assert not (killed / CHECKPOINT_DIR).exists()


def test_checkpoint_of_another_fingerprint_is_not_resumed(saved_model):
    out = saved_model.parent / "aux"

    def crash(step, values):
        if step == 3:
            raise KeyboardInterrupt

    model, tokenizer, sentences = load(saved_model)
    with pytest.raises(KeyboardInterrupt):
        pretrain(model, tokenizer, sentences, out, SETTINGS, "old", progress=False, on_step=crash)
    assert (out / CHECKPOINT_DIR / CHECKPOINT_FILE).exists()
    model, tokenizer, sentences = load(saved_model)
    assert (
        pretrain(model, tokenizer, sentences, out, SETTINGS, "new", progress=False)["resumed_from"]
        == 0
    )
