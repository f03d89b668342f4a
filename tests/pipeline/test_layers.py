"""The layers: ``pipeline/`` imports neither ``stages/`` nor ``train/``, and ``train/`` does not
import ``stages/``; every module of each folder is read (ast), imports inside functions, relative
imports and ``importlib`` calls with a literal module included."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.imports import imports

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {"pipeline": ("pairforge.stages", "pairforge.train"), "train": ("pairforge.stages",)}


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


def test_the_check_sees_a_nested_import(tmp_path):
    module = tmp_path / "pipeline" / "m.py"
    module.parent.mkdir()
    module.write_text("def f():\n    from pairforge.stages.embed import stage\n")
    assert (2, "pairforge.stages.embed") in imports(module, tmp_path)


@pytest.mark.parametrize(
    "source, line, name",
    [
        ("from ...stages import cli\n", 1, "pairforge.stages.cli"),
        ("from ...stages.embed.stage import run\n", 1, "pairforge.stages.embed.stage"),
        ("from . import shards\n", 1, "pairforge.pipeline.models.shards"),
        ("from .. import shards\n", 1, "pairforge.pipeline.shards"),
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
            "import importlib\nimportlib.import_module('...stages.cli', 'pairforge.pipeline.models')\n",
            2,
            "pairforge.stages.cli",
        ),
        ("__import__('pairforge.train')\n", 1, "pairforge.train"),
    ],
)
def test_the_check_resolves_relative_and_importlib_imports(tmp_path, source, line, name):
    module = tmp_path / "pipeline" / "models" / "m.py"
    module.parent.mkdir(parents=True)
    module.write_text(source)
    assert (line, name) in imports(module, tmp_path)
