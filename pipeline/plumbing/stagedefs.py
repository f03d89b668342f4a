"""A stage's declaration: what it reads, runs and writes, said once in its ``stage.py``.

Every stage module declares ``STAGE = StageDef(...)``. From it follow the stage's CLI command and
registry entry (``stages/__init__.py``), its fingerprint (the exact params and the code hash),
and its entry in dvc.yaml, which ``pairforge dvc-yaml`` writes (never edited by hand). A
``StageDef`` names

- ``module``: the stage's module. Its **code** is that file and every project module it
  imports, transitively (at the top or inside functions: ``pipeline/plumbing/imports.py``),
  except the modules that say ``CHANGES_NO_OUTPUT = True`` (command line, validation, locks,
  progress bars and error messages, which change no output byte), plus ``data_files`` its
  code reads as data. The code is the stage's code
  ``deps:`` in dvc.yaml and what its fingerprint hashes: an import added is a dependency added.
- ``config``: the stage's config class; its fields are the stage's params section.
- ``inputs``: the data it reads, as DVC path templates over params keys (``${embed.sentences}``);
  dvc.yaml lists them first among the ``deps:``.
- ``outputs``: the keys of its section that name what it writes. dvc.yaml's ``outs:`` are
  ``outs`` when given, else one entry per output key: ``metrics`` rewritten whole
  (``cache: false``), every other output resumed by pairforge (``persist: true``: a killed stage
  keeps its finished shards, and a changed fingerprint clears them).
- ``free``: the keys that change no output byte (threads, caches, batch sizes that only change
  float rounding): a run may resume with other values, and DVC does not rerun for them.
- ``params`` (derived): every other key of its section, the exact keys that change its output.
  dvc.yaml's ``params:`` lists them (``mine.band_low``), and the stage's fingerprint hashes
  their values: a change to one of them reruns the stage under DVC and clears its unfinished
  shards; nothing else does. A new config field is an exact param unless declared otherwise.
  ``param_paths`` names a key whose exact param is a path into it (below).
- ``datasets`` and ``models``: the output keys that name the dataset and model folders it
  writes: a run (``pipeline/plumbing/stagerun.py``) holds their writer locks from its start to
  its end.

Every key of a section is in exactly one of ``inputs`` (as the template of its own key),
``outputs``, ``free`` and, the rest, ``params`` (tests/test_dvc.py checks the first three are
keys of the config and disjoint).

The ``train`` stage's params hold ``recipes.${train.objective}`` (its ``param_paths``): the recipe of the objective that
params.yaml names, not the other objectives' (editing ``train.recipes.bsl`` does not retrain
DebCSE). A user who switches objective in params.yaml gets that objective's recipe tracked;
``pairforge train -o <objective>`` on the command line trains outside DVC, whose lock then
still describes the params' objective (the trainer's own fingerprint covers the objective it ran).

This module imports nothing from ``stages/`` or ``train/`` and names none of their files.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pairforge.pipeline.plumbing.imports import module_file, project_closure

if TYPE_CHECKING:
    from pairforge.pipeline.plumbing.metrics import Headlines

# Plumbing: no stage's output depends on this module, so it is no stage's code (its edits rerun
# nothing): pipeline/plumbing/stagedefs.py.
CHANGES_NO_OUTPUT = True

ROOT = Path(__file__).resolve().parents[2]

# A DVC output's or plot's options, as dvc.yaml writes them (``cache``, ``persist``, ``x``...).
Options = Mapping[str, Any]


@dataclass(frozen=True, eq=False)
class StageDef:
    """One stage's declaration (see the module docstring)."""

    name: str
    module: str
    config: type
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    free: tuple[str, ...] = ()
    param_paths: Mapping[str, str] = field(default_factory=dict)
    datasets: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    data_files: tuple[str, ...] = ()
    outs: Mapping[str, Options] | None = None
    plots: Mapping[str, Options] = field(default_factory=dict)
    # The figures of its metrics that judge it (``pipeline/plumbing/metrics.py``, ``headline``).
    headlines: Headlines = field(default_factory=dict)
    # Top-level dvc.yaml plots drawn from this stage's outputs (several series to one figure).
    dvc_plots: Mapping[str, Options] = field(default_factory=dict)

    @property
    def params(self) -> tuple[str, ...]:
        """The exact param keys, in the config's field order: every field that is not an input
        (``input_keys``), an output or free, as ``param_paths`` spells it."""
        other = {*input_keys(self), *self.outputs, *self.free}
        fields = getattr(self.config, "model_fields", {})
        return tuple(self.param_paths.get(key, key) for key in fields if key not in other)

    def dvc_outs(self) -> dict[str, Options]:
        """dvc.yaml's ``outs:`` of the stage (see the module docstring)."""
        if self.outs is not None:
            return dict(self.outs)
        return {
            f"${{{self.name}.{key}}}": {"cache": False} if key == "metrics" else {"persist": True}
            for key in sorted(self.outputs, key=lambda key: key != "metrics")
        }

    def headline(self) -> str | None:
        """The headline metrics file that ``pipeline/plumbing/metrics.py`` writes beside the
        stage's full metrics (None for a stage without metrics)."""
        return f"metrics/headline/{self.name}.json" if "metrics" in self.outputs else None


