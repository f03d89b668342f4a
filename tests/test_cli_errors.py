"""Errors a newcomer meets in the first run: one line on stderr naming the params key and the
fix, exit 2, from the stage itself and from `pairforge profile check` before anything loads."""

from __future__ import annotations

import os
import shutil

import pytest
import yaml
from pairforge.stages.cli import app
from pairforge.stages.profile import profile_params
from typer.testing import CliRunner

from tests.conftest import ROOT, run_cli

runner = CliRunner()


def demo_params(tmp_path, dvc: bool = True, **changes) -> dict:
    """The demo profile with ``changes`` ({"section.key": value}) written to tmp_path/params.yaml,
    beside a copy of the project's dvc.yaml when ``dvc``."""
    params = profile_params("demo")
    for dotted, value in changes.items():
        *path, last = dotted.split(".")
        node = params
        for part in path:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[last] = value
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    if dvc:
        shutil.copy(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    return params


def one_error_line(args: list[str], cwd) -> str:
    """Run ``pairforge ARGS`` as a user would; it must fail with exit 2 and one stderr line."""
    done = run_cli(args, cwd=cwd)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def check(tmp_path):
    """``pairforge profile check`` run from tmp_path, as a user runs it beside their params: model
    folders are looked for from the working directory, and the checkout's own (a demo run leaves
    data/models/standin there) must not count."""
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        return runner.invoke(app, ["profile", "check", str(tmp_path / "params.yaml")])
    finally:
        os.chdir(here)


def test_a_missing_model_folder_names_its_key(tmp_path):
    demo_params(tmp_path, **{"embed.model": "./models/nope", "train.model": "./models/nope"})
    line = one_error_line(["embed"], tmp_path)
    assert line == (
        "error: embed.model: './models/nope': no such folder; "
        "set it to a model folder, a hub id (name or org/name) or package:<module>"
    )
    line = one_error_line(["train"], tmp_path)
    assert line.startswith("error: train.model: './models/nope': no such folder")
    result = check(tmp_path)
    assert result.exit_code == 2
    assert "pretrain.model" not in result.output  # the demo's pretrain encoder is a package
    assert "embed.model: './models/nope': no such folder" in result.output


def test_a_folder_another_stage_writes_passes_the_check_and_names_that_stage_at_run_time(
    tmp_path,
):
    # The demo's translation routes are folders the `standin` stage writes.
    demo_params(tmp_path)
    assert not (tmp_path / "data/models/standin").exists()
    result = check(tmp_path)
    assert result.exit_code == 0 and "valid" in result.output
    line = one_error_line(["backtranslate"], tmp_path)
    assert line == (
        "error: backtranslate.routes.0.forward: 'data/models/standin/opus-mt-en-zh' does not "
        "exist yet; the 'standin' stage writes it: run `pairforge standin` (or `dvc repro "
        "backtranslate`) first"
    )
    # Without a dvc.yaml nothing writes it: the check names the key.
    (tmp_path / "dvc.yaml").unlink()
    result = check(tmp_path)
    assert result.exit_code == 2
    assert "backtranslate.routes.0.forward: 'data/models/standin/opus-mt-en-zh': no such" in (
        result.output
    )


def test_a_folder_outside_every_stage_output_fails_the_check(tmp_path):
    demo_params(tmp_path, **{"backtranslate.routes.1.backward": "data/models/opus-mt-de-en"})
    result = check(tmp_path)
    assert result.exit_code == 2
    assert result.output.startswith(
        "error: backtranslate.routes.1.backward: 'data/models/opus-mt-de-en': no such folder"
    )


def test_hub_ids_pass_offline_and_missing_packages_do_not(tmp_path):
    demo_params(
        tmp_path,
        **{
            "train.model": "princeton-nlp/unsup-simcse-bert-base-uncased",
            "embed.model": "bert-base-uncased",
        },
    )
    assert check(tmp_path).exit_code == 0
    demo_params(tmp_path, **{"embed.model": "package:pairforge_no_such_model"})
    result = check(tmp_path)
    assert result.exit_code == 2
    assert result.output.startswith(
        "error: embed.model: 'package:pairforge_no_such_model': package "
        "'pairforge_no_such_model' is not installed"
    )


def test_a_band_the_wrong_way_round_says_just_that(tmp_path):
    demo_params(tmp_path, **{"mine.band_low": 0.9})
    line = one_error_line(["mine"], tmp_path)
    assert line == "error: mine: band_low (0.9) must not exceed band_high (0.75)"
    result = check(tmp_path)
    assert result.exit_code == 2
    assert result.output.strip() == "error: mine: band_low (0.9) must not exceed band_high (0.75)"


def test_an_unknown_objective_fails_the_check_and_the_stage(tmp_path):
    demo_params(tmp_path, **{"train.objective": "simclr"})
    result = check(tmp_path)
    assert result.exit_code == 2
    assert result.output.startswith("error: train.objective: unknown 'simclr'; known objectives:")
    assert "debcse" in result.output and "combined" in result.output
    line = one_error_line(["train"], tmp_path)
    assert line.startswith("error: train.objective: unknown 'simclr'")
    demo_params(tmp_path)
    result = runner.invoke(app, ["train", "-o", "simclr", "--params", f"{tmp_path}/params.yaml"])
    assert result.exit_code == 2 and "train.objective: unknown 'simclr'" in result.output


def test_a_misspelt_recipe_option_is_caught_by_the_check(tmp_path):
    params = demo_params(tmp_path)
    params["train"]["recipes"]["debcse"]["options"] = {"temprature": 0.05}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    result = check(tmp_path)
    assert result.exit_code == 2
    assert result.output.strip() == (
        "error: train.recipes.debcse.options: unknown option 'temprature' "
        "(accepted: temperature, positive_in_denominator, negative_space, pooling)"
    )
    line = one_error_line(["train"], tmp_path)
    assert line.startswith("error: train.recipes.debcse.options: unknown option 'temprature'")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"temperature": "hot"},
            "train.recipes.debcse.options.temperature: 'hot' is invalid: Input should be a "
            "valid number",
        ),
        (
            {"temperature": 0},
            "train.recipes.debcse.options.temperature: 0 is invalid: Input should be greater "
            "than 0",
        ),
        (
            {"negative_space": "cosine"},
            "train.recipes.debcse.options.negative_space: 'cosine' is not allowed; allowed "
            "values: 'normalised' or 'raw'",
        ),
    ],
)
def test_an_option_of_the_wrong_type_names_it(tmp_path, options, message):
    params = demo_params(tmp_path)
    params["train"]["recipes"]["debcse"]["options"] = options
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    result = check(tmp_path)
    assert result.exit_code == 2
    assert result.output.startswith(f"error: {message}")


