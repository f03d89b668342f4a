"""embed, mine and sample on the shard runner: a Dask LocalCluster and a threaded in-process run
write the same bytes as the plain in-process run (every file of the dataset folder, manifest
included)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from pairforge.pipeline.plumbing.runner import DaskExecutor, LocalExecutor
from pairforge.stages.mine.stage import MineConfig
from pairforge.stages.mine.stage import run as mine
from pairforge.stages.sample.stage import run as sample

from tests.stages.mining_helpers import copy_project
from tests.stages.sample.test_sample import _cfg, _paths, mined  # noqa: F401  (mined: the module's fixture)


@pytest.fixture(scope="module")
def cluster():
    """One 2-worker LocalCluster for the module's Dask runs (starting one costs seconds)."""
    ex = DaskExecutor(workers=2)
    assert len(ex.client.scheduler_info()["workers"]) == 2
    yield ex
    ex.close()


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
    other = run(executor=executor)
    after = folder_bytes(root / output)
    assert sorted(before) == sorted(after)
    differ = [name for name in before if before[name] != after[name]]
    assert not differ, f"{output}: files differ from the in-process run: {differ}"
    return plain, other


def _sample(root: Path):
    return lambda executor: sample(_cfg(root, anchor_batch=16), progress=False, executor=executor)


def test_sample_threads_write_the_same_bytes(mined, tmp_path):  # noqa: F811
    root = copy_project(mined, tmp_path)
    ex = LocalExecutor(threads=2)
    try:
        plain, metrics = _plain_then(root, "data/pairs", _sample(root), ex)
    finally:
        ex.close()
    assert plain["computed_shards"] == metrics["computed_shards"] == metrics["shards"] >= 2
    assert metrics["counts"] == plain["counts"]
    # The scoring facts come back from the shard function: every shard's pairs are counted.
    assert metrics["edit"]["backend"] == plain["edit"]["backend"] == "numba"
    assert metrics["edit"]["scoring_seconds"] > 0
    assert metrics["counts"]["edit_pairs"] > 0 and metrics["edit"]["pairs_per_second"] > 0


@pytest.mark.slow
def test_sample_on_two_dask_workers_writes_the_same_bytes(mined, cluster, tmp_path):  # noqa: F811
    root = copy_project(mined, tmp_path)
    plain, metrics = _plain_then(root, "data/pairs", _sample(root), cluster)
    assert metrics["computed_shards"] == metrics["shards"] >= 2
    assert metrics["counts"] == plain["counts"] and metrics["rows"] == plain["rows"]
    assert metrics["edit"]["backend"] == "numba" and metrics["edit"]["encode_seconds"] >= 0
    assert metrics["edit"]["pairs_per_second"] > 0


def _mine(root: Path, **kw):
    paths = _paths(root)
    cfg = MineConfig(
        sentences=paths["sentences"],
        embeddings=paths["embeddings"],
        candidates=paths["candidates"],
        output=paths["pools"],
        metrics=str(root / "metrics/mine.json"),
        k=24,
        band_low=0.1,
        band_high=0.8,
        anchor_batch=16,
        **kw,
    )
    return lambda executor: mine(cfg, progress=False, executor=executor)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_mine_on_two_dask_workers_writes_the_same_bytes(mined, cluster, tmp_path, kind):  # noqa: F811
    """The workers search the driver's index mapped from <output>/_work (a flat index's
    vectors in place; HNSW's and IVF's from the driver's _work/vectors.f32, read with positioned
    reads; IVF's lists from the file the driver wrote as it built them), with the same pools."""
    root = copy_project(mined, tmp_path)
    shutil.rmtree(root / "data/pools")
    # fallback random reads the searcher's vectors too; min_pool 70 > pool_cap makes every pool short.
    run = _mine(root, index=kind, ivf_codec="sq8", fallback="random", min_pool=70, pool_cap=64)
    plain, metrics = _plain_then(root, "data/pools", run, cluster)
    assert metrics["computed_shards"] == metrics["shards"] >= 2
    assert metrics["index"]["kind"] == kind
    assert metrics["random_candidates"] == plain["random_candidates"] > 0
    assert metrics["pool_size"] == plain["pool_size"] and metrics["excluded"] == plain["excluded"]
    assert metrics["pool_seconds"] > 0
    # The index file the workers read is removed with the rest of the work folder.
    assert not (root / "data/pools/_work").exists()


def test_mine_in_process_threads_write_the_same_bytes(mined, tmp_path):  # noqa: F811
    root = copy_project(mined, tmp_path)
    shutil.rmtree(root / "data/pools")
    ex = LocalExecutor(threads=2)
    try:
        plain, metrics = _plain_then(root, "data/pools", _mine(root), ex)
    finally:
        ex.close()
    assert metrics["anchors"] == plain["anchors"] == 240
    assert metrics["candidates_in_pools"] == plain["candidates_in_pools"] > 0


def _embed(root: Path, model: Path, **kw):
    from pairforge.stages.embed.stage import run as embed

    from tests.stages.embed.test_embed import _cfg as embed_cfg

    return lambda executor: embed(embed_cfg(root, model, **kw), progress=False, executor=executor)


@pytest.mark.slow
def test_embed_on_two_dask_workers_writes_the_same_bytes(
    mining_inputs, tiny_bert, cluster, tmp_path
):
    """Sentences and candidates (the candidates equal to their sentence reuse its vector, read
    by the workers from the sentence embeddings): the same bytes as in-process, on torch with
    all threads in the driver and one thread per Dask worker."""
    root = copy_project(mining_inputs, tmp_path)
    run = _embed(root, tiny_bert)
    plain = run(executor=None)
    before = {
        name: folder_bytes(root / "data/embeddings" / name) for name in ("sentences", "candidates")
    }
    shutil.rmtree(root / "data/embeddings")
    metrics = run(executor=cluster)
    for name in ("sentences", "candidates"):
        after = folder_bytes(root / "data/embeddings" / name)
        assert sorted(after) == sorted(before[name])
        differ = [f for f in after if after[f] != before[name][f]]
        assert not differ, f"embeddings/{name}: files differ from the in-process run: {differ}"
        assert metrics[name]["computed_shards"] == metrics[name]["shards"] >= 4
    assert (
        metrics["candidates"]["reused_sentence_vectors"]
        == plain["candidates"]["reused_sentence_vectors"]
        > 0
    )


@pytest.mark.parametrize("stage", ["embed", "mine", "sample"])
def test_commands_take_workers_and_scheduler(stage):
    from pairforge.stages.cli import app
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, [stage, "--help"], terminal_width=200)
    assert result.exit_code == 0
    for option in ("--workers", "--scheduler"):
        assert option in result.output, f"pairforge {stage} has no {option}"
