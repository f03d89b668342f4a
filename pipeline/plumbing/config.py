"""Configuration: one ``params.yaml`` section per stage, validated by a pydantic model.

Command-line options override the section key of the same name. Any invalid value gives a
``ConfigError`` whose message is one line naming the key, the value and what is allowed.

Fields typed :data:`ModelSpec` name a model (``pipeline/science/models/spec.py``). A stage's
command checks its own before it loads anything (``stages/options.py``, ``check_model_specs``):
a local folder that does not exist, or a ``package:`` that is not installed, is one line naming
the key (and, when a DVC stage writes that folder, the stage to
run first). ``pairforge profile check`` checks every section the same way, except that a folder
under another stage's DVC output is fine there: the pipeline writes it before it is read.
"""

from __future__ import annotations

import os
import re
import typing
from pathlib import Path
from typing import Annotated, Any

import yaml
from pairforge.pipeline.plumbing.errors import ConfigError
from pydantic import BaseModel, ConfigDict, ValidationError

# Plumbing: no stage's output depends on this module, so it is no stage's code (its edits rerun
# nothing): pipeline/plumbing/stagedefs.py.
CHANGES_NO_OUTPUT = True

PARAMS_FILE = "params.yaml"
DVC_FILE = "dvc.yaml"
# The profiles' params (``pairforge profile``, ``--profile``): this package's data.
PRESETS = Path(__file__).resolve().parent.parent / "presets"
EXTENDS = "extends"


class _ModelSpecMarker:
    """Field metadata: the field holds a model spec (hub id, local folder or package:)."""

    def __repr__(self) -> str:
        return "MODEL_SPEC"


MODEL_SPEC = _ModelSpecMarker()
ModelSpec = Annotated[str, MODEL_SPEC]
OptionalModelSpec = Annotated[str | None, MODEL_SPEC]


class StageConfig(BaseModel):
    """Base of every stage's config: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def available() -> list[str]:
    """The profiles' names."""
    return sorted(p.stem for p in PRESETS.glob("*.yaml"))


def preset_path(name: str) -> Path:
    path = PRESETS / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(
            f"profile: {name!r} is not a profile; allowed values: {', '.join(available())}"
        )
    return path


def merge_params(base: Any, overlay: Any) -> Any:
    """``overlay`` over ``base``: mappings merge key by key, anything else replaces."""
    if isinstance(base, dict) and isinstance(overlay, dict):
        for key, value in overlay.items():
            base[key] = merge_params(base[key], value) if key in base else value
        return base
    return overlay


def preset(name: str) -> dict[str, Any]:
    """What a profile sets differently from the stages' config defaults, by section. A preset
    that starts with ``extends: <profile>`` holds only what differs from that profile (mappings
    merge key by key; lists and values replace). A stage run on a profile (``--profile``) takes
    the rest from its config's defaults; ``pairforge profile use`` writes the whole."""
    data = yaml.safe_load(preset_path(name).read_text()) or {}
    base = data.pop(EXTENDS, None)
    return merge_params(preset(base), data) if base else data


def load_params(path: str | Path = PARAMS_FILE) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise ConfigError(
            f"params file {str(path)!r} not found (run from the project root or pass --params)"
        )
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"params file {str(path)!r} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"params file {str(path)!r} must hold a mapping of sections")
    return data


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model class an annotation holds: itself, or inside a list, dict or union."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in reversed(typing.get_args(annotation)):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _model_at(model: type[BaseModel], path: list[Any]) -> type[BaseModel]:
    """The (nested) model that the keys ``path`` lead to from ``model``, for naming the keys
    allowed there; list indexes and mapping keys step into the element's model."""
    current = model
    for part in path:
        field = current.model_fields.get(part) if isinstance(part, str) else None
        inner = _model_in(field.annotation) if field is not None else None
        if inner is not None:
            current = inner
    return current


