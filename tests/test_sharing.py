"""Sharing a mined dataset with DVC, as README's "Sharing datasets" tells it: the mining
repository pushes its pairs to a remote, a second repository imports them, verifies them and
trains on them in a folder with no params.yaml. Real git, real DVC, a local remote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.train.builders import pairs_rows, write_pairs

pytestmark = pytest.mark.slow


def sh(args: list[str], cwd: Path) -> str:
    env = dict(os.environ, DVC_NO_ANALYTICS="1", GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")  # fmt: skip
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done.stdout


def dvc(*args: str, cwd: Path) -> str:
    return sh([sys.executable, "-m", "dvc", *args], cwd)


def test_pairs_pushed_imported_verified_and_trained_on(
    tmp_path, tiny_sentences, tiny_model_dir, sts_dir
):
    mining, team, store = tmp_path / "mining", tmp_path / "team", tmp_path / "store"
    for repo in (mining, team):
        repo.mkdir()
        sh(["git", "init", "-q", "-b", "main"], repo)
        dvc("init", "-q", cwd=repo)
    pairs = write_pairs(mining / "data/pairs", pairs_rows(tiny_sentences), rows_per_shard=4)
    manifest = json.loads((pairs / "_manifest.json").read_text())
    manifest["encoder"] = {"model": str(tiny_model_dir), "pooling": "mean", "max_length": 16}
    (pairs / "_manifest.json").write_text(json.dumps(manifest))
    dvc("add", "-q", "data/pairs", cwd=mining)
    dvc("remote", "add", "-d", "store", str(store), cwd=mining)
    sh(["git", "add", "-A"], mining)
    sh(["git", "commit", "-q", "-m", "pairs"], mining)
    dvc("push", "-q", cwd=mining)

    dvc("import", "-q", str(mining), "data/pairs", "-o", "pairs", cwd=team)
    assert (team / "pairs.dvc").exists()  # the source repository and revision, recorded
    imported = {p.relative_to(team / "pairs") for p in (team / "pairs").rglob("*") if p.is_file()}
    assert imported == {p.relative_to(pairs) for p in pairs.rglob("*") if p.is_file()}

    verified = run_cli(["verify", "pairs"], cwd=team)
    assert verified.returncode == 0, verified.stderr
    assert not (team / "params.yaml").exists()
    trained = run_cli(
        ["train", "--input", "pairs", "--max-steps", "2", "--batch-size", "4",
         "--max-length", "16", "--eval-every", "2", "--sts-dir", str(sts_dir), "--threads", "1",
         "--no-progress"],
        cwd=team,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    assert "running on its config's defaults" in trained.stderr
    card = json.loads((team / "models/simcse/model/pairforge.json").read_text())
    assert card["base_model"] == str(tiny_model_dir)  # the encoder the pairs name
