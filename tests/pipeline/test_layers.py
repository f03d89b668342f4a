"""The layers: ``pipeline/`` imports neither ``stages/`` nor ``train/``, and ``train/`` does not
import ``stages/``; every module of each folder is read (ast), imports inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {"pipeline": ("pairforge.stages", "pairforge.train"), "train": ("pairforge.stages",)}


def imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_a_layer_imports_no_layer_above_it(layer):
    files = sorted((ROOT / layer).rglob("*.py"))
    assert len(files) > 5, f"{layer}/: too few modules found; is ROOT right?"
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in files
        for line, name in imports(path)
        if name == "pairforge"
        or any(name == f or name.startswith(f + ".") for f in FORBIDDEN[layer])
    ]
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_a_nested_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from pairforge.stages.embed import stage\n")
    assert (2, "pairforge.stages.embed") in imports(module)
