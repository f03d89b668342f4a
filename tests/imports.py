"""What a project module imports, read from its source (ast): absolute imports, relative imports
resolved against the module's package, and ``importlib.import_module``/``__import__`` calls whose
module is a string literal, at the top or inside functions. The layer and declared-code checks
read imports through this one function, so an import they cannot see is one no check sees."""

from __future__ import annotations

import ast
from pathlib import Path

# The installed package maps each top-level folder to ``pairforge.<folder>`` (pyproject.toml).
PACKAGE = "pairforge"


def module_name(path: Path, root: Path) -> str:
    """``root/stages/mine/stage.py`` -> ``pairforge.stages.mine.stage`` (a package's
    ``__init__.py`` -> the package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def _resolve(level: int, module: str | None, path: Path, root: Path) -> str:
    """The absolute module of ``from <'.' * level><module> import ...`` written in ``path``."""
    package = module_name(path, root).split(".")
    if path.name != "__init__.py":
        package.pop()  # a module's relative imports start from its package
    if level - 1 > len(package) - 1:
        raise ValueError(f"{path}: relative import beyond the top-level package")
    base = package[: len(package) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _literal_import(node: ast.Call) -> tuple[str, str | None] | None:
    """``(module, package)`` of ``importlib.import_module("x", package)`` / ``import_module("x")``
    / ``__import__("x")`` with a literal module; None for any other call."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in ("import_module", "__import__") or not node.args:
        return None
    first = node.args[0]
    if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
        return None
    package = None
    rest = node.args[1:2] + [k.value for k in node.keywords if k.arg == "package"]
    if name == "import_module" and rest and isinstance(rest[0], ast.Constant):
        package = rest[0].value
    return first.value, package


def imports(path: Path, root: Path) -> list[tuple[int, str]]:
    """``(line, absolute module)`` of every import in ``path``; ``from m import a`` gives ``m``
    and ``m.a`` (``a`` may be a submodule)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = (
                _resolve(node.level, node.module, path, root) if node.level else node.module or ""
            )
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Call) and (literal := _literal_import(node)):
            name, package = literal
            if name.startswith("."):
                level = len(name) - len(name.lstrip("."))
                anchor = Path(root, *package.split(".")[1:], "__init__.py") if package else path
                name = _resolve(level, name.lstrip(".") or None, anchor, root)
            found.append((node.lineno, name))
    return found
