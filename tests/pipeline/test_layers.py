"""The layers, from the ground up: ``pipeline/plumbing/``, ``pipeline/science/``, ``train/``,
``stages/``. A floor imports none above it (``pipeline/plumbing/`` not even the science beside
it); every module of each folder is read (ast), imports inside functions, relative imports and
``importlib`` calls with a literal module included. No module of ``pipeline/`` names a file of
``stages/`` or ``train/`` either (the stage declarations live with their stages)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from pairforge.pipeline.plumbing.imports import imports

ROOT = Path(__file__).resolve().parents[2]
ABOVE_PIPELINE = ("pairforge.stages", "pairforge.train")
FORBIDDEN = {
    "pipeline/plumbing": (*ABOVE_PIPELINE, "pairforge.pipeline.science"),
    "pipeline/science": ABOVE_PIPELINE,
    "train": ("pairforge.stages",),
}


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_a_layer_imports_no_layer_above_it(layer):
    files = sorted((ROOT / layer).rglob("*.py"))
    assert len(files) > 5, f"{layer}/: too few modules found; is ROOT right?"
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in files
        for line, name in imports(path, ROOT)
        if name == "pairforge"
        or any(name == f or name.startswith(f + ".") for f in FORBIDDEN[layer])
    ]
    assert not wrong, "\n".join(wrong)


def test_pipeline_has_only_its_two_floors():
    """Every module of ``pipeline/`` is on one of the two floors the checks above cover."""
    loose = [
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "pipeline").rglob("*.py")
        if p.relative_to(ROOT / "pipeline").parts[0] not in ("plumbing", "science", "__init__.py")
    ]
    assert not loose, loose


def test_the_ground_floor_names_no_file_above_it():
    """No string in ``pipeline/`` names a source file of ``stages/`` or ``train/``: what a stage
    reads and runs is declared in the stage's own module."""
    named = []
    for path in sorted((ROOT / "pipeline").rglob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        named += [
            f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and re.search(r"\b(stages|train)/\w+(/\w+)*\.py\b", node.value)
        ]
    assert not named, "\n".join(named)


def test_the_check_sees_a_nested_import(tmp_path):
    module = tmp_path / "pipeline" / "m.py"
    module.parent.mkdir()
    module.write_text("def f():\n    from pairforge.stages.embed import stage\n")
    assert (2, "pairforge.stages.embed") in imports(module, tmp_path)


@pytest.mark.parametrize(
    "source, line, name",
    [
        ("from ....stages import cli\n", 1, "pairforge.stages.cli"),
        ("from ....stages.embed.stage import run\n", 1, "pairforge.stages.embed.stage"),
        ("from . import shards\n", 1, "pairforge.pipeline.science.models.shards"),
        ("from .. import shards\n", 1, "pairforge.pipeline.science.shards"),
        ("from ...plumbing import shards\n", 1, "pairforge.pipeline.plumbing.shards"),
        (
            "import importlib\nimportlib.import_module('pairforge.train.loop')\n",
            2,
            "pairforge.train.loop",
        ),
        (
            "from importlib import import_module\nimport_module('pairforge.stages')\n",
            2,
            "pairforge.stages",
        ),
        (
            "import importlib\nimportlib.import_module('....stages.cli', 'pairforge.pipeline.science.models')\n",
            2,
            "pairforge.stages.cli",
        ),
        ("__import__('pairforge.train')\n", 1, "pairforge.train"),
    ],
)
def test_the_check_resolves_relative_and_importlib_imports(tmp_path, source, line, name):
    module = tmp_path / "pipeline" / "science" / "models" / "m.py"
    module.parent.mkdir(parents=True)
    module.write_text(source)
    assert (line, name) in imports(module, tmp_path)
