"""The `train` and `evaluate` commands as users run them: params file, options, outputs, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.science import sts
from pairforge.stages.cli import app
from typer.testing import CliRunner

from tests.conftest import run_cli
from tests.sts_reference import reference_score, st_encoder
from tests.train.builders import pairs_rows, write_pairs

runner = CliRunner()


def params_file(tmp_path, model_dir, sts_dir, pairs, **train) -> str:
    params = {
        "train": {
            "input": str(pairs),
            "output": str(tmp_path / "models"),
            "model": str(model_dir),
            "objective": "simcse",
            "batch_size": 4,
            "lr": 1e-3,
            "max_steps": 8,
            "max_length": 16,
            "save_every": 4,
            "eval_every": 4,
            "sts_dir": str(sts_dir),
            "threads": 1,
            "metrics": str(tmp_path / "metrics/train.json"),
            "plots": str(tmp_path / "plots/train"),
            "reports": str(tmp_path / "reports"),
            **train,
        },
        "evaluate": {
            "data": str(sts_dir),
            "models": [str(tmp_path / "models" / "*" / "model")],
            "baseline": str(model_dir),
            "baseline_poolings": ["auto", "mean"],
            "batch_size": 8,
            "threads": 1,
            "metrics": str(tmp_path / "metrics/evaluate.json"),
            "report": str(tmp_path / "reports/evaluate.md"),
            "plot": str(tmp_path / "reports/evaluate.png"),
        },
    }
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return str(path)


def test_train_then_evaluate_write_models_metrics_plots_and_the_table(
    tmp_path, tiny_sentences, tiny_model_dir, sts_dir
):
    pairs = write_pairs(tmp_path / "pairs", pairs_rows(tiny_sentences), rows_per_shard=4)
    params = params_file(tmp_path, tiny_model_dir, sts_dir, pairs, max_steps=100)
    result = runner.invoke(app, ["train", "--params", params, "--max-steps", "8", "--no-progress"])
    assert result.exit_code == 0, result.output
    metrics = json.loads((tmp_path / "metrics/train.json").read_text())
    assert metrics["simcse"]["steps"] == 8 and metrics["simcse"]["best_step"] in (4, 8)
    dev_csv = (tmp_path / "plots/train/simcse_dev.csv").read_text().splitlines()
    assert dev_csv[0] == "step,score,stsb_dev,sickr_dev" and len(dev_csv) == 3

    result = runner.invoke(app, ["evaluate", "--params", params, "--no-progress"])
    assert result.exit_code == 0, result.output
    evaluation = json.loads((tmp_path / "metrics/evaluate.json").read_text())
    models = evaluation["models"]
    assert set(models) == {"simcse", "base (cls_before_pooler)", "base (mean)"}
    assert models["simcse"]["trained"]["step"] == metrics["simcse"]["best_step"]
    for scores in models.values():
        assert set(scores) >= {"sts12", "sts16", "stsb", "sickr", "avg", "alignment", "uniformity"}
        assert -100 <= scores["avg"] <= 100
        # Each score is what sentence-transformers' vectors and scipy's Spearman give.
        encoder = st_encoder(scores["model"], scores["pooling"], scores["trained"] is not None)
        for task in sts.TEST_TASKS:
            reference = reference_score(encoder, sts.load_task(sts_dir, task))
            assert scores[task] == pytest.approx(reference, abs=1e-4), (scores["model"], task)
        assert scores["avg"] == pytest.approx(np.mean([scores[t] for t in sts.TEST_TASKS]))
    table = (tmp_path / "reports/evaluate.md").read_text()
    assert (
        "| model | pooling | STS12 | STS13 | STS14 | STS15 | STS16 | STS-B | SICK-R | Avg." in table
    )
    assert f"| simcse | cls_before_pooler | {models['simcse']['sts12']:.2f} |" in table
    assert (tmp_path / "reports/evaluate.png").stat().st_size > 1000


def test_missing_columns_is_one_line_and_exit_1(tmp_path, tiny_sentences, tiny_model_dir, sts_dir):
    only_text = write_pairs(tmp_path / "pairs", {S.TEXT: tiny_sentences})
    params = params_file(tmp_path, tiny_model_dir, sts_dir, only_text, objective="bsl")
    result = run_cli(["train", "--params", params], cwd=tmp_path, timeout=120)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(
        "error: train: objective 'bsl' needs training-data columns ['view1_text', 'view2_text']"
    )


def test_evaluate_without_data_says_how_to_get_it(tmp_path, tiny_model_dir, sts_dir):
    params = params_file(tmp_path, tiny_model_dir, sts_dir, tmp_path)
    result = runner.invoke(app, ["evaluate", "--params", params, "--data", str(tmp_path / "none")])
    assert result.exit_code == 2
    assert "does not exist; get the SentEval STS data" in result.output
    result = runner.invoke(
        app, ["evaluate", "--params", params, "--data", "$PAIRFORGE_NO_SUCH/sts"]
    )
    assert result.exit_code == 2 and "names an unset environment variable" in result.output
    partial = tmp_path / "partial"
    (partial / "sts12").mkdir(parents=True)
    result = runner.invoke(app, ["evaluate", "--params", params, "--data", str(partial)])
    assert result.exit_code == 1 and "STS.input.MSRpar.txt' not found" in result.output
    result = runner.invoke(
        app, ["evaluate", "--params", params, "--model", str(tmp_path / "m/model")]
    )
    assert result.exit_code == 2 and "not found (train it first" in result.output


def test_cotbert_and_infocse_train_from_their_recipes_and_evaluate_with_their_poolings(
    tmp_path, tiny_sentences, tiny_model_dir, sts_dir
):
    """`train -o cotbert` and `-o infocse` as users run them: the recipes in params.yaml reach the
    objectives (templates; the pre-trained auxiliary network), and the exports carry the
    objective's pooling into `evaluate`."""
    from pairforge.train.infocse_aux import AuxiliaryMLM, save_auxiliary
    from transformers import BertForMaskedLM

    mlm = BertForMaskedLM.from_pretrained(tiny_model_dir)
    aux = AuxiliaryMLM.from_encoder(mlm.bert, 1, 2, mlm.cls)
    save_auxiliary(aux, tmp_path / "aux", {"mlm_head_initialised": False})
    pairs = write_pairs(tmp_path / "pairs", pairs_rows(tiny_sentences), rows_per_shard=4)
    recipes = {
        "cotbert": {"options": {"temperature": 0.05, "templates": "auto", "denoise": True}},
        "infocse": {
            "max_steps": 6,
            "options": {"aux_path": str(tmp_path / "aux"), "mlm_weight": 0.5, "mask_rate": 0.4},
        },
    }
    params = params_file(tmp_path, tiny_model_dir, sts_dir, pairs, recipes=recipes, eval_every=0)
    for objective in ("cotbert", "infocse"):
        result = runner.invoke(app, ["train", "--params", params, "-o", objective, "--no-progress"])
        assert result.exit_code == 0, result.output
    metrics = json.loads((tmp_path / "metrics/train.json").read_text())
    assert metrics["infocse"]["steps"] == 6  # the recipe's max_steps beat the shared 8
    header = (tmp_path / "plots/train/infocse.csv").read_text().splitlines()[0].split(",")
    assert {"contrastive", "mlm", "mlm_accuracy"} <= set(header)
    history = json.loads((tmp_path / "models/infocse/history.json").read_text())
    mlm_losses = [row["mlm"] for row in history["history"]]
    assert all(loss > 0 for loss in mlm_losses)  # the auxiliary network ran on every step
    info = {
        name: json.loads((tmp_path / f"models/{name}/model/pairforge.json").read_text())
        for name in ("cotbert", "infocse")
    }
    assert info["cotbert"]["pooling"] == "mask" and "[MASK]" in info["cotbert"]["prompt"]
    assert info["infocse"]["pooling"] == "cls_before_pooler"

    # A re-pretrained auxiliary network (same path, new weights) retrains InfoCSE.
    with torch.no_grad():
        aux.head_layers[0].output.dense.weight.mul_(0.5)
    save_auxiliary(aux, tmp_path / "aux", {"mlm_head_initialised": False})
    result = runner.invoke(app, ["train", "--params", params, "-o", "infocse", "--no-progress"])
    assert result.exit_code == 0, result.output
    again = json.loads((tmp_path / "models/infocse/model/pairforge.json").read_text())
    assert again["fingerprint"] != info["infocse"]["fingerprint"]

    result = runner.invoke(app, ["evaluate", "--params", params, "--no-progress"])
    assert result.exit_code == 0, result.output
    models = json.loads((tmp_path / "metrics/evaluate.json").read_text())["models"]
    assert {"cotbert", "infocse"} <= set(models)
    table = (tmp_path / "reports/evaluate.md").read_text()
    assert "| cotbert | mask |" in table and "| infocse | cls_before_pooler |" in table


