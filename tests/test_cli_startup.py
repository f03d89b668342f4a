"""The first seconds: `pairforge --help`, a stage's --help and `profile check` load no heavy library.

These are behavioural guards, not timings: each runs in a fresh interpreter and reads
``sys.modules``, so they fail when a module-level import of torch, FAISS, numba, Dask, ... creeps
back into the CLI, a stage's config or the objectives' option declarations.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pairforge.stages import cli
from typer.testing import CliRunner

from tests.conftest import ROOT

# What `pairforge --help` must not import: each costs 0.1-2 s before the first line of output.
HEAVY = ["torch", "transformers", "faiss", "numba", "dask", "distributed", "matplotlib"]
# What checking params (any stage's config, `profile check`) must not import either.
HEAVY_FOR_CONFIG = [
    *HEAVY,
    *("polars", "openai", "ctranslate2", "onnxruntime", "onnx", "sklearn", "datasets"),
]


def loaded_after(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; it leaves its findings in ``out``, returned with the
    heavy modules then loaded under ``heavy``."""
    script = (
        "import json, sys\n"
        "out = {}\n"
        f"{code}\n"
        f"out['heavy'] = sorted(m for m in {HEAVY_FOR_CONFIG!r} if m in sys.modules)\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_root_help_imports_no_stage_and_no_heavy_library():
    out = loaded_after(
        "from typer.testing import CliRunner\n"
        "from pairforge.stages.cli import app\n"
        "result = CliRunner().invoke(app, ['--help'], terminal_width=200)\n"
        "out['code'] = result.exit_code\n"
        "out['output'] = result.output\n"
        "out['stages'] = sorted(m for m in sys.modules if m.startswith('pairforge.stages.'))\n"
    )
    assert out["code"] == 0
    assert out["heavy"] == [] and out["stages"] == ["pairforge.stages.cli"]
    for name in cli.COMMANDS:
        assert name in out["output"]
    assert "Mine each sentence's negative candidate pool" in out["output"]


def test_stage_help_and_every_config_load_no_heavy_library():
    # Every command's --help, then both presets validated as `profile check` does.
    out = loaded_after(
        "from typer.testing import CliRunner\n"
        "from pairforge.stages.cli import COMMANDS, app\n"
        "from pairforge.stages.profile import profile_params, validate_params\n"
        "runner = CliRunner()\n"
        "out['codes'] = {n: runner.invoke(app, [n, '--help']).exit_code for n in COMMANDS}\n"
        "for name in ('demo', 'paper'):\n"
        "    validate_params(profile_params(name))\n"
    )
    assert set(out["codes"].values()) == {0}, out["codes"]
    assert out["heavy"] == []


def test_a_train_config_error_loads_no_torch(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("train:\n  objective: debcse\n  recipes: {debcse: {options: {tau: 1}}}\n")
    out = loaded_after(
        "from typer.testing import CliRunner\n"
        "from pairforge.stages.cli import app\n"
        f"result = CliRunner().invoke(app, ['train', '--params', {str(params)!r}])\n"
        "out['code'] = result.exit_code\n"
        "out['output'] = result.output\n"
    )
    assert out["code"] == 2 and "unknown option 'tau'" in out["output"]
    assert out["heavy"] == []


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_root_listing_shows_each_commands_own_summary(name):
    # The listing reads summaries from the source; they must be what the command itself says.
    command = cli.load_command(name)
    assert cli.summary(name)
    assert cli.summary(name) == (command.help or "").split("\n\n")[0].replace("\n", " ").strip()


def test_unknown_command_is_a_usage_error():
    result = CliRunner().invoke(cli.app, ["mien"])
    assert result.exit_code == 2 and "No such command 'mien'" in result.output
