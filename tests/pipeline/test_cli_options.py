"""Each stage's command is generated from its config: one option per field, the field's
description as help, the option reaching the config, and the names the CLI has always had."""

from __future__ import annotations

import importlib
from typing import Literal

import pytest
import yaml
from pairforge.pipeline.plumbing.config import StageConfig
from pairforge.pipeline.plumbing.stagedefs import StageDef
from pairforge.stages import STAGES, cli, config_models, stage_module
from pairforge.stages.options import option_type, stage_command
from pydantic import BaseModel
from typer.testing import CliRunner

runner = CliRunner()

# Fields set in params.yaml only: nested models, mappings, fixed-size tuples.
PARAMS_ONLY = {"backtranslate": {"routes", "noise"}, "mine": {"widen_limits"}, "train": {"recipes"}}
# Every stage reads a params file (--params) or a profile's settings (--profile); a stage
# missing from SHARED takes no other shared option.
PARAMS = {"params", "profile"}
DATASET = {*PARAMS, "workers", "scheduler", "progress"}
SHARED = {
    "ingest": DATASET,
    "standin": PARAMS,
    "backtranslate": DATASET,
    "rewrite": DATASET,
    "pretrain": {*PARAMS, "progress"},
    "embed": DATASET,
    "mine": DATASET,
    "sample": DATASET,
    "report": PARAMS,
    "train": {*PARAMS, "progress"},
    "evaluate": {*PARAMS, "progress"},
}
# Declarations that are not ``--field-name`` (``--field-name/--no-field-name`` for a bool):
# dvc.yaml, the docs and scripts type these.
DECLARED = {
    ("ingest", "inputs"): (["--input", "-i"], []),
    ("standin", "enabled"): (["--enabled"], ["--disabled"]),
    ("standin", "pairs"): (["--pair"], []),
    ("rewrite", "enabled"): (["--enabled"], ["--disabled"]),
    ("pretrain", "train_backbone"): (["--train-backbone"], ["--freeze-backbone"]),
    ("train", "objective"): (["--objective", "-o"], []),
    ("evaluate", "models"): (["--model", "-m"], []),
    ("evaluate", "tasks"): (["--task", "-t"], []),
}


@pytest.mark.parametrize("stage", list(STAGES))
def test_a_stage_has_one_option_per_field_with_its_description(stage):
    model = config_models()[stage]
    command = cli.load_command(stage)
    options = {p.name: p for p in command.params}
    fields = set(model.model_fields) - PARAMS_ONLY.get(stage, set())
    assert set(options) == fields | SHARED.get(stage, PARAMS)
    for name in fields:
        field, option = model.model_fields[name], options[name]
        choices = option_type(field.annotation)[1]
        suffix = f" [{'|'.join(choices)}]" if choices else ""
        assert field.description and option.help == field.description + suffix, name
        assert option.default is None, name  # None: the params.yaml key
        dashed = name.replace("_", "-")
        flags = [f"--no-{dashed}"] if field.annotation is bool else []
        expected = DECLARED.get((stage, name), ([f"--{dashed}"], flags))
        assert (option.opts, option.secondary_opts) == expected, name


@pytest.mark.parametrize("stage", list(STAGES))
def test_the_help_lists_every_option_and_keeps_the_docstring(stage):
    module = importlib.import_module(stage_module(stage))
    result = runner.invoke(cli.app, [stage, "--help"], env={"COLUMNS": "300"})
    assert result.exit_code == 0
    for option in cli.load_command(stage).params:
        assert option.opts[0] in result.output
    summary = module.command.__doc__.split("\n\n")[0].split()
    assert " ".join(result.output.split()).count(" ".join(summary)) == 1


def test_a_literal_shows_its_choices_after_its_description():
    options = {p.name: p for p in cli.load_command("sample").params}
    assert options["ipw"].help.endswith(
        "(a control: the band alone decides) [paper|calibrated|uniform]"
    )
    assert options["m"].help == "negatives drawn per anchor (DebCSE: 2)"


@pytest.fixture
def captured(monkeypatch):
    """Replace a stage module's ``run`` with one that records its arguments."""
    calls: list[tuple[tuple, dict]] = []

    def patch(stage: str) -> list[tuple[tuple, dict]]:
        module = importlib.import_module(stage_module(stage))
        monkeypatch.setattr(module, "run", lambda *a, **k: calls.append((a, k)))
        return calls

    return patch


def params_file(tmp_path, sections: dict) -> str:
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(sections))
    return str(path)


def test_a_number_on_the_command_line_reaches_the_config(tmp_path, captured):
    calls = captured("mine")
    params = params_file(
        tmp_path, {"mine": {"output": str(tmp_path / "pools"), "band_low": 0.2, "band_high": 0.7}}
    )
    result = runner.invoke(cli.app, ["mine", "--params", params, "--band-low", "0.3", "--k", "9"])
    assert result.exit_code == 0, result.output
    cfg = calls[0][0][0]
    assert (cfg.band_low, cfg.band_high, cfg.k) == (0.3, 0.7, 9)
    assert calls[0][1]["progress"] is True


