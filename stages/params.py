"""A profile's whole params: every stage's config defaults with the profile's preset over them.

Every default is set once, in a stage's config; a preset (``pipeline/presets/<name>.yaml``)
holds only what its profile sets differently. ``pairforge profile use`` writes the whole to
params.yaml (DVC reads every exact key from it), and a missing input's error names the stage
that writes it from the same whole params.
"""

from __future__ import annotations

import copy
from typing import Any

from pairforge.pipeline.plumbing.config import merge_params, preset
from pairforge.stages import config_models
from pydantic import BaseModel
from pydantic_core import to_jsonable_python


def config_defaults(model: type[BaseModel]) -> dict[str, Any]:
    """The defaults of a stage's config as params values (fields without one left out)."""
    return {
        key: to_jsonable_python(field.get_default(call_default_factory=True))
        for key, field in model.model_fields.items()
        if not field.is_required()
    }


def profile_params(name: str) -> dict[str, Any]:
    """A profile's whole params: every stage's config defaults (the one place defaults are
    set), with the profile's preset (what differs from them, ``pipeline/presets/``) over them,
    mappings merged key by key. DVC reads every exact key from params.yaml, so that file holds
    them all."""
    overlay = preset(name)
    params = {}
    for section, model in config_models().items():
        merged = merge_params(config_defaults(model), copy.deepcopy(overlay.get(section, {})))
        order = {key: i for i, key in enumerate(model.model_fields)}
        params[section] = dict(sorted(merged.items(), key=lambda kv: order.get(kv[0], len(order))))
    return params
