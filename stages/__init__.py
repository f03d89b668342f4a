"""One package per DVC stage; the stage word is the package, the CLI command and the params section.

Each stage's ``stage.py`` declares it once (``STAGE``, a
``pipeline.plumbing.stagedefs.StageDef``): its config, inputs, outputs, params and headline
metrics. Its command (``stages/cli.py``), its fingerprint and its dvc.yaml entry (``pairforge
dvc-yaml``) follow from that declaration; this registry only says which stages there are, in
pipeline order.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pairforge.pipeline.plumbing.stagedefs import StageDef

# Pipeline order: the order of dvc.yaml and of the command listing.
STAGES: tuple[str, ...] = (
    "ingest",
    "standin",
    "backtranslate",
    "rewrite",
    "pretrain",
    "embed",
    "mine",
    "sample",
    "report",
    "train",
    "evaluate",
)


def stage_module(name: str) -> str:
    """The module that declares stage ``name`` and holds its ``command``."""
    return f"pairforge.stages.{name}.stage"


def declaration(name: str) -> StageDef:
    """Stage ``name``'s declaration, its module imported now."""
    if name not in STAGES:
        raise KeyError(f"no stage {name!r}; stages: {', '.join(STAGES)}")
    return importlib.import_module(stage_module(name)).STAGE


def declarations() -> dict[str, StageDef]:
    """Every stage's declaration, in pipeline order."""
    return {name: declaration(name) for name in STAGES}


def config_models() -> dict[str, type]:
    """Each stage's config model, imported on demand."""
    return {name: stage.config for name, stage in declarations().items()}
