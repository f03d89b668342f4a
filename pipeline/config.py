"""Configuration: one ``params.yaml`` section per stage, validated by a pydantic model.

Command-line options override the section key of the same name. Any invalid value gives a
``ConfigError`` whose message is one line naming the key, the value and what is allowed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pairforge.pipeline.errors import ConfigError
from pydantic import BaseModel, ConfigDict, ValidationError

PARAMS_FILE = "params.yaml"


class StageConfig(BaseModel):
    """Base of every stage's config: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


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


def _describe_error(section: str, model: type[BaseModel], exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in (section, *err["loc"]))
    kind = err["type"]
    value = err.get("input")
    if kind == "extra_forbidden":
        allowed = ", ".join(model.model_fields)
        return f"{loc}: unknown key; allowed keys: {allowed}"
    if kind == "missing":
        return f"{loc}: required key is missing"
    if kind in ("literal_error", "enum"):
        expected = err.get("ctx", {}).get("expected", "")
        return f"{loc}: {value!r} is not allowed; allowed values: {expected}"
    return f"{loc}: {value!r} is invalid: {err['msg']}"


def validate_section(section: str, model: type[StageConfig], values: dict[str, Any]) -> StageConfig:
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        raise ConfigError(_describe_error(section, model, exc)) from None


def stage_config(
    section: str,
    model: type[StageConfig],
    params_path: str | Path = PARAMS_FILE,
    overrides: dict[str, Any] | None = None,
) -> StageConfig:
    """The validated config of ``section``: params file values, then non-None overrides."""
    params = load_params(params_path)
    values = params.get(section)
    if values is None:
        raise ConfigError(f"{params_path}: no {section!r} section")
    if not isinstance(values, dict):
        raise ConfigError(f"{section}: must be a mapping of keys to values")
    merged = {**values, **{k: v for k, v in (overrides or {}).items() if v is not None}}
    return validate_section(section, model, merged)
