"""Profiles: complete params presets (``demo``, ``paper``) that ``params.yaml`` is made from.

``pairforge profile use paper`` rewrites params.yaml from the preset; DVC then reruns exactly
the stages whose params changed. ``pairforge profile check`` validates a preset or a params file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from pairforge.pipeline.cli_options import cli_errors
from pairforge.pipeline.config import (
    DVC_FILE,
    PARAMS_FILE,
    check_model_specs,
    load_params,
    validate_section,
)
from pairforge.pipeline.errors import ConfigError

# The presets are the pipeline package's data, beside this (stages) package.
PRESETS = Path(__file__).resolve().parents[1] / "pipeline" / "presets"

app = typer.Typer(
    help="Switch between the demo and paper profiles, or check a params file.", no_args_is_help=True
)


def available() -> list[str]:
    return sorted(p.stem for p in PRESETS.glob("*.yaml"))


def preset_path(name: str) -> Path:
    path = PRESETS / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(
            f"profile: {name!r} is not a profile; allowed values: {', '.join(available())}"
        )
    return path


def validate_params(params: dict[str, Any], dvc_file: str | Path = DVC_FILE) -> None:
    """Validate every section of a params mapping with its stage's config model, then its model
    specs: a local model folder must exist unless a stage of ``dvc_file`` writes it (the standin
    models of the demo), and a ``package:`` must be installed. Hub ids are not looked up."""
    from pairforge.stages import config_models

    models = config_models()
    unknown = sorted(set(params) - set(models))
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown section; allowed sections: {', '.join(models)}")
    for section, model in models.items():
        if section not in params:
            raise ConfigError(f"{section}: section is missing")
        cfg = validate_section(section, model, params[section])
        check_model_specs(section, cfg, params, dvc_file, planned=True)


@app.command("list")
@cli_errors
def list_profiles(
    params: Annotated[str, typer.Option(help="params file to compare with")] = PARAMS_FILE,
) -> None:
    """List the profiles and say which one params.yaml currently equals."""
    current = load_params(params) if Path(params).exists() else None
    for name in available():
        same = current is not None and yaml.safe_load(preset_path(name).read_text()) == current
        typer.echo(f"{name}{'  (active)' if same else ''}")


@app.command("use")
@cli_errors
def use(
    name: Annotated[str, typer.Argument(help="profile name: demo or paper")],
    params: Annotated[str, typer.Option(help="params file to write")] = PARAMS_FILE,
) -> None:
    """Write the profile's params to params.yaml (after validating them)."""
    from pairforge.pipeline.shards import atomic_write_bytes

    path = preset_path(name)
    validate_params(yaml.safe_load(path.read_text()))
    header = f"# Written by `pairforge profile use {name}`; edit freely, or switch profile again.\n"
    atomic_write_bytes(Path(params), header.encode() + path.read_bytes())
    typer.echo(f"{params} now holds the {name!r} profile")


@app.command("check")
@cli_errors
def check(
    target: Annotated[
        str, typer.Argument(help="a profile name or a params file path")
    ] = PARAMS_FILE,
) -> None:
    """Validate a profile or a params file; exit 2 with the first problem.

    Model folders are looked for from the working directory, and outputs of the stages of the
    dvc.yaml beside the params file (here, for a profile name) count as present.
    """
    path = Path(target) if Path(target).exists() else preset_path(target)
    dvc_file = path.parent / DVC_FILE if Path(target).exists() else Path(DVC_FILE)
    validate_params(load_params(path), dvc_file)
    typer.echo(f"{target}: valid")
