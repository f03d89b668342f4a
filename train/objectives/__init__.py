"""Training objectives, one module each, and the registry that maps config names to them.

Each objective declares the training-data columns it reads (``columns.py`` holds the names);
:func:`check_columns` lets the trainer fail before training starts when the data lacks one.
"""

from __future__ import annotations

from collections.abc import Iterable

from pairforge.train.objectives import columns
from pairforge.train.objectives.base import Objective, trainable_parameters
from pairforge.train.objectives.bsl import BSL
from pairforge.train.objectives.combined import Combined
from pairforge.train.objectives.cotbert import CoTBERT
from pairforge.train.objectives.debcse import DebCSE
from pairforge.train.objectives.denosent import DenoSent
from pairforge.train.objectives.infocse import InfoCSE
from pairforge.train.objectives.simcse import SimCSE
from pairforge.train.objectives.simcse_bt import SimCSETranslation
from pairforge.train.objectives.simcse_hn import SimCSEHardNegatives

OBJECTIVES: dict[str, type[Objective]] = {
    objective.name: objective
    for objective in (
        SimCSE,
        SimCSEHardNegatives,
        SimCSETranslation,
        DebCSE,
        DenoSent,
        BSL,
        InfoCSE,
        CoTBERT,
        Combined,
    )
}

# Columns each objective reads, by objective name.
COLUMNS: dict[str, list[str]] = {name: list(cls.columns) for name, cls in OBJECTIVES.items()}


def get_objective(name: str) -> type[Objective]:
    """The objective class registered as ``name``; ValueError naming the known ones otherwise."""
    try:
        return OBJECTIVES[name]
    except KeyError:
        known = ", ".join(sorted(OBJECTIVES))
        raise ValueError(f"unknown objective {name!r}; known objectives: {known}") from None


def required_columns(objective: str) -> list[str]:
    """The training-data columns that ``objective`` reads."""
    return list(get_objective(objective).columns)


def check_columns(objective: str, available_columns: Iterable[str]) -> None:
    """Raise ValueError naming ``objective`` and the columns it needs that are not available."""
    available = set(available_columns)
    missing = [column for column in required_columns(objective) if column not in available]
    if missing:
        raise ValueError(
            f"objective {objective!r} needs training-data columns {missing} that are missing; "
            f"available columns: {sorted(available)}"
        )


__all__ = [
    "BSL",
    "COLUMNS",
    "CoTBERT",
    "Combined",
    "OBJECTIVES",
    "DebCSE",
    "DenoSent",
    "InfoCSE",
    "Objective",
    "SimCSE",
    "SimCSEHardNegatives",
    "SimCSETranslation",
    "check_columns",
    "columns",
    "get_objective",
    "required_columns",
    "trainable_parameters",
]
