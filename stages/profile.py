"""Profiles: params presets (``demo``, ``paper``, ``apertium``) that ``params.yaml`` is made from.

Every default is set once, in the stages' config models. A preset holds only what its profile
sets differently (``pipeline/presets/<name>.yaml``, with why), over those defaults or over the
profile it ``extends`` (``apertium``: the demo with real offline translations).

``pairforge profile use paper`` writes params.yaml whole (every key, under its description):
DVC reads every exact key from it, and then reruns exactly the stages whose params changed.
``pairforge profile check`` validates a profile or a params file.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from pairforge.pipeline.plumbing.config import (  # noqa: F401 (the profiles' API is this module's)
    DVC_FILE,
    PARAMS_FILE,
    PRESETS,
    available,
    load_params,
    preset,
    preset_path,
    validate_section,
)
from pairforge.pipeline.plumbing.errors import ConfigError
from pairforge.stages import config_models
from pairforge.stages.options import check_model_specs, cli_errors
from pairforge.stages.params import config_defaults, profile_params  # noqa: F401 (the API)

app = typer.Typer(
    help="Switch between the profiles (demo, paper, apertium), or check a params file.",
    no_args_is_help=True,
)


def _comment(text: str, indent: str) -> str:
    return "".join(f"{indent}# {line}\n" for line in textwrap.wrap(text, 98 - len(indent)))


def preset_text(name: str) -> str:
    """A profile's whole params (:func:`profile_params`) as YAML, each key under its config
    field's description, the preset's own keys marked as what the profile sets."""
    overlay = preset(name)
    lines = [
        f"# Profile {name!r}: every stage's config defaults, and what the profile sets (marked\n"
        f"# [profile]; pipeline/presets/{name}.yaml says why).\n"
    ]
    models = config_models()
    for section, values in profile_params(name).items():
        lines.append(f"{section}:\n")
        fields = models[section].model_fields
        for key, value in values.items():
            about = fields[key].description or ""
            if key in overlay.get(section, {}):
                about = f"{about} [profile]" if about else "[profile]"
            if about:
                lines.append(_comment(about, "  "))
            dumped = yaml.safe_dump({key: value}, sort_keys=False, width=100, allow_unicode=True)
            lines.append(textwrap.indent(dumped, "  "))
    return "".join(lines)


def validate_params(params: dict[str, Any], dvc_file: str | Path = DVC_FILE) -> None:
    """Validate every section of a params mapping with its stage's config model, then its model
    specs: a local model folder must exist unless a stage of ``dvc_file`` writes it (the standin
    models of the demo), and a ``package:`` must be installed. Hub ids are not looked up."""
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
        same = current is not None and profile_params(name) == current
        typer.echo(f"{name}{'  (active)' if same else ''}")


@app.command("use")
@cli_errors
def use(
    name: Annotated[str, typer.Argument(help="profile name: demo, paper or apertium")],
    params: Annotated[str, typer.Option(help="params file to write")] = PARAMS_FILE,
) -> None:
    """Write the profile's params to params.yaml (after validating them)."""
    from pairforge.pipeline.plumbing.files import atomic_write_bytes

    validate_params(profile_params(name))
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
        validate_params(profile_params(target), Path(DVC_FILE))
    typer.echo(f"{target}: valid")
