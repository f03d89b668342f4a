"""The pretrain stage: ingest's sentences -> InfoCSE's auxiliary network, through the CLI as users
run it, a rerun that does nothing, a changed param that reruns, and one-line errors."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from pairforge.pipeline.plumbing.runner import LocalExecutor
from pairforge.stages.cli import app
from pairforge.stages.ingest.stage import IngestConfig
from pairforge.stages.ingest.stage import run as ingest
from pairforge.stages.pretrain.stage import PretrainConfig, run, total_steps
from pairforge.train.infocse_aux import AUX_MANIFEST, AUX_WEIGHTS, read_aux_config
from pairforge.train.objectives import columns
from pairforge.train.objectives.infocse import InfoCSE
from safetensors.torch import load_file
from transformers import BertConfig, BertModel, BertTokenizerFast
from typer.testing import CliRunner

from tests.conftest import run_cli
from tests.tiny_models import SENTENCES, vocabulary

runner = CliRunner()


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory):
    """A folder with ingested sentences and a tiny BERT saved *without* an MLM head (as MiniLM)."""
    root = tmp_path_factory.mktemp("pretrain_project")
    (root / "corpus.txt").write_text("\n".join(SENTENCES * 2) + "\n")
    ingest(
        IngestConfig(
            root=str(root),
            inputs=["corpus.txt"],
            output=str(root / "data/sentences"),
            quarantine=str(root / "data/quarantine"),
            metrics=str(root / "metrics/ingest.json"),
        ),
        LocalExecutor(),
        progress=False,
    )
    (root / "tok").mkdir()
    (root / "tok/vocab.txt").write_text("\n".join(vocabulary()) + "\n")
    tokenizer = BertTokenizerFast.from_pretrained(str(root / "tok"))
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    BertModel(config).save_pretrained(root / "encoder")
    tokenizer.save_pretrained(root / "encoder")
    return root


def config(root, **overrides) -> PretrainConfig:
    values = dict(
        input=str(root / "data/sentences"),
        model=str(root / "encoder"),
        output=str(root / "models/infocse-aux"),
        lower_layers=1,
        steps=4,
        batch_size=4,
        checkpoint_every=2,
        learning_rate=1e-3,
        device="cpu",
        metrics=str(root / "metrics/pretrain.json"),
        plot_data=str(root / "plots/pretrain.csv"),
        figure=str(root / "plots/pretrain.png"),
    )
    return PretrainConfig(**{**values, **overrides})


@pytest.mark.slow
def test_pretrain_command_end_to_end(project):
    cfg = config(project)
    (project / "params.yaml").write_text(yaml.safe_dump({"pretrain": cfg.model_dump()}))
    result = run_cli(["pretrain", "--no-progress"], cwd=project)
    assert result.returncode == 0, result.stderr
    assert "has no MLM head; a newly initialised one is trained" in result.stderr
    assert "pretrain: 4 steps over 8 sentences (2.00 epochs)" in result.stderr
    out = project / "models/infocse-aux"
    assert (out / AUX_MANIFEST).exists() and (out / AUX_WEIGHTS).exists()
    assert (out / "encoder/config.json").exists() and not (out / "_checkpoint").exists()
    meta = read_aux_config(out)
    assert meta["mlm_head_initialised"] and meta["sentences"] == 8 and meta["lower_layers"] == 1
    metrics = json.loads((project / "metrics/pretrain.json").read_text())
    assert metrics["steps"] == 4 and metrics["mlm_head_initialised"]
    assert metrics["backbone_trained"] and metrics["epochs"] == 2.0
    assert metrics["aux_mlm_first"] > 0 and "aux_mlm_accuracy_last" in metrics
    rows = (project / "plots/pretrain.csv").read_text().splitlines()
    assert rows[0] == "step,loss,mlm,aux_mlm,aux_mlm_accuracy,lr" and len(rows) == 5
    assert (project / "plots/pretrain.png").read_bytes()[:4] == b"\x89PNG"
    # The train stage's InfoCSE reads the result through aux_path.
    tokenizer = BertTokenizerFast.from_pretrained(str(project / "encoder"))
    encoder = BertModel.from_pretrained(out / "encoder")
    objective = InfoCSE(32, tokenizer, config=encoder.config, aux_path=str(out))
    assert objective.init_report["aux_pretrained"] and objective.init_report["mlm_head_initialised"]
    features = dict(tokenizer(SENTENCES[:4], padding=True, return_tensors="pt"))
    assert torch.isfinite(objective({columns.TEXT: features}, encoder)["loss"])


def test_rerun_is_up_to_date_and_a_changed_param_reruns(project):
    cfg = config(project, output=str(project / "models/second"), train_backbone=False)
    first = run(cfg, progress=False)
    assert not first["backbone_trained"]
    assert not (project / "models/second/encoder").exists()  # it would be the input model
    weights = project / "models/second" / AUX_WEIGHTS
    stamp = weights.stat().st_mtime_ns
    assert run(cfg, progress=False) == first
    assert weights.stat().st_mtime_ns == stamp  # nothing was trained or written again
    # Same params elsewhere: the same weights, the newly initialised MLM head included.
    twin = run(config(project, output=str(project / "models/twin"), train_backbone=False))
    assert {k: v for k, v in twin.items() if k != "seconds"} == {
        k: v for k, v in first.items() if k != "seconds"
    }
    a, b = load_file(weights), load_file(project / "models/twin" / AUX_WEIGHTS)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    more = run(config(project, output=cfg.output, train_backbone=False, steps=6), progress=False)
    assert more["steps"] == 6 and more["resumed_from"] == 0
    assert weights.stat().st_mtime_ns != stamp


def test_steps_from_epochs():
    assert total_steps(PretrainConfig(steps=0, epochs=8, batch_size=64), 1000) == 125
    assert total_steps(PretrainConfig(steps=0, epochs=0.01, batch_size=64), 10) == 1
    assert total_steps(PretrainConfig(steps=7), 10**6) == 7


def test_bad_config_and_missing_input_are_one_line_errors(project, tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"pretrain": config(project, lower_layers=3).model_dump()}))
    result = runner.invoke(app, ["pretrain", "--params", str(params), "--no-progress"])
    assert result.exit_code == 2
    assert (
        "pretrain.lower_layers: 3 is invalid" in result.output and "has 2 layers" in result.output
    )
    result = runner.invoke(app, ["pretrain", "--params", str(params), "--mask-rate", "1.5"])
    assert result.exit_code == 2 and "pretrain.mask_rate: 1.5 is invalid" in result.output
    missing = config(project, input=str(tmp_path / "nowhere")).model_dump()
    params.write_text(yaml.safe_dump({"pretrain": missing}))
    result = runner.invoke(app, ["pretrain", "--params", str(params)])
    assert result.exit_code == 1 and "the folder does not exist" in result.output


def test_a_run_that_makes_no_checkpoint_writes_into_a_folder_not_yet_there(project):
    """steps <= checkpoint_every and the backbone frozen (the demo profile's): neither a
    checkpoint nor encoder/ makes the output's folder first, and a project just made by
    `pairforge init` has no models/ folder."""
    out = project / "fresh/models/aux"
    cfg = config(project, output=str(out), steps=2, checkpoint_every=2, train_backbone=False)
    result = run(cfg, progress=False)
    assert result["steps"] == 2
    assert (out / AUX_MANIFEST).exists() and (out / "history.json").exists()
