"""The CLI as users meet it: help texts, one-line config errors with exit 2, profiles."""

from __future__ import annotations

import pytest
import yaml
from pairforge.pipeline.plumbing.config import params_source, section_config
from pairforge.pipeline.plumbing.errors import ConfigError
from pairforge.stages import config_models
from pairforge.stages.cli import app
from pairforge.stages.ingest.stage import IngestConfig
from pairforge.stages.profile import (
    available,
    config_defaults,
    preset,
    preset_path,
    preset_text,
    profile_params,
    validate_params,
)
from typer.testing import CliRunner

from tests.conftest import ROOT, run_cli

runner = CliRunner()


def test_root_help_lists_stages():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "ingest" in result.output and "profile" in result.output


def test_ingest_help_explains_every_option():
    result = runner.invoke(app, ["ingest", "--help"], terminal_width=200)
    assert result.exit_code == 0
    for field in IngestConfig.model_fields:
        assert f"--{field.replace('_', '-')}" in result.output or field == "inputs"
    for option in ("--input", "--workers", "--scheduler", "--params", "--no-progress"):
        assert option in result.output


def test_invalid_value_is_one_line_exit_2(tmp_path):
    (tmp_path / "params.yaml").write_text(
        yaml.safe_dump({"ingest": {"inputs": ["x.txt"], "format": "xml"}})
    )
    result = run_cli(["ingest"], cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: ingest.format: 'xml' is not allowed; allowed values:")
    assert "'jsonl'" in lines[0] and "'parquet'" in lines[0]


def test_unknown_key_and_bad_number_and_override(tmp_path):
    (tmp_path / "a.txt").write_text("one two three four\n")
    (tmp_path / "params.yaml").write_text(
        yaml.safe_dump({"ingest": {"inputs": ["a.txt"], "min_wrds": 2}})
    )
    result = runner.invoke(app, ["ingest", "--params", str(tmp_path / "params.yaml")])
    assert result.exit_code == 2
    assert "ingest.min_wrds: unknown key; allowed keys: root, inputs, format" in result.output
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"ingest": {"inputs": ["a.txt"]}}))
    result = runner.invoke(
        app, ["ingest", "--params", str(tmp_path / "params.yaml"), "--rows-per-shard", "0"]
    )
    assert result.exit_code == 2
    assert "ingest.rows_per_shard: 0 is invalid" in result.output
    result = runner.invoke(
        app,
        [
            "ingest",
            "--params",
            str(tmp_path / "params.yaml"),
            "--min-words",
            "9",
            "--max-words",
            "3",
        ],
    )
    assert result.exit_code == 2 and "min_words (9) must not exceed max_words (3)" in result.output


def test_missing_params_file_is_a_config_error(tmp_path):
    result = run_cli(["ingest", "--params", "nope.yaml"], cwd=tmp_path)
    assert result.returncode == 2 and "params file 'nope.yaml' not found" in result.stderr


def test_cli_options_override_params(tmp_path):
    (tmp_path / "a.txt").write_text("one two three four\nfive six\n")
    (tmp_path / "params.yaml").write_text(
        yaml.safe_dump({"ingest": {"inputs": ["a.txt"], "min_words": 3}})
    )
    result = run_cli(
        ["ingest", "--min-words", "2", "--output", "out", "--no-progress"], cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert "kept 2" in result.stderr


def test_profiles_validate_and_switch(tmp_path):
    assert {"demo", "paper"} <= set(available())
    for name in ("demo", "paper"):
        validate_params(profile_params(name))
        assert set(profile_params(name)) == set(config_models())
    params = tmp_path / "params.yaml"
    result = runner.invoke(app, ["profile", "use", "paper", "--params", str(params)])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(params.read_text()) == profile_params("paper")
    result = runner.invoke(app, ["profile", "check", str(params)])
    assert result.exit_code == 0 and "valid" in result.output
    result = runner.invoke(app, ["profile", "use", "huge"])
    assert result.exit_code == 2 and "'huge' is not a profile" in result.output


def test_a_preset_holds_only_what_differs_from_the_config_defaults():
    """Every default is set once, in the configs: each key of the demo and paper presets sets a
    value other than its config's default, and a section the preset leaves out is the config's
    defaults whole (a stage run with --profile reads the same)."""
    models = config_models()
    for name in ("demo", "paper"):
        raw = yaml.safe_load(preset_path(name).read_text())
        assert "extends" not in raw and set(raw) < set(models), name
        for section, values in raw.items():
            defaults = config_defaults(models[section])
            for key, value in values.items():
                assert key not in defaults or value != defaults[key], (name, section, key)
    demo = profile_params("demo")
    assert "mine" not in preset("demo") and demo["mine"] == config_defaults(models["mine"])
    assert params_source(None, "demo")[0] == preset("demo")
    cfg = section_config("mine", models["mine"], preset("demo"), "profile demo")
    assert cfg == models["mine"](**demo["mine"])
    # A params file is whole: a section missing there is an error, not defaults.
    with pytest.raises(ConfigError, match="no 'mine' section"):
        section_config("mine", models["mine"], {}, "params.yaml")


def test_an_overlay_profile_is_its_base_with_what_differs(tmp_path):
    demo, apertium = profile_params("demo"), profile_params("apertium")
    assert "extends" not in apertium and set(apertium) == set(demo)
    changed = {s for s in demo if demo[s] != apertium[s]}
    assert changed == {"backtranslate", "sample"}
    bt = apertium["backtranslate"]
    assert bt["engine"] == "apertium" and bt["noise"]["mask_token"] == ""
    assert bt["noise"]["copies"] == demo["backtranslate"]["noise"]["copies"]  # merged, kept
    assert [r["name"] for r in bt["routes"]] == ["en-es-en", "en-ca-en", "en-eo-en"]
    assert bt["input"] == demo["backtranslate"]["input"]
    params = tmp_path / "params.yaml"
    runner.invoke(app, ["profile", "use", "demo", "--params", str(params)])
    first = params.read_text()
    with_apertium = {**demo, "backtranslate": bt, "sample": apertium["sample"]}
    assert yaml.safe_load(preset_text("apertium")) == with_apertium
    # `use` validates first: where Apertium is missing it stops and writes nothing.
    result = runner.invoke(app, ["profile", "use", "apertium", "--params", str(params)])
    if result.exit_code == 0:
        assert yaml.safe_load(params.read_text()) == apertium
        listed = runner.invoke(app, ["profile", "list", "--params", str(params)]).output
        assert "apertium  (active)" in listed and "demo  (active)" not in listed
    else:
        assert "apt-get install" in result.output and params.read_text() == first


def test_committed_params_are_the_demo_profile_written_whole():
    """params.yaml is what `pairforge profile use demo` writes: every key of every stage, each
    under its config field's description."""
    text = (ROOT / "params.yaml").read_text()
    assert text.split("\n", 1)[1] == preset_text("demo")
    assert yaml.safe_load(text) == profile_params("demo")
    assert "  # rows per output Parquet shard [profile]\n  rows_per_shard: 500\n" in text


def test_dvc_stages_read_only_keys_of_their_own_params_section():
    # Which keys exactly: tests/test_dvc.py checks them against the stages' declarations.
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    for stage, _model in config_models().items():
        spec = dvc["stages"][stage]
        assert spec["cmd"].split()[:2] == ["pairforge", stage]
        assert spec["params"], stage
        assert all(str(key).startswith(f"{stage}.") for key in spec["params"]), spec["params"]
        assert f"stages/{stage}/stage.py" in spec["deps"]