def _describe_error(section: str, model: type[BaseModel], exc: ValidationError) -> str:
    err = exc.errors()[0]
    # Union members add their type to the location (``literal['a','b']``, ``list[str]``); a key
    # never holds brackets.
    keys = [p for p in err["loc"] if not (isinstance(p, str) and "[" in p)]
    loc = ".".join(str(p) for p in (section, *keys))
    kind = err["type"]
    value = err.get("input")
    if kind == "extra_forbidden":
        allowed = ", ".join(_model_at(model, keys[:-1]).model_fields)
        return f"{loc}: unknown key; allowed keys: {allowed}"
    if kind == "missing":
        return f"{loc}: required key is missing"
    if kind in ("literal_error", "enum"):
        expected = err.get("ctx", {}).get("expected", "")
        return f"{loc}: {value!r} is not allowed; allowed values: {expected}"
    if kind == "value_error" and isinstance(value, dict):
        # A check across keys (a model validator): its message names them; the input is the
        # whole section, which would bury the message.
        return f"{loc}: {err['msg'].removeprefix('Value error, ')}"
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return f"{loc}: {shown} is invalid: {err['msg'].removeprefix('Value error, ')}"


def validate_section(section: str, model: type[StageConfig], values: dict[str, Any]) -> StageConfig:
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        raise ConfigError(_describe_error(section, model, exc)) from None


def params_source(params_path: str | Path | None, profile: str | None) -> tuple[dict, str]:
    """The params a command reads and where they come from (for its one line saying so):
    ``params_path`` when given (it must exist); else a profile's preset when ``profile`` is
    given; else ``params.yaml`` in the current folder; else nothing, so that each config takes
    its own defaults (a command run outside a project). Returns ``(params, source)``, ``source``
    one of the path, ``profile <name>`` or ``defaults``."""
    if params_path is not None and profile is not None:
        raise ConfigError("give --params or --profile, not both")
    if profile is not None:
        return preset(profile), f"profile {profile}"
    if params_path is not None or Path(PARAMS_FILE).exists():
        path = params_path if params_path is not None else PARAMS_FILE
        return load_params(path), str(path)
    return {}, "defaults"


def section_config(
    section: str,
    model: type[StageConfig],
    params: dict[str, Any],
    source: str,
    overrides: dict[str, Any] | None = None,
) -> StageConfig:
    """The validated config of ``section`` from params already read (:func:`params_source`:
    ``params`` and their ``source``), then non-None overrides. A profile (or no params at all)
    leaves to the config's defaults what it does not set; a params file must hold the section."""
    from_file = source != "defaults" and not source.startswith("profile ")
    values = params.get(section, None if from_file else {})
    if values is None:
        raise ConfigError(f"{source}: no {section!r} section")
    if not isinstance(values, dict):
        raise ConfigError(f"{section}: must be a mapping of keys to values")
    merged = {**values, **{k: v for k, v in (overrides or {}).items() if v is not None}}
    return validate_section(section, model, merged)


_VAR = re.compile(r"\$\{\s*([\w.-]+)\s*\}")


def stage_outputs(params: dict[str, Any], dvc_file: str | Path = DVC_FILE) -> dict[str, str]:
    """Output path -> the DVC stage that writes it, read from ``dvc_file`` with its ``${a.b}``
    interpolated from ``params``; empty when there is no such file. An output whose variables
    ``params`` does not hold is left out."""
    path = Path(dvc_file)
    if not path.is_file():
        return {}
    try:
        stages = (yaml.safe_load(path.read_text()) or {}).get("stages") or {}
    except (yaml.YAMLError, AttributeError):
        return {}

    def lookup(match: re.Match) -> str:
        value: Any = params
        for part in match.group(1).split("."):
            if not isinstance(value, dict) or part not in value:
                raise KeyError(match.group(1))
            value = value[part]
        return str(value)

    outputs: dict[str, str] = {}
    for stage, body in stages.items():
        for out in (body or {}).get("outs") or []:
            raw = next(iter(out)) if isinstance(out, dict) else out
            try:
                resolved = _VAR.sub(lookup, str(raw))
            except KeyError:
                continue
            outputs[os.path.normpath(resolved)] = stage
    return outputs


def writer_of(spec: str, outputs: dict[str, str]) -> str | None:
    """The stage whose output is ``spec`` or holds it, or None."""
    path = os.path.normpath(spec)
    for out, stage in outputs.items():
        if path == out or path.startswith(out + os.sep):
            return stage
    return None
