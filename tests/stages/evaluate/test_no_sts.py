"""Train and evaluate without the STS data, as a newcomer's demo runs: the demo evaluation set
selects the checkpoint and is scored, the absent STS data is said once with how to get it."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from pairforge.pipeline.science import sts
from pairforge.stages.cli import app
from pairforge.stages.evaluate import stage as evaluate_stage
from pairforge.stages.train import stage as train_stage
from typer.testing import CliRunner

from tests.conftest import ROOT
from tests.stages.train.test_stage import params_file
from tests.sts_reference import reference_score, st_encoder
from tests.train.builders import pairs_rows, write_pairs

runner = CliRunner()
DEMO = ROOT / "data" / "demo" / "eval"
STS_LABELS = ["STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK-R"]


@pytest.fixture
def log_lines():
    """What the stages log on the ``pairforge`` logger (it does not propagate to pytest's)."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("pairforge")
    handler, level = Keep(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield lines
    logger.removeHandler(handler)
    logger.setLevel(level)


def demo_params(tmp_path, model_dir, pairs, sts_dir, **train) -> str:
    """The test params with the demo profile's handling of absent STS data."""
    import yaml

    path = params_file(tmp_path, model_dir, sts_dir, pairs, **train)
    params = yaml.safe_load(Path(path).read_text())
    params["train"].update(eval_fallback=["demo_dev"], demo_dir=str(DEMO))
    params["evaluate"].update(
        tasks=["demo_test", *sts.TEST_TASKS],
        demo_data=str(DEMO),
        sts_missing="skip",
        models=[],
        baseline_poolings=["mean"],
    )
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    return path


def test_train_selects_on_the_demo_dev_split_when_the_sts_data_is_absent(
    tmp_path, tiny_sentences, tiny_model_dir, log_lines
):
    pairs = write_pairs(tmp_path / "pairs", pairs_rows(tiny_sentences), rows_per_shard=4)
    params = demo_params(tmp_path, tiny_model_dir, pairs, tmp_path / "no-sts", max_steps=4)
    result = runner.invoke(app, ["train", "--params", params, "--no-progress"])
    assert result.exit_code == 0, result.output
    said = [line for line in log_lines if "dev sets" in line]
    assert said == [
        f"train/simcse: no STS data at {tmp_path / 'no-sts'}; dev sets: Demo dev ({DEMO})"
    ]
    dev_csv = (tmp_path / "plots/train/simcse_dev.csv").read_text().splitlines()
    assert dev_csv[0] == "step,score,demo_dev" and len(dev_csv) == 2  # steps 4 (eval_every 4)
    info = json.loads((tmp_path / "models/simcse/model/pairforge.json").read_text())
    assert set(info["dev"]) >= {"score", "demo_dev"}
    assert info["settings"]["eval_tasks"] == ["demo_dev"]


def test_without_a_fallback_train_stops_with_the_download_command(
    tmp_path, tiny_sentences, tiny_model_dir
):
    pairs = write_pairs(tmp_path / "pairs", pairs_rows(tiny_sentences), rows_per_shard=4)
    params = params_file(tmp_path, tiny_model_dir, tmp_path / "no-sts", pairs)
    result = runner.invoke(app, ["train", "--params", params, "--no-progress"])
    assert result.exit_code == 2
    assert "does not exist; get the SentEval STS data" in result.output
    assert "git clone https://github.com/facebookresearch/SentEval" in result.output


def test_dev_sets_are_the_sts_ones_when_present_and_the_dev_files_are_fingerprinted(
    tmp_path, sts_dir
):
    cfg = train_stage.TrainConfig(
        sts_dir=str(sts_dir), eval_fallback=["demo_dev"], demo_dir=str(DEMO)
    )
    settings = train_stage.dev_sets(cfg, train_stage.settings_for(cfg))
    assert settings.eval_tasks == ("stsb_dev", "sickr_dev")

    copy = tmp_path / "eval"
    copy.mkdir()
    (copy / "dev.tsv").write_bytes((DEMO / "dev.tsv").read_bytes())
    cfg = train_stage.TrainConfig(
        sts_dir=str(tmp_path / "none"), eval_fallback=["demo_dev"], demo_dir=str(copy)
    )
    settings = train_stage.dev_sets(cfg, train_stage.settings_for(cfg))
    assert settings.eval_tasks == ("demo_dev",)
    before = train_stage.fingerprint(cfg, settings, "data")
    assert train_stage.fingerprint(cfg, settings, "data") == before
    # A re-scored pair changes which checkpoint is best: the run must not be kept as finished.
    text = (copy / "dev.tsv").read_text()
    (copy / "dev.tsv").write_text(text.replace("\t3.200\t", "\t3.000\t", 1))
    assert train_stage.fingerprint(cfg, settings, "data") != before


def test_train_before_sample_names_the_stage_to_run(tmp_path, tiny_model_dir, sts_dir):
    params = params_file(tmp_path, tiny_model_dir, sts_dir, tmp_path / "data" / "pairs")
    result = runner.invoke(app, ["train", "--params", params, "--no-progress"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: train.input: ")
    assert lines[0].endswith(
        "is not complete: the folder does not exist; the 'sample' stage writes it: "
        "run `pairforge sample` (or `dvc repro sample`)"
    )


def test_evaluate_without_sts_scores_the_demo_set_says_so_once_and_succeeds(
    tmp_path, tiny_model_dir, log_lines
):
    params = demo_params(tmp_path, tiny_model_dir, tmp_path, "$PAIRFORGE_NO_SUCH_DATA/sts")
    result = runner.invoke(app, ["evaluate", "--params", params, "--no-progress"])
    assert result.exit_code == 0, result.output
    said = [line for line in log_lines if "no STS data" in line]
    assert len(said) == 1, log_lines
    assert "git clone https://github.com/facebookresearch/SentEval" in said[0]
    assert all(label in said[0] for label in STS_LABELS)

    metrics = json.loads((tmp_path / "metrics/evaluate.json").read_text())
    assert metrics["tasks"] == ["demo_test"] and metrics["skipped"] == list(sts.TEST_TASKS)
    assert metrics["data"] is None and metrics["demo_data"] == str(DEMO)
    assert metrics["pairs"] == {"demo_test": {"scored": 240, "total": 240}}
    assert metrics["align_task"] == "demo_test"
    scores = metrics["models"]["base (mean)"]
    assert set(scores) >= {"demo_test", "avg", "alignment", "uniformity"}
    assert scores["avg"] == scores["demo_test"] and -100 <= scores["avg"] <= 100
    # The score is what sentence-transformers' vectors and scipy's Spearman give. The tiny BERT
    # reads most demo words as [UNK], so many cosines tie to the last bits, which padding breaks
    # either way: 0.01 apart between batch sizes, where the [CLS] pooling scores 4.93 and a
    # Pearson correlation 0.24 against the mean pooling's 2.63.
    reference = reference_score(
        st_encoder(str(tiny_model_dir), "mean", exported=False), sts.load_task(DEMO, "demo_test")
    )
    assert scores["demo_test"] == pytest.approx(reference, abs=0.05)

    report = (tmp_path / "reports/evaluate.md").read_text()
    assert f"Sets scored: Demo test (240 pairs, `{DEMO}`)." in report
    assert "**Not scored: " + ", ".join(STS_LABELS) + "**" in report
    assert "| model | pooling | Demo test | Avg. | align | uniform |" in report
    assert f"| base (mean) | mean | {scores['demo_test']:.2f} |" in report
    assert "align/uniform (lower is better): Demo test, all 240 pairs." in report
    assert "Quick check" not in report  # max_pairs is unset: every pair was scored
    assert (tmp_path / "reports/evaluate.png").stat().st_size > 1000


def test_evaluate_with_sts_scores_both_and_says_when_it_sampled(
    tmp_path, tiny_model_dir, sts_dir, log_lines
):
    params = demo_params(tmp_path, tiny_model_dir, tmp_path, sts_dir)
    result = runner.invoke(
        app, ["evaluate", "--params", params, "--no-progress", "--max-pairs", "50"]
    )
    assert result.exit_code == 0, result.output
    assert not [line for line in log_lines if "no STS data" in line]
    metrics = json.loads((tmp_path / "metrics/evaluate.json").read_text())
    assert metrics["tasks"] == ["demo_test", *sts.TEST_TASKS] and metrics["skipped"] == []
    assert metrics["align_task"] == "stsb" and metrics["data"] == str(sts_dir)
    assert metrics["pairs"]["demo_test"] == {"scored": 50, "total": 240}
    # Avg. is the STS average, comparable with published figures; the demo set stands beside it.
    for scores in metrics["models"].values():
        sts_mean = sum(scores[t] for t in sts.TEST_TASKS) / len(sts.TEST_TASKS)
        assert abs(scores["avg"] - sts_mean) < 1e-6 and scores["avg"] != scores["demo_test"]
    report = (tmp_path / "reports/evaluate.md").read_text()
    assert "Demo test (50 of 240 pairs" in report and "Not scored" not in report
    assert "**Quick check on a seeded sample of at most 50 pairs per task" in report


def test_the_paper_behaviour_an_absent_sts_folder_stops_evaluate(tmp_path, tiny_model_dir):
    params = demo_params(tmp_path, tiny_model_dir, tmp_path, tmp_path / "no-sts")
    result = runner.invoke(
        app, ["evaluate", "--params", params, "--no-progress", "--sts-missing", "error"]
    )
    assert result.exit_code == 2 and "does not exist; get the SentEval STS data" in result.output
    assert not (tmp_path / "metrics/evaluate.json").exists()


def test_the_figure_title_says_which_pairs_and_whether_sampled(tmp_path, monkeypatch):
    from pairforge.train import training_report as report

    titles = []
    monkeypatch.setattr(
        report, "_save_figure", lambda fig, path: titles.append(fig.axes[0].get_title())
    )
    scored = {"align_task": "stsb", "align_pairs": 300, "align_pairs_total": 1379}
    caption = evaluate_stage._align_caption(scored)
    assert caption == "STS-B, a seeded sample of 300 of 1379 pairs"
    report.plot_align_uniform(
        tmp_path / "x.png", {"m": {"alignment": 0.2, "uniformity": -2}}, caption
    )
    assert titles == ["alignment vs uniformity\nSTS-B, a seeded sample of 300 of 1379 pairs"]
    scored = {"align_task": "demo_test", "align_pairs": 240, "align_pairs_total": 240}
    assert evaluate_stage._align_caption(scored) == "Demo test, all 240 pairs"