def test_train_outside_a_project_runs_on_defaults_with_the_pairs_encoder(
    tmp_path, tiny_sentences, tiny_model_dir, sts_dir
):
    """A receiving team's folder holds only the imported pairs: no params.yaml. `train` runs on
    its config's defaults, says so once, and trains the encoder the pairs' manifest names."""
    team = tmp_path / "team"
    pairs = write_pairs(team / "pairs", pairs_rows(tiny_sentences), rows_per_shard=4)
    manifest = json.loads((pairs / "_manifest.json").read_text())
    manifest["encoder"] = {"model": str(tiny_model_dir), "pooling": "mean", "max_length": 16}
    (pairs / "_manifest.json").write_text(json.dumps(manifest))
    args = ["train", "--input", "pairs", "--max-steps", "2", "--batch-size", "4",
            "--max-length", "16", "--eval-every", "2", "--sts-dir", str(sts_dir),
            "--threads", "1", "--no-progress"]  # fmt: skip
    result = run_cli(args, cwd=team, timeout=180)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("train: no params.yaml read; running on its config's defaults") == 1
    assert f"the encoder the pairs were mined with, {tiny_model_dir}" in result.stderr
    card = json.loads((team / "models/simcse/model/pairforge.json").read_text())
    assert card["base_model"] == str(tiny_model_dir)
    assert json.loads((team / "metrics/train.json").read_text())["simcse"]["steps"] == 2

    # An encoder that cannot load here is one line naming it; --model beats the manifest.
    manifest["encoder"]["model"] = "data/models/their-encoder"
    (pairs / "_manifest.json").write_text(json.dumps(manifest))
    result = run_cli(args, cwd=team, timeout=180)
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "error: train: the pairs 'pairs' were mined with the encoder 'data/models/their-encoder', "
            "which cannot load here"
        )
    )
    # --model beats the manifest (the option given: the config is left as it is).
    from pairforge.stages.train.stage import TrainConfig, _mined_encoder

    cfg = TrainConfig(input=str(pairs), model=str(tiny_model_dir))
    assert _mined_encoder(cfg, frozenset({"model"})) is cfg


def test_params_come_from_the_file_a_profile_or_the_defaults(tmp_path, monkeypatch):
    from pairforge.pipeline.plumbing.config import params_source, preset
    from pairforge.pipeline.plumbing.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    assert params_source(None, None) == ({}, "defaults")
    assert params_source(None, "paper") == (preset("paper"), "profile paper")
    with pytest.raises(ConfigError, match="params file 'other.yaml' not found"):
        params_source("other.yaml", None)  # named, so it must exist
    with pytest.raises(ConfigError, match="give --params or --profile, not both"):
        params_source("params.yaml", "demo")
    (tmp_path / "params.yaml").write_text("train: {lr: 0.5}\n")
    assert params_source(None, None) == ({"train": {"lr": 0.5}}, "params.yaml")
    # A profile's section, on the command line.
    result = runner.invoke(app, ["train", "--profile", "nope"])
    assert result.exit_code == 2 and "'nope' is not a profile" in result.output
