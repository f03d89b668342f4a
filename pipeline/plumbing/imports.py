"""What a project module imports, read from its source (ast): absolute imports, relative imports
resolved against the module's package, and ``importlib.import_module``/``__import__`` calls whose
module is a string literal, at the top or inside functions.

A stage's code (what its fingerprint hashes and dvc.yaml lists as its deps) is the closure of
its module's imports (:func:`project_closure`), and the layer check reads imports through the
same function: an import one cannot see is one neither sees."""

from __future__ import annotations

import ast
from pathlib import Path

# Plumbing: no stage's output depends on this module, so it is no stage's code (its edits rerun
# nothing): pipeline/plumbing/stagedefs.py.
CHANGES_NO_OUTPUT = True

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
    return _imports(ast.parse(path.read_text(), str(path)), path, root)


def _imports(tree: ast.Module, path: Path, root: Path) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
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


def module_file(module: str, root: Path) -> Path | None:
    """The source file of project module ``module`` under ``root`` (a package's
    ``__init__.py``); None for a module outside the project or a name that is not a module
    (``from m import a`` where ``a`` is a function)."""
    parts = module.split(".")
    if parts[0] != PACKAGE or len(parts) < 2:
        return None
    path = root.joinpath(*parts[1:])
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py")
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return None


MARKER = "CHANGES_NO_OUTPUT"


def changes_no_output(tree: ast.Module) -> bool:
    """Whether the module says ``CHANGES_NO_OUTPUT = True`` at its top level: plumbing (command
    line, validation, locks, progress, error messages) that no stage's output depends on, so
    its edits rerun nothing."""
    return any(
        isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == MARKER for t in node.targets)
        and isinstance(node.value, ast.Constant)
        and node.value.value is True
        for node in tree.body
    )


def project_closure(start: Path, root: Path) -> list[str]:
    """The project files ``start`` runs: itself and every project module it imports, transitively,
    as sorted paths relative to ``root``. A module that changes no output
    (:func:`changes_no_output`) is neither listed nor followed."""
    seen: set[str] = set()
    skipped: set[str] = set()
    todo = [start]
    while todo:
        path = todo.pop()
        rel = path.relative_to(root).as_posix()
        if rel in seen or rel in skipped:
            continue
        tree = ast.parse(path.read_text(), str(path))
        if changes_no_output(tree):
            skipped.add(rel)
            continue
        seen.add(rel)
        for _, module in _imports(tree, path, root):
            if (target := module_file(module, root)) is not None:
                todo.append(target)
    return sorted(seen)
