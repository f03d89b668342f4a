"""Profiles: params presets (``demo``, ``paper``, ``apertium``) that ``params.yaml`` is made from.

A preset is complete, or names the profile it ``extends`` and holds only what differs
(``apertium``: the demo with real offline translations).

``pairforge profile use paper`` rewrites params.yaml from the preset; DVC then reruns exactly
the stages whose params changed. ``pairforge profile check`` validates a preset or a params file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from pairforge.pipeline.cli_options import cli_errors
from pairforge.pipeline.config import (  # noqa: F401 (the profiles' API is this module's)
    DVC_FILE,
    EXTENDS,
    PARAMS_FILE,
    PRESETS,
    available,
    check_model_specs,
    load_params,
    preset,
    preset_path,
    validate_section,
)
from pairforge.pipeline.errors import ConfigError

app = typer.Typer(
    help="Switch between the profiles (demo, paper, apertium), or check a params file.",
    no_args_is_help=True,
)


def preset_text(name: str) -> str:
    """A profile's params as YAML text: a complete preset's file as it is (comments kept), an
    overlay's merged params with a line naming the files that explain them."""
    path = preset_path(name)
    text = path.read_text()
    base = (yaml.safe_load(text) or {}).get(EXTENDS)
    if not base:
        return text
    note = (
        f"# The {name!r} profile: the {base!r} preset with what differs from it "
        f"(pipeline/presets/{name}.yaml, commented there) merged in.\n"
    )
    return note + yaml.safe_dump(preset(name), sort_keys=False, width=100)


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
        same = current is not None and preset(name) == current
        typer.echo(f"{name}{'  (active)' if same else ''}")


@app.command("use")
@cli_errors
def use(
    name: Annotated[str, typer.Argument(help="profile name: demo, paper or apertium")],
    params: Annotated[str, typer.Option(help="params file to write")] = PARAMS_FILE,
) -> None:
    """Write the profile's params to params.yaml (after validating them)."""
    from pairforge.pipeline.shards import atomic_write_bytes

    validate_params(preset(name))
    header = f"# Written by `pairforge profile use {name}`; edit freely, or switch profile again.\n"
    atomic_write_bytes(Path(params), (header + preset_text(name)).encode())
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
    if Path(target).exists():
        validate_params(load_params(target), Path(target).parent / DVC_FILE)
    else:
        validate_params(preset(target), Path(DVC_FILE))
    typer.echo(f"{target}: valid")
