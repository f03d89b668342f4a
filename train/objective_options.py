"""The options each objective accepts (``train.recipes.<objective>.options``), read from its
constructor without importing torch.

An objective's options are the arguments of its constructor (``train/objectives/<module>.py``)
that the trainer does not provide itself (:data:`PROVIDED`: the encoder, the tokenizer, sizes and
token ids, the start model's pooling, the MLM head): their names, types, bounds and defaults are
declared once, there, with the types below (``temperature: Positive = 0.05``). This module reads
those signatures from the source (ast), so that ``pairforge profile check`` and the start of
``pairforge train`` reject an unknown objective, a misspelt option or a wrong type in one line
before torch or any model loads. ``tests/train/test_objective_options.py`` checks what it reads
against the imported constructors.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pairforge.pipeline.plumbing.errors import ConfigError
from pairforge.pipeline.science.models.pooling import DEFAULT_PROMPT
from pydantic import BaseModel, ConfigDict, Field, create_model

# --- the types of the options, for the objectives' constructors ---------------------------------

# Poolings an objective can train without a prompt; None: the start model's own, else the paper's.
TrainablePooling = Literal["cls", "cls_before_pooler", "mean"]
NegativeSpace = Literal["normalised", "raw"]
# CoT-BERT's prompt templates: a model family's pair, or the templates themselves.
Templates = Literal["auto", "bert", "roberta"] | list[str]
Positive = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]
Dropout = Annotated[float, Field(ge=0, lt=1)]
Share = Annotated[float, Field(gt=0, le=1)]
Decay = Annotated[float, Field(ge=0, le=1)]
Count = Annotated[int, Field(ge=1)]

# Constructor arguments the trainer fills (``objectives.base.BuildContext``): never options.
PROVIDED = frozenset(
    {
        "encoder",
        "tokenizer",
        "config",
        "hidden_size",
        "vocab_size",
        "mask_token_id",
        "pad_token_id",
        "start_pooling",
        "output_head",
        "mlm_head",
    }
)

OBJECTIVES_DIR = Path(__file__).resolve().with_name("objectives")
# What a constructor's annotations and defaults may name.
_NAMES: dict[str, Any] = {
    "TrainablePooling": TrainablePooling,
    "NegativeSpace": NegativeSpace,
    "Templates": Templates,
    "Positive": Positive,
    "NonNegative": NonNegative,
    "Dropout": Dropout,
    "Share": Share,
    "Decay": Decay,
    "Count": Count,
    "DEFAULT_PROMPT": DEFAULT_PROMPT,
    "float": float,
    "int": int,
    "bool": bool,
    "str": str,
    "list": list,
    "None": None,
}


class ObjectiveOptions(BaseModel):
    """Base of the option classes: unknown options are errors, and values are checked as they
    are (strict: no "0.05" string made a float), since the trainer passes them on unchanged."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


@functools.cache
def _classes() -> dict[str, ast.ClassDef]:
    """Every class of ``train/objectives/``, by name."""
    found: dict[str, ast.ClassDef] = {}
    for path in sorted(OBJECTIVES_DIR.glob("*.py")):
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.ClassDef):
                found[node.name] = node
    return found


def _objective_name(node: ast.ClassDef) -> str | None:
    """The value of the class's ``name = "..."`` (its objective name), or None."""
    for item in node.body:
        if (
            isinstance(item, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "name" for t in item.targets)
            and isinstance(item.value, ast.Constant)
        ):
            return item.value.value
    return None


def _constructor(node: ast.ClassDef) -> ast.FunctionDef:
    """The class's ``__init__``, or the nearest base class's that has one."""
    for item in node.body:
        if isinstance(item, ast.FunctionDef) and item.name == "__init__":
            return item
    for base in node.bases:
        if isinstance(base, ast.Name) and base.id in _classes():
            return _constructor(_classes()[base.id])
    raise ConfigError(f"objective class {node.name} has no constructor")


def _value(node: ast.expr) -> Any:
    """A default as written: a literal or one of :data:`_NAMES`."""
    if isinstance(node, ast.Name):
        return _NAMES[node.id]
    return ast.literal_eval(node)


def _options_model(node: ast.ClassDef) -> type[ObjectiveOptions]:
    init = _constructor(node)
    args = init.args.args[1:]  # less self
    defaults = [None] * (len(args) - len(init.args.defaults)) + list(init.args.defaults)
    pairs = [
        *zip(args, defaults, strict=True),
        *zip(init.args.kwonlyargs, init.args.kw_defaults, strict=True),
    ]
    fields: dict[str, Any] = {}
    for arg, default in pairs:
        if arg.arg in PROVIDED:
            continue
        if default is None or arg.annotation is None:
            raise ConfigError(f"{node.name}.{arg.arg}: an option needs a type and a default")
        annotation = eval(ast.unparse(arg.annotation), {"__builtins__": {}}, _NAMES)
        fields[arg.arg] = (annotation, _value(default))
    return create_model(f"{node.name}Options", __base__=ObjectiveOptions, **fields)


@functools.cache
def objective_options() -> dict[str, type[ObjectiveOptions]]:
    """Objective name (``train.objective``, the key of ``train.recipes``) -> its options model,
    read from the constructors of ``train/objectives/``."""
    return {
        name: _options_model(node)
        for node in _classes().values()
        if (name := _objective_name(node)) is not None
    }


def check_options(objective: str, options: Mapping[str, Any], key: str) -> ObjectiveOptions:
    """``options`` validated for ``objective`` (a key of :func:`objective_options`); a
    ConfigError naming ``key`` otherwise: an unknown option with the accepted ones, or the first
    invalid value."""
    from pairforge.pipeline.plumbing.config import validate_section

    model = objective_options()[objective]
    unknown = sorted(set(options) - set(model.model_fields))
    if unknown:
        raise ConfigError(
            f"{key}: unknown option {unknown[0]!r} (accepted: {', '.join(model.model_fields)})"
        )
    return validate_section(key, model, dict(options))
