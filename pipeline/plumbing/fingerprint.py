"""The one fingerprint of a stage's run: what its output is computed from.

A dataset (or model) folder keeps its finished shards (or checkpoints) only while the
fingerprint it was started with is unchanged (``pipeline/plumbing/shards.py``,
``DatasetWriter``); a finished one with the same fingerprint is not computed again. The
fingerprint hashes the stage's code and exact params (its declaration,
``pipeline/plumbing/stagedefs.py``, which dvc.yaml follows too) and its inputs' identities, so a
changed param, input or code clears the old work, and a changed free setting (threads, caches)
resumes it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from pairforge.pipeline.plumbing.shards import Dataset, canonical_json
from pairforge.pipeline.plumbing.stagedefs import StageDef, exact_params
from pairforge.pipeline.plumbing.version import source_hash

# Plumbing: no stage's output depends on this module, so it is no stage's code (its edits rerun
# nothing): pipeline/plumbing/stagedefs.py.
CHANGES_NO_OUTPUT = True


def dataset_token(dataset: Dataset | None) -> Any:
    """What identifies a dataset's content for a downstream fingerprint (None when absent): its
    own fingerprint, rows and each shard's sha256."""
    if dataset is None:
        return None
    manifest = dataset.manifest
    return {
        "fingerprint": manifest.get("fingerprint"),
        "rows": manifest.get("rows"),
        "shards": [s["sha256"] for s in manifest["shards"]],
    }


def fingerprint(
    stage: StageDef,
    section: Mapping[str, Any],
    inputs: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """sha256 (hex) over the stage's exact params read from ``section`` (its config's
    ``model_dump()``), its ``inputs`` (a ``Dataset`` stands for its ``dataset_token``; any other
    value, such as an upstream fingerprint or file stats, is hashed as it is), ``extra`` (what
    else the output depends on: resolved model revisions, an engine's identity) and its code.
    """
    payload = {
        "stage": stage.name,
        "params": exact_params(stage, section),
        "inputs": {
            name: dataset_token(value) if isinstance(value, Dataset) else value
            for name, value in (inputs or {}).items()
        },
        "extra": dict(extra or {}),
        "code": source_hash(stage),
    }
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()
