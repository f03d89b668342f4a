"""Kill embed, mine and sample in their finishing step (before and after a manifest is written,
after ``_progress/`` or ``_work/`` is removed, before the metrics are written), run them again,
and compare with an uninterrupted run: the same files with the same bytes, no ``_progress/`` or
``_work/`` left, and the same metrics apart from timings and this run's own work counts."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pairforge.pipeline.plumbing.version import source_hash as cached_source_hash
from pairforge.pipeline.science.text import sentence_id

from tests.conftest import ROOT, run_cli
from tests.faults import KILLED
from tests.stages.mining_helpers import (
    candidate_rows,
    copy_project,
    make_texts,
    stage_params,
    write_candidates,
    write_params,
    write_sentences,
)

pytestmark = pytest.mark.slow

STAGES = {
    "embed": [
        "data/embeddings/sentences",
        "data/embeddings/candidates",
        "data/embeddings/rewrites",
    ],
    "mine": ["data/pools"],
    "sample": ["data/pairs"],
}
# Metrics that describe the run rather than its result: timings, rates, and how much of the work
# this run did itself (a resumed run does less).
RUN_KEYS = {
    "seconds",
    "rows_per_second",
    "computed_rows",
    "computed_shards",
    "reused_sentence_vectors",
    "pool_seconds",
    "build_seconds",
    "loaded_from_work",
    "encode_seconds",
    "compile_seconds",
    "kernels",
    "scoring_seconds",
    "pairs_per_second",
    "backend",
    "device",
}


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_bert) -> Path:
    """200 sentences in 4 shards, 800 candidates in 4 shards, and every stage run once."""
    root = tmp_path_factory.mktemp("finish-project")
    texts = make_texts(200, seed=3)
    write_sentences(root / "data/sentences", texts, rows_per_shard=50)
    ids = [sentence_id(t) for t in texts]
    write_candidates(
        root / "data/candidates", candidate_rows(ids, texts, seed=3), rows_per_shard=200
    )
    write_params(root, stage_params(tiny_bert, "finish test", batch_size=32))
    for stage in STAGES:
        result = run_cli([stage, "--no-progress"], cwd=root)
        assert result.returncode == 0, result.stderr
    return root


def _files(folder: Path) -> dict[str, str]:
    out = {}
    for path in sorted(folder.rglob("*")):
        if not path.is_file():
            continue
        rel = str(path.relative_to(folder))
        if path.name == "_manifest.json":
            manifest = json.loads(path.read_text())
            manifest.pop("created_at", None)  # a run fact, where the format still keeps it
            out[rel] = json.dumps(manifest, sort_keys=True)
        else:
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _result_metrics(obj):
    if isinstance(obj, dict):
        return {k: _result_metrics(v) for k, v in obj.items() if k not in RUN_KEYS}
    return obj


def snapshot(root: Path, stage: str) -> dict:
    metrics = json.loads((root / "metrics" / f"{stage}.json").read_text())
    return {
        "files": {name: _files(root / name) for name in STAGES[stage]},
        "metrics": _result_metrics(metrics),
    }


def _without(root: Path, stage: str) -> None:
    """Remove ``stage``'s outputs (and their run sidecars) so that it runs from the start."""
    for name in STAGES[stage]:
        shutil.rmtree(root / name, ignore_errors=True)
        (root / name).parent.joinpath(f".{Path(name).name}.run.json").unlink(missing_ok=True)
    (root / "metrics" / f"{stage}.json").unlink(missing_ok=True)


def _kill_at(root: Path, stage: str, point: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tests.faults", point, "--", stage, "--no-progress"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(ROOT), "DVC_NO_ANALYTICS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )


_REFERENCES: dict[tuple[str, str], dict] = {}


def source_hash(stage: str) -> str:
    """The stage's code version as a new process computes it (the function caches per process)."""
    return cached_source_hash.__wrapped__(stage)


def reference(project: Path, tmp_path_factory, stage: str) -> dict:
    """An uninterrupted run of ``stage`` with the code as it is now (cached per code version)."""
    key = (stage, source_hash(stage))
    if key not in _REFERENCES:
        root = copy_project(project, tmp_path_factory.mktemp(f"reference-{stage}"))
        _without(root, stage)
        result = run_cli([stage, "--no-progress"], cwd=root)
        assert result.returncode == 0, result.stderr
        _REFERENCES[key] = snapshot(root, stage)
    return _REFERENCES[key]


@pytest.mark.parametrize(
    ("stage", "point"),
    [
        ("embed", "premanifest:3"),  # every shard of the last dataset done, no manifest yet
        ("embed", "manifest:1"),  # the sentences' manifest written, its _progress/ not removed
        ("embed", "progress:1"),
        ("embed", "manifest:3"),  # the last dataset's
        ("embed", "metrics"),
        ("mine", "premanifest:1"),
        ("mine", "manifest:1"),
        ("mine", "progress:1"),
        ("mine", "work:1"),
        ("mine", "metrics"),
        ("sample", "premanifest:1"),
        ("sample", "manifest:1"),
        ("sample", "progress:1"),
        ("sample", "metrics"),
    ],
)
def test_kill_in_the_finishing_step_then_rerun_is_identical(
    project, tmp_path, tmp_path_factory, stage, point
):
    code = source_hash(stage)
    expected = reference(project, tmp_path_factory, stage)
    root = copy_project(project, tmp_path)
    _without(root, stage)
    killed = _kill_at(root, stage, point)
    assert killed.returncode == KILLED, f"{point} not reached: {killed.stderr[-2000:]}"
    assert not (root / "metrics" / f"{stage}.json").exists()
    result = run_cli([stage, "--no-progress"], cwd=root)
    assert result.returncode == 0, result.stderr
    left = [p for name in STAGES[stage] for p in (root / name).glob("_*") if p.is_dir()]
    assert not left, f"left behind after the rerun: {left}"
    got = snapshot(root, stage)
    if source_hash(stage) != code:  # another edit of the shared working tree, mid-test
        pytest.skip(f"the {stage} stage's code changed during the test; run it again")
    assert got["files"] == expected["files"]
    assert got["metrics"] == expected["metrics"]
