"""Kill ingest in its finishing step (around the manifests of its scratch and final datasets,
after ``_progress/`` or ``_work/`` is removed, before the metrics), run it again, and compare
with an uninterrupted run: the same bytes, nothing left behind, the same metrics."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, run_cli
from tests.faults import KILLED

pytestmark = pytest.mark.slow

OUTPUTS = ("data/sentences", "data/quarantine/ingest")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ingest-finish")
    rng = random.Random(1)
    words = ["alpha", "beta", "gamma", "delta", "river", "stone", "market", "quiet", "loud"]
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 9))) for _ in range(3000)]
    (root / "c.txt").write_text("\n".join(lines) + "\n")
    params = {
        "ingest": {"root": ".", "inputs": ["c.txt"], "rows_per_shard": 300, "chunk_rows": 400}
    }
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    return root


def snapshot(root: Path) -> dict:
    files = {}
    for name in OUTPUTS:
        for path in sorted((root / name).rglob("*")):
            rel = str(path.relative_to(root))
            if path.is_dir():
                files[rel] = "dir"
            elif path.name == "_manifest.json":
                manifest = json.loads(path.read_text())
                manifest.pop("created_at", None)
                files[rel] = json.dumps(manifest, sort_keys=True)
            else:
                files[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    files["work"] = sorted(p.name for p in (root / "data/sentences").glob("_*"))
    return {"files": files, "metrics": json.loads((root / "metrics/ingest.json").read_text())}


def fresh(corpus: Path, dest: Path) -> Path:
    """A copy of the corpus project; copy2 keeps the mtime, which the fingerprint includes."""
    dest.mkdir(exist_ok=True)
    for name in ("c.txt", "params.yaml"):
        shutil.copy2(corpus / name, dest / name)
    return dest


# The run writes four manifests: its scratch datasets' (clean, rejected), then sentences and the
# quarantine.
@pytest.mark.parametrize(
    "point", ["premanifest:3", "manifest:3", "manifest:4", "progress:4", "work:1", "metrics"]
)
def test_kill_in_the_finishing_step_then_rerun_is_identical(corpus, tmp_path, point):
    # The reference is run here, beside the killed run: the shared tree's code may change.
    ref = fresh(corpus, tmp_path / "ref")
    result = run_cli(["ingest", "--no-progress"], cwd=ref)
    assert result.returncode == 0, result.stderr
    root = fresh(corpus, tmp_path / "run")
    killed = subprocess.run(
        [sys.executable, "-m", "tests.faults", point, "--", "ingest", "--no-progress"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(ROOT), "DVC_NO_ANALYTICS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == KILLED, f"{point} not reached: {killed.stderr[-2000:]}"
    assert not (root / "metrics/ingest.json").exists()
    result = run_cli(["ingest", "--no-progress"], cwd=root)
    assert result.returncode == 0, result.stderr
    assert snapshot(root) == snapshot(ref)
