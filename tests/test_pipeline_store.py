"""The whole demo pipeline with every dataset in a bucket (a real S3-compatible server the tests
start, ``tests/s3.py``): a project from ``pairforge init`` whose params name ``s3://`` URLs for
every dataset key, each stage run as a command in pipeline order, the pairs verified in the
bucket and exported there. Models, metrics and reports stay local. A small corpus and a few
training steps keep it to about 2 minutes (slow)."""

from __future__ import annotations

import re

import pytest
import yaml
from pairforge.pipeline.plumbing.shards import read_manifest
from pairforge.pipeline.plumbing.storage import dataset_path

from tests.conftest import run_cli

pytestmark = pytest.mark.slow

ORDER = ("ingest", "standin", "backtranslate", "pretrain", "embed", "mine", "sample", "report",
         "train", "evaluate")  # fmt: skip


def test_every_stage_reads_and_writes_its_datasets_in_a_bucket(bucket, tmp_path, monkeypatch):
    monkeypatch.delenv("PAIRFORGE_SHARED_DATA", raising=False)  # the demo's own evaluation set
    project = tmp_path / "project"
    done = run_cli(["init", str(project), "--no-dvc"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    corpus = (project / "data/demo/corpus.txt").read_text().splitlines()[:150]
    (project / "data/demo/corpus.txt").write_text("\n".join(corpus) + "\n")
    text = (project / "params.yaml").read_text()
    # Every dataset under data/ (not the models, not the demo's raw corpus) into the bucket.
    text = re.sub(r"^(\s+\w+: )data/(?!models|demo)", rf"\g<1>{bucket}/", text, flags=re.M)
    params = yaml.safe_load(text)
    params["pretrain"].update(steps=2, checkpoint_every=2)
    params["train"].update(max_steps=2, save_every=2, eval_every=2)
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    assert params["sample"]["output"] == f"{bucket}/pairs"

    for stage in ORDER:
        ran = run_cli([stage], cwd=project, timeout=900)
        assert ran.returncode == 0, f"{stage}: {ran.stderr[-3000:]}"
    for name in ("sentences", "candidates", "embeddings/sentences", "pools", "pairs"):
        assert read_manifest(f"{bucket}/{name}")["rows"] > 0, name
    assert not (project / "data/sentences").exists() and not (project / "data/pairs").exists()
    assert "| debcse |" in (project / "reports/evaluate.md").read_text()
    verified = run_cli(["verify", f"{bucket}/pairs", f"{bucket}/candidates"], cwd=project)
    assert verified.returncode == 0, verified.stdout
    exported = run_cli(["export", "--output", f"{bucket}/export"], cwd=project)
    assert exported.returncode == 0, exported.stderr
    assert (dataset_path(f"{bucket}/export") / "README.md").exists()