_TEMPLATE = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")


def input_keys(stage: StageDef) -> tuple[str, ...]:
    """The keys of the stage's own section that its ``inputs`` templates name."""
    keys: list[str] = []
    for template in stage.inputs:
        for ref in _TEMPLATE.findall(template):
            section, _, key = ref.partition(".")
            if section == stage.name and key not in keys:
                keys.append(key)
    return tuple(keys)


def resolve_key(stage: StageDef, key: str, section: Mapping[str, Any]) -> list[str]:
    """``key`` as a path into ``section``: ``${<stage>.x}`` is replaced by ``section[x]``."""

    def value(match: re.Match) -> str:
        ref_section, _, ref = match.group(1).partition(".")
        if ref_section != stage.name or ref not in section:
            raise KeyError(f"{stage.name}.{key}: cannot resolve ${{{match.group(1)}}}")
        return str(section[ref])

    return _TEMPLATE.sub(value, key).split(".")


def exact_params(stage: StageDef, section: Mapping[str, Any]) -> dict[str, Any]:
    """The values of the stage's exact param keys in ``section`` (its params.yaml section, or its
    config's ``model_dump()``), by key as dvc.yaml names it (``recipes.debcse`` for train's
    ``recipes.${train.objective}``); an absent nested key (a recipe not written) is None."""
    out: dict[str, Any] = {}
    for key in stage.params:
        path = resolve_key(stage, key, section)
        if path[0] not in section:
            raise KeyError(f"{stage.name}.{path[0]}: declared in its STAGE, not in its config")
        node: Any = section
        for part in path:
            node = node.get(part) if isinstance(node, Mapping) else None
        out[".".join(path)] = node
    return out


@functools.cache
def _code(module: str, data_files: tuple[str, ...], root: Path) -> tuple[str, ...]:
    start = module_file(module, root)
    if start is None:
        raise KeyError(f"stage module {module!r} has no source file under {root}")
    return tuple(sorted({*project_closure(start, root), *data_files}))


def code(stage: StageDef) -> tuple[str, ...]:
    """The stage's code, relative to the project root, sorted: its module, the project modules
    it imports (transitively, less the modules that change no output) and its data files. Read
    once per process."""
    return _code(stage.module, stage.data_files, ROOT)


def code_hash(stage: StageDef | str) -> str:
    """sha256 over the stage's code (path and bytes of each file), 12 hex digits. A name
    that is no declared stage (a test's dataset) hashes ``pipeline/``."""
    if isinstance(stage, StageDef):
        files = [ROOT / entry for entry in code(stage)]
    else:
        files = sorted((ROOT / "pipeline").rglob("*.py"))
    digest = hashlib.sha256()
    for file in files:
        digest.update(str(file.relative_to(ROOT)).encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()[:12]
