"""embed, mine and sample with every dataset in a bucket (a real S3-compatible server,
``tests/s3.py``): the same shard bytes as the same run on a local disk, sample
killed mid-run and resumed there, and mine's shards computed by 2 Dask workers that read their
inputs and the driver's index from the store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pairforge.pipeline.plumbing.storage import dataset_path
from pairforge.pipeline.science.text import sentence_id

from tests.conftest import ROOT, run_cli
from tests.stages.mining_helpers import (
    candidate_rows,
    make_texts,
    stage_params,
    write_candidates,
    write_params,
    write_sentences,
)

DATASETS = {  # the datasets' keys in the three stages' sections, by default folder
    "data/sentences": [("embed", "sentences"), ("mine", "sentences"), ("sample", "sentences")],
    "data/candidates": [("embed", "candidates"), ("mine", "candidates"), ("sample", "candidates")],
    "data/rewrites": [("embed", "rewrites"), ("mine", "rewrites"), ("sample", "rewrites")],
    "data/embeddings/sentences": [("embed", "output"), ("mine", "embeddings"),
                                  ("sample", "embeddings")],
    "data/embeddings/candidates": [("embed", "candidates_output"),
                                   ("sample", "candidate_embeddings")],
    "data/embeddings/rewrites": [("embed", "rewrites_output"), ("sample", "rewrite_embeddings")],
    "data/pools": [("mine", "output"), ("sample", "pools")],
    "data/pairs": [("sample", "output")],
}  # fmt: skip
OUTPUTS = ["data/embeddings/sentences", "data/embeddings/candidates", "data/pools", "data/pairs"]


def _project(root: Path, base: str, model: Path) -> Path:
    """A folder whose params put every dataset under ``base`` (a folder or a bucket's URL)."""
    root.mkdir(parents=True, exist_ok=True)
    texts = make_texts(240, seed=3)
    write_sentences(f"{base}/data/sentences", texts, rows_per_shard=20)
    rows = candidate_rows([sentence_id(t) for t in texts], texts, seed=3)
    write_candidates(f"{base}/data/candidates", rows, rows_per_shard=80)
    params = stage_params(model, "store test", batch_size=16)
    for folder, keys in DATASETS.items():
        for section, key in keys:
            params[section][key] = f"{base}/{folder}"
    write_params(root, params)
    return root


def _shards(base: str, folder: str) -> tuple[dict, list[tuple[str, str]]]:
    path = dataset_path(f"{base}/{folder}")
    manifest = json.loads((path / "_manifest.json").read_text())
    return manifest, [(s["file"], s["sha256"]) for s in manifest["shards"]]


def _run(stage: str, root: Path, *extra: str) -> None:
    done = run_cli([stage, "--no-progress", *extra], cwd=root)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow  # about 1.5 minutes: three stages run twice, with Dask workers and a kill
def test_the_mining_chain_in_a_bucket_writes_what_it_writes_on_disk_and_resumes_there(
    bucket, tmp_path, tiny_bert
):
    local = _project(tmp_path / "local", str(tmp_path / "local"), tiny_bert)
    remote = _project(tmp_path / "remote", bucket, tiny_bert)
    for stage in ("embed", "mine", "sample"):
        _run(stage, local)
    _run("embed", remote)
    _run("mine", remote, "--workers", "2")  # Dask workers read the store's shards by URL
    # ... and the index: the driver put it in the store, each worker fetched its own copy.
    fetched = list((Path(os.environ["PAIRFORGE_CACHE"]) / "mine-index").rglob("search.faiss"))
    assert len(fetched) == 1
    assert not (dataset_path(f"{bucket}/data/pools") / "_work").exists()  # removed once done

    # sample, killed once 2 of its shards are in the bucket, then run again to the end.
    progress = dataset_path(f"{bucket}/data/pairs") / "_progress"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pairforge.stages.cli", "sample", "--no-progress"],
        cwd=remote, env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if len(progress.glob("part-*.json")) >= 2:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (dataset_path(f"{bucket}/data/pairs") / "_manifest.json").exists()
    killed = len(progress.glob("part-*.json"))
    assert killed >= 2
    _run("sample", remote)
    metrics = json.loads((remote / "metrics/sample.json").read_text())
    assert metrics["computed_shards"] <= metrics["shards"] - killed

    for folder in OUTPUTS:  # every shard's bytes (the manifests differ by the paths in params)
        on_disk, in_bucket = _shards(str(tmp_path / "local"), folder), _shards(bucket, folder)
        assert in_bucket[1] == on_disk[1], folder
        assert in_bucket[0]["rows"] == on_disk[0]["rows"] and in_bucket[0]["rows"] > 0
    assert not any(p.name == "_work" for p in (tmp_path / "remote").rglob("*"))
    verified = run_cli(["verify", *(f"{bucket}/{f}" for f in OUTPUTS)], cwd=remote)
    assert verified.returncode == 0, verified.stdout
    # The pairs exported from the bucket to the bucket, as the Hub layout.
    exported = run_cli(["export", "--input", f"{bucket}/data/pairs", "--output",
                        f"{bucket}/export"], cwd=remote)  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    here = run_cli(["export", "--input", "data/pairs", "--output", "export"], cwd=local)
    assert here.returncode == 0, here.stderr
    files = sorted(p.name for p in (local / "export/data").iterdir())
    assert len(files) == len(_shards(bucket, "data/pairs")[1])
    stored = dataset_path(f"{bucket}/export/data")
    assert [p.name for p in stored.iterdir()] == files
    for name in files:  # the same Parquet bytes in the bucket as on disk
        assert (stored / name).read_bytes() == (local / "export/data" / name).read_bytes()
    assert (
        "MultipleNegativesRankingLoss"
        in (dataset_path(f"{bucket}/export") / "README.md").read_text()
    )


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
