"""The ``pairforge`` command: one sub-command per stage, plus profile management.

Each command's module is imported only when that command runs or shows its help: the stages
pull in pyarrow, FAISS, torch and friends, and ``pairforge --help`` should answer at once. The
root listing reads each command's one-line summary from its docstring in the source, without
importing the module.
"""

from __future__ import annotations

import ast
import functools
import importlib
import os
from typing import Any

import typer
from pairforge.stages import STAGES, stage_module
from typer.core import TyperGroup

# MKL's strict conditional numerical reproducibility: float32 matrix products give the same bits
# whatever the number of threads, so a Dask worker (one thread) writes the bytes an in-process run
# (all cores) writes (tests/stages/embed/test_embed_dask.py). Set before torch loads MKL; the
# Dask workers a command starts inherit it (what it costs: benchmarks/results/checks-2026-11-27.md).
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

# command -> (module, attribute). A function becomes a command; a ``typer.Typer`` a group.
# Pipeline order, which is also the order of the help listing: init (a project), every declared stage
# (stages/__init__.py), export beside the report (it lays out sample's pairs for other tools),
# then the commands that are no stage.
COMMANDS: dict[str, tuple[str, str]] = {"init": ("pairforge.stages.init", "command")}
for _name in STAGES:
    COMMANDS[_name] = (stage_module(_name), "command")
    if _name == "report":
        COMMANDS["export"] = (stage_module("export"), "command")
COMMANDS.update(
    {
        "verify": ("pairforge.stages.verify", "command"),
        "profile": ("pairforge.stages.profile", "app"),
        "dvc-yaml": ("pairforge.stages.dvcfile", "command"),
    }
)


@functools.cache
def load_command(name: str) -> Any:
    """The click command behind ``name``, its module imported now."""
    module, attribute = COMMANDS[name]
    target = getattr(importlib.import_module(module), attribute)
    if isinstance(target, typer.Typer):
        command = typer.main.get_group(target)
    else:
        single = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
        single.command(name=name)(target)
        command = typer.main.get_command(single)
    command.name = name
    return command


def source_file(module: str) -> str | None:
    """The source file of ``module``, found without importing it or the packages between it and
    ``pairforge.<layer>``: ``find_spec`` would import a stage's package to find its ``stage.py``."""
    parts = module.split(".")
    paths = list(importlib.import_module(".".join(parts[:2])).__path__)
    for depth, part in enumerate(parts[2:], 3):
        last = depth == len(parts)
        for base in paths:
            if last and os.path.isfile(os.path.join(base, part + ".py")):
                return os.path.join(base, part + ".py")
            init = os.path.join(base, part, "__init__.py")
            if os.path.isfile(init):
                if last:
                    return init
                paths = [os.path.join(base, part)]
                break
        else:
            return None
    return None


@functools.cache
def summary(name: str) -> str:
    """The first paragraph of the command's docstring (or, for a group, its ``help=``), read
    from the module's source without importing it."""
    module, attribute = COMMANDS[name]
    origin = source_file(module)
    if origin is None:
        return ""
    try:
        with open(origin, encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
    except (OSError, SyntaxError, ValueError):
        return ""  # no source to read (a bytecode-only install): the listing shows the name only
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == attribute:
            return (ast.get_docstring(node) or "").split("\n\n")[0].replace("\n", " ")
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == attribute for t in node.targets
        ):
            for keyword in getattr(node.value, "keywords", []):
                if keyword.arg == "help" and isinstance(keyword.value, ast.Constant):
                    return str(keyword.value.value)
    return ""


class LazyGroup(TyperGroup):
    """The root group: commands from :data:`COMMANDS`, each loaded on first use. While the root
    help is being written, each command is a stand-in that carries only its summary."""

    _listing = False

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in COMMANDS:
            return None
        if self._listing:
            return typer.core.TyperCommand(name=cmd_name, help=summary(cmd_name))
        return load_command(cmd_name)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            return super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    name="pairforge",
    cls=LazyGroup,
    help="Offline augmentation and hard-pair mining for unsupervised sentence embeddings.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    pass  # a callback makes the app a group (of LazyGroup) even with no registered command


def main() -> None:
    app()


if __name__ == "__main__":
    main()
