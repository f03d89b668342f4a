"""embed, mine and sample on the shard runner: a Dask LocalCluster and a threaded in-process run
write the same bytes as the plain in-process run (every file of the dataset folder, manifest
included)."""

from __future__ import annotations

import shutil
from pathlib import Path

from mining_helpers import copy_project
from pairforge.pipeline.runner import DaskExecutor, LocalExecutor
from pairforge.stages.sample import run as sample
from test_mining_sample import _cfg, mined  # noqa: F401  (mined: the module's fixture)


def folder_bytes(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` by relative path (the dataset, its manifest and card)."""
    files = {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert any(name.endswith("_manifest.json") for name in files), f"no manifest in {folder}"
    return files


def _plain_then(root: Path, output: str, run, executor) -> tuple[dict, dict]:
    """Run in-process, keep the output's bytes, remove it and run again on ``executor`` in the
    same folder (the manifest and card name the paths): both metrics, after asserting the
    folders are byte-identical."""
    plain = run(executor=None)
    before = folder_bytes(root / output)
    shutil.rmtree(root / output)
    try:
        other = run(executor=executor)
    finally:
        executor.close()
    after = folder_bytes(root / output)
    assert sorted(before) == sorted(after)
    differ = [name for name in before if before[name] != after[name]]
    assert not differ, f"{output}: files differ from the in-process run: {differ}"
    return plain, other


def _sample(root: Path):
    return lambda executor: sample(_cfg(root, anchor_batch=16), progress=False, executor=executor)


def test_sample_threads_write_the_same_bytes(mined, tmp_path):  # noqa: F811
    root = copy_project(mined, tmp_path)
    plain, metrics = _plain_then(root, "data/pairs", _sample(root), LocalExecutor(threads=2))
    assert plain["computed_shards"] == metrics["computed_shards"] == metrics["shards"] >= 2
    assert metrics["counts"] == plain["counts"]
    # The scoring facts come back from the shard function: every shard's pairs are counted.
    assert metrics["edit"]["backend"] == plain["edit"]["backend"] == "numba"
    assert metrics["edit"]["scoring_seconds"] > 0
    assert metrics["counts"]["edit_pairs"] > 0 and metrics["edit"]["pairs_per_second"] > 0


def test_sample_on_two_dask_workers_writes_the_same_bytes(mined, tmp_path):  # noqa: F811
    root = copy_project(mined, tmp_path)
    ex = DaskExecutor(workers=2)
    assert len(ex.client.scheduler_info()["workers"]) == 2
    plain, metrics = _plain_then(root, "data/pairs", _sample(root), ex)
    assert metrics["computed_shards"] == metrics["shards"] >= 2
    assert metrics["counts"] == plain["counts"] and metrics["rows"] == plain["rows"]
    assert metrics["edit"]["backend"] == "numba" and metrics["edit"]["encode_seconds"] >= 0
    assert metrics["edit"]["pairs_per_second"] > 0
