"""Kill and resume: a run SIGKILLed at a checkpoint boundary, in the middle of a step, or while
writing a checkpoint, then resumed, ends with the same weights (bitwise, on CPU) and the same
loss history as an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from pairforge.stages.train import stage as T
from safetensors.torch import load_file

from tests.conftest import ROOT
from tests.train.builders import pairs_rows, write_pairs
from tests.train.test_loop import config

KILLER = r"""
import json, os, signal, sys
from pairforge.stages.train import stage as T
from pairforge.train import checkpoint

cfg = T.TrainConfig(**json.loads(open(sys.argv[1]).read()))
mode, at = sys.argv[2], int(sys.argv[3])

def die():
    os.kill(os.getpid(), signal.SIGKILL)

hooks = {}
if mode == "checkpoint":  # right after checkpoint `at` is complete
    hooks["checkpoint"] = lambda trainer: die() if trainer.step == at else None
elif mode == "midstep":  # inside the forward pass of step `at`
    from pairforge.train.objectives import OBJECTIVES
    cls = OBJECTIVES[cfg.objective]
    forward, calls = cls.forward, [0]
    def counting(self, batch, encoder):
        calls[0] += 1
        if calls[0] == at:
            die()
        return forward(self, batch, encoder)
    cls.forward = counting
elif mode == "saving":  # checkpoint `at` written but not yet renamed into place
    replace = os.replace
    def dying_replace(src, dst):
        if os.path.basename(str(dst)) == f"step-{at:06d}":
            die()
        return replace(src, dst)
    checkpoint.os.replace = dying_replace
T.run(cfg, progress=False, hooks=hooks)
"""


def weights(model_dir):
    return load_file(str(model_dir / "model.safetensors"))


def losses(out):
    return [h["loss"] for h in json.loads((out / "history.json").read_text())["history"]]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("objective", "mode", "at", "resumes_from"),
    [("bsl", "checkpoint", 10, 10), ("debcse", "midstep", 15, 10), ("simcse", "saving", 20, 10)],
)
def test_killed_run_resumes_to_the_same_weights(
    objective, mode, at, resumes_from, tmp_path, tiny_sentences, tiny_model_dir, sts_dir
):
    pairs = write_pairs(tmp_path / "pairs", pairs_rows(tiny_sentences * 2), rows_per_shard=5)
    common = dict(max_steps=25, save_every=10, eval_every=12, buffer_size=6, lr=1e-3)
    reference = config(tmp_path / "ref", tiny_model_dir, sts_dir, objective, pairs, **common)
    T.run(reference, progress=False)

    killed = config(tmp_path / "killed", tiny_model_dir, sts_dir, objective, pairs, **common)
    cfg_file = tmp_path / "cfg.json"
    cfg_file.write_text(killed.model_dump_json())
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    result = subprocess.run(
        [sys.executable, str(script), str(cfg_file), mode, str(at)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    out = tmp_path / "killed" / "models" / objective
    checkpoints = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert f"step-{resumes_from:06d}" in checkpoints and not (out / "model").exists()
    if mode == "saving":
        assert f"step-{at:06d}" not in checkpoints  # the half-written one is not taken for done
        assert any(name.startswith(".step-") for name in checkpoints)

    T.run(killed, progress=False)
    expected, got = (
        weights(tmp_path / "ref" / "models" / objective / "model"),
        weights(out / "model"),
    )
    assert expected.keys() == got.keys()
    assert all(expected[k].equal(got[k]) for k in expected), "weights differ after resume"
    assert losses(out) == losses(tmp_path / "ref" / "models" / objective)
    info = json.loads((out / "model" / "pairforge.json").read_text())
    ref_info = json.loads(
        (tmp_path / "ref" / "models" / objective / "model" / "pairforge.json").read_text()
    )
    assert info["step"] == ref_info["step"] and info["dev"]["score"] == ref_info["dev"]["score"]
    assert not (out / "checkpoints").exists()


FINISH_KILLER = r"""
import json, os, signal, sys
from pairforge.stages.train import stage as T
from pairforge.train import export, loop

cfg = T.TrainConfig(**json.loads(open(sys.argv[1]).read()))
point = sys.argv[2]

def die():
    os.kill(os.getpid(), signal.SIGKILL)

if point == "export":  # the final model folder complete under its temporary name
    replace = os.replace
    def dying_replace(src, dst):
        if os.path.basename(str(dst)) == "model":
            die()
        return replace(src, dst)
    export.os.replace = dying_replace
elif point == "history":  # the model in place and history.json written; checkpoints not cleared
    write = loop.atomic_write_json
    def dying_write(path, obj, *args, **kwargs):
        write(path, obj, *args, **kwargs)
        if os.path.basename(str(path)) == "history.json":
            die()
    loop.atomic_write_json = dying_write
T.run(cfg, progress=False)
"""


def _folder_bytes(folder):
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name not in ("README.md", "pairforge.json")
    }


@pytest.mark.slow
@pytest.mark.parametrize(("point", "eval_every"), [("export", 0), ("history", 5)])
def test_killed_in_the_finishing_step_resumes_to_the_same_folder(
    point, eval_every, tmp_path, tiny_sentences, tiny_model_dir, sts_dir
):
    """``export``: no dev evaluation, so the model is exported at the end of the run; a kill
    inside that export leaves the last checkpoint, and the resumed run (no training step left)
    must write the same folder, tokenizer.json included (it used to keep the padding and
    truncation of whatever the process tokenized last). ``history``: a kill after the run's last
    file leaves its checkpoints, which the rerun removes without training again."""
    pairs = write_pairs(tmp_path / "pairs", pairs_rows(tiny_sentences * 2), rows_per_shard=5)
    common = dict(max_steps=12, save_every=6, eval_every=eval_every, buffer_size=6, lr=1e-3)
    reference = config(tmp_path / "ref", tiny_model_dir, sts_dir, "simcse", pairs, **common)
    T.run(reference, progress=False)

    killed = config(tmp_path / "killed", tiny_model_dir, sts_dir, "simcse", pairs, **common)
    cfg_file = tmp_path / "cfg.json"
    cfg_file.write_text(killed.model_dump_json())
    script = tmp_path / "finish_killer.py"
    script.write_text(FINISH_KILLER)
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    result = subprocess.run(
        [sys.executable, str(script), str(cfg_file), point],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    out = tmp_path / "killed" / "models" / "simcse"
    assert "step-000012" in [p.name for p in (out / "checkpoints").iterdir()]
    assert (out / "model").exists() == (point == "history")

    T.run(killed, progress=False)
    ref_out = tmp_path / "ref" / "models" / "simcse"
    expected, got = _folder_bytes(ref_out / "model"), _folder_bytes(out / "model")
    assert sorted(got) == sorted(expected)
    differ = [name for name in expected if got[name] != expected[name]]
    assert not differ, f"differ after resuming the finishing step: {differ}"
    tokenizer = json.loads(got["tokenizer.json"])
    assert tokenizer["truncation"] is None and tokenizer["padding"] is None
    info = json.loads((out / "model" / "pairforge.json").read_text())
    ref_info = json.loads((ref_out / "model" / "pairforge.json").read_text())
    assert info["step"] == ref_info["step"]
    assert losses(out) == losses(ref_out)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in ref_out.iterdir())
