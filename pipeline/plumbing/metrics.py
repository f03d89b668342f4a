"""Stage metrics: every figure of a stage in its metrics JSON, its headline figures beside it.

``dvc metrics show`` prints one table whose columns are the union of the keys of every declared
metrics file; with every figure of every stage that table was 22,254 characters wide. So each
stage writes two files:

- ``<metrics>`` (``metrics/<stage>.json``): every figure, as before; dvc.yaml declares it as a
  plain output (``cache: false``). ``dvc metrics show metrics/sample.json`` prints it; the
  reports, tests and docs read it;
- ``headline_path(<metrics>)`` (``metrics/headline/<stage>.json``): the few figures that judge
  the stage (its declaration's ``headlines``), the only files dvc.yaml declares as ``metrics:``, so the
  top-level ``dvc metrics show`` (and ``dvc metrics diff``) stays a readable table.

Headline names are shared across stages where they mean the same thing (``rows_out``: rows the
stage wrote to its main output), so the table has few columns. A headline value names a key of
the full metrics by a dotted path; ``*`` matches every key at that level and keeps the matched
keys (``models.*.avg`` -> ``{"debcse": 79.7, "base (mean)": 76.3}``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pairforge.pipeline.plumbing.files import atomic_write_json, remove_dead_temporaries

log = logging.getLogger("pairforge")

HEADLINE_DIR = "headline"

# headline name -> dotted path in the stage's full metrics, or a function of them
Headlines = Mapping[str, str | Callable[[Mapping[str, Any]], Any]]

_MISSING = object()


def headline_path(metrics: str | Path) -> Path:
    """Where the headline of the metrics file ``metrics`` goes: ``headline/`` beside it."""
    metrics = Path(metrics)
    return metrics.parent / HEADLINE_DIR / metrics.name


def _lookup(obj: Any, parts: list[str]) -> Any:
    if not parts:
        return obj
    head, rest = parts[0], parts[1:]
    if not isinstance(obj, Mapping):
        return _MISSING
    if head == "*":
        found = {key: _lookup(value, rest) for key, value in obj.items()}
        found = {key: value for key, value in found.items() if value is not _MISSING}
        return found or _MISSING
    return _lookup(obj[head], rest) if head in obj else _MISSING


def headline(metrics: Mapping[str, Any], spec: Headlines) -> dict[str, Any]:
    """The headline figures ``spec`` names (name -> dotted path, or a function of the metrics)
    picked from ``metrics``.

    A path that names nothing is left out (a stage that renamed a key loses a headline column,
    never its run).
    """
    out = {}
    for name, path in spec.items():
        if callable(path):
            try:
                value = path(metrics)
            except (KeyError, TypeError, ValueError):
                value = _MISSING
        else:
            value = _lookup(metrics, path.split("."))
        if value is _MISSING:
            log.debug("metrics: headline %r: %r is not in the metrics", name, path)
            continue
        out[name] = value
    return out


def write_metrics(path: str | Path, metrics: Mapping[str, Any], headlines: Headlines) -> Path:
    """Write a stage's full ``metrics`` to ``path`` and its ``headlines`` (:func:`headline`) beside
    it (:func:`headline_path`); returns the headline's path. Temporaries of either file left by
    a killed run are removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, metrics)
    head = headline_path(path)
    head.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(head, headline(metrics, headlines))
    for written in (path, head):
        remove_dead_temporaries(written)
    return head