def test_a_recipe_for_no_objective_is_named(tmp_path):
    params = demo_params(tmp_path)
    params["train"]["recipes"]["simclr"] = {"options": {}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    result = check(tmp_path)
    assert result.exit_code == 2
    assert result.output.startswith("error: train.recipes.simclr: no such objective; known:")


def test_both_profiles_check_valid_offline():
    for name in ("demo", "paper"):
        result = runner.invoke(app, ["profile", "check", name])
        assert result.exit_code == 0, result.output
        assert result.output.strip() == f"{name}: valid"


def test_a_missing_input_dataset_names_the_stage_that_writes_it(tmp_path, monkeypatch):
    demo_params(tmp_path)
    done = run_cli(["embed"], cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "error: dataset 'data/sentences' is not complete: the folder does not exist; the "
        "'ingest' stage writes it: run `pairforge ingest` (or `dvc repro ingest`)"
    ]
    # With --profile and no params.yaml, the dvc.yaml of the folder still names the writer.
    (tmp_path / "params.yaml").rename(tmp_path / "kept.yaml")
    done = run_cli(["embed", "--profile", "demo"], cwd=tmp_path)
    assert done.returncode == 1
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith("the 'ingest' stage writes it: run `pairforge ingest` (or `dvc repro ingest`)")
    ), done.stderr
    (tmp_path / "kept.yaml").rename(tmp_path / "params.yaml")
    # No dvc.yaml beside the params: nothing is known to write it, the error says only what.
    (tmp_path / "dvc.yaml").unlink()
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["export"])
    assert result.exit_code == 1
    assert result.output.strip().endswith("is not complete: the folder does not exist")


def test_export_reads_the_pairs_that_sample_writes(tmp_path, monkeypatch):
    """export's default input is sample.output of the params (declared once, in the sample
    stage's config, whose default applies without params)."""
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["export"])
    assert result.exit_code == 1 and "data/pairs" in result.output, result.output
    (tmp_path / "params.yaml").write_text("sample:\n  output: elsewhere/pairs\n")
    result = runner.invoke(app, ["export"])
    assert result.exit_code == 1 and "elsewhere/pairs" in result.output, result.output


def test_an_unknown_nested_key_lists_the_keys_allowed_there(tmp_path):
    params = demo_params(tmp_path)
    params["train"]["recipes"]["debcse"]["lrr"] = 1e-5
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    result = check(tmp_path)
    assert result.exit_code == 2
    assert result.output.startswith(
        "error: train.recipes.debcse.lrr: unknown key; allowed keys: batch_size, lr,"
    )
    assert "options" in result.output and "sts_dir" not in result.output
    params = demo_params(tmp_path)
    params["backtranslate"]["routes"][0]["pivot"] = "zh"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    result = check(tmp_path)
    assert result.exit_code == 2
    assert result.output.startswith(
        "error: backtranslate.routes.0.pivot: unknown key; allowed keys: name, forward, backward,"
    )
