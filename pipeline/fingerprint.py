"""The one fingerprint of a stage's run: what its output is computed from.

A dataset (or model) folder keeps its finished shards (or checkpoints) only while the
fingerprint it was started with is unchanged (``pipeline/shards.py``, ``DatasetWriter``); a
finished one with the same fingerprint is not computed again. The fingerprint hashes the
stage's declared code and exact params (``pipeline/stagedefs.py``, which dvc.yaml follows too)
and its inputs' identities, so a changed param, input or code clears the old work, and a
changed free setting (threads, caches) resumes it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from pairforge.pipeline.shards import Dataset, canonical_json
from pairforge.pipeline.stagedefs import exact_params
from pairforge.pipeline.version import source_hash


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
    stage: str,
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
        "stage": stage,
        "params": exact_params(stage, section),
        "inputs": {
            name: dataset_token(value) if isinstance(value, Dataset) else value
            for name, value in (inputs or {}).items()
        },
        "extra": dict(extra or {}),
        "code": source_hash(stage),
    }
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()