def test_a_bool_flag_overrides_the_params_key_both_ways(tmp_path, captured):
    calls = captured("sample")
    section = {"output": str(tmp_path / "pairs"), "edit_normalized": True}
    params = params_file(tmp_path, {"sample": section})
    for argv, expected in (([], True), (["--no-edit-normalized"], False)):
        result = runner.invoke(cli.app, ["sample", "--params", params, *argv])
        assert result.exit_code == 0, result.output
        assert calls[-1][0][0].edit_normalized is expected
    params = params_file(tmp_path, {"sample": {**section, "edit_normalized": False}})
    result = runner.invoke(cli.app, ["sample", "--params", params, "--edit-normalized"])
    assert result.exit_code == 0 and calls[-1][0][0].edit_normalized is True


def test_a_choice_outside_the_literal_is_one_line_exit_2(tmp_path, captured):
    calls = captured("sample")
    params = params_file(tmp_path, {"sample": {"output": str(tmp_path / "pairs")}})
    result = runner.invoke(cli.app, ["sample", "--params", params, "--ipw", "bogus"])
    assert result.exit_code == 2 and not calls
    assert result.output.strip().splitlines() == [
        "error: sample.ipw: 'bogus' is not allowed; allowed values: "
        "'paper', 'calibrated' or 'uniform'"
    ]
    result = runner.invoke(cli.app, ["sample", "--params", params, "--ipw", "uniform"])
    assert result.exit_code == 0 and calls[-1][0][0].ipw == "uniform"


def test_repeated_options_fill_a_list_and_replace_the_params_list(tmp_path, captured):
    calls = captured("evaluate")
    section = {"models": ["models/simcse"], "tasks": ["stsb"], "baseline": None}
    params = params_file(tmp_path, {"evaluate": section})
    result = runner.invoke(cli.app, ["evaluate", "--params", params, "-m", "a", "--model", "b"])
    assert result.exit_code == 0, result.output
    assert calls[-1][0][0].models == ["a", "b"] and calls[-1][0][0].tasks == ["stsb"]
    result = runner.invoke(cli.app, ["evaluate", "--params", params, "-t", "sickr", "-t", "sts12"])
    assert result.exit_code == 0 and calls[-1][0][0].tasks == ["sickr", "sts12"]


def test_train_hears_which_settings_the_command_line_gave(tmp_path, captured):
    calls = captured("train")
    params = params_file(tmp_path, {"train": {"output": str(tmp_path / "models"), "lr": 2e-5}})
    result = runner.invoke(
        cli.app, ["train", "--params", params, "-o", "debcse", "--lr", "1e-4", "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    (cfg,), kwargs = calls[-1]
    assert (cfg.objective, cfg.lr) == ("debcse", 1e-4)
    assert kwargs == {"progress": False, "forced": frozenset({"objective", "lr"})}


def test_a_stage_extra_option_replaces_the_shared_one(tmp_path, captured):
    # embed's --workers defaults to None (one worker per GPU), not the shared 0.
    options = {p.name: p for p in cli.load_command("embed").params}
    assert options["workers"].default is None and "-w" in options["workers"].opts
    assert "one worker per GPU" in options["workers"].help


class Inner(BaseModel):
    x: int = 0


def test_option_types_and_what_stays_in_params():
    assert option_type(int) == (int, (), False)
    assert option_type(float | None) == (float, (), False)
    assert option_type(Literal["a", "b"] | None) == (str, ("a", "b"), False)
    assert option_type(list[str]) == (str, (), True)
    assert option_type(list[Literal["x"]]) == (str, ("x",), True)
    for params_only in (Inner, list[Inner], dict[str, Inner], tuple[float, float]):
        assert option_type(params_only) is None
    with pytest.raises(TypeError, match="no command-line option"):
        option_type(int | str)


class Tiny(StageConfig):
    size: int = 1


TINY = StageDef(name="tiny", module=__name__, config=Tiny, inputs=(), outputs=())


def test_a_body_parameter_that_is_no_option_is_refused_at_import():
    with pytest.raises(TypeError, match="'oops' is no shared option"):

        @stage_command(TINY)
        def command(cfg: Tiny, oops: int) -> None:
            """Nothing."""

    with pytest.raises(TypeError, match="option names for fields it lacks"):
        stage_command(TINY, names={"sise": ("--sise",)})(lambda cfg: None)


def test_a_full_disk_names_the_dataset_and_the_file():
    import errno

    from pairforge.stages.options import disk_full, disk_full_message

    def msg(file):
        return disk_full_message(OSError(errno.ENOSPC, "No space left on device", file))

    assert msg("out/pairs/data/part-00003.parquet").startswith(
        "no space left on the device writing out/pairs/data/part-00003.parquet "
        "(dataset 'out/pairs'); free some space"
    )
    assert "(dataset 'data/sentences')" in msg("data/sentences/_work/clean/_progress/p.json")
    assert "(dataset 'd/x')" in msg("d/x/_progress/part-00000.json")
    assert msg("metrics/ingest.json").startswith(
        "no space left on the device writing metrics/ingest.json; free"
    )
    assert disk_full(OSError("IOError: No space left on device. Detail: [errno 28]"))
    assert not disk_full(OSError(errno.EACCES, "Permission denied", "x"))
