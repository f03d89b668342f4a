"""Kill the ingest stage with SIGKILL at random moments; the resumed run must equal a clean run.
Also: a Dask LocalCluster gives the same output as the in-process run."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, run_cli

N_LINES = 60_000


def make_project(path: Path) -> None:
    rng = random.Random(7)
    words = [
        "river",
        "stone",
        "market",
        "quiet",
        "engine",
        "paper",
        "garden",
        "winter",
        "signal",
        "copper",
        "lantern",
        "orbit",
        "harbor",
        "violet",
        "meadow",
        "thunder",
        "silver",
        "canvas",
        "maple",
        "puzzle",
    ]
    lines = []
    for i in range(N_LINES):
        if i % 17 == 0 and lines:
            lines.append(lines[rng.randrange(len(lines))])  # duplicates, near and far
        elif i % 101 == 0:
            lines.append("too short")
        else:
            lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(4, 14))) + f" {i}.")
    path.mkdir(parents=True, exist_ok=True)
    (path / "corpus.txt").write_text("\n".join(lines) + "\n")
    # The fingerprint includes input mtimes: give every copy the same one so manifests compare.
    os.utime(path / "corpus.txt", ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    params = {
        "ingest": {
            "root": ".",
            "inputs": ["corpus.txt"],
            "rows_per_shard": 1500,
            "chunk_rows": 1000,
            "output": "data/sentences",
            "quarantine": "data/quarantine/ingest",
            "metrics": "metrics/ingest.json",
        }
    }
    (path / "params.yaml").write_text(yaml.safe_dump(params))


def snapshot(path: Path) -> dict:
    """Manifests (whole: they hold no run-specific fact) and file listings of both datasets."""
    out = {}
    for name in ("data/sentences", "data/quarantine/ingest"):
        manifest = json.loads((path / name / "_manifest.json").read_text())
        files = sorted(str(p.relative_to(path / name)) for p in (path / name).rglob("*"))
        out[name] = (manifest, files)
    out["metrics"] = json.loads((path / "metrics/ingest.json").read_text())
    return out


def start_ingest(path: Path) -> subprocess.Popen:
    """Start `pairforge ingest` in the background, to be killed."""
    return subprocess.Popen(
        [sys.executable, "-m", "pairforge.stages.cli", "ingest", "--no-progress"],
        cwd=path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    path = tmp_path_factory.mktemp("reference")
    make_project(path)
    start = time.monotonic()
    result = run_cli(["ingest", "--no-progress"], cwd=path)
    elapsed = time.monotonic() - start
    assert result.returncode == 0, result.stderr
    return path, snapshot(path), elapsed


def test_reference_run_is_sane(reference):
    path, snap, _ = reference
    metrics = snap["metrics"]
    assert metrics["rows_read"] == N_LINES
    assert metrics["rows_dropped"]["duplicate"] > 3000
    assert metrics["rows_dropped"]["too_short"] > 500
    assert len(snap["data/sentences"][0]["shards"]) > 30


def wait_for_markers(path: Path, proc: subprocess.Popen, count: int, timeout: float = 120) -> None:
    """Return once the clean step has finished ``count`` chunks (or the run has ended)."""
    progress = path / "data/sentences/_work/clean/_progress"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if progress.exists() and len(list(progress.glob("part-*.json"))) >= count:
            return
        time.sleep(0.005)


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(4))
def test_sigkill_then_resume_gives_identical_output(reference, tmp_path, trial):
    """Up to three kills per trial. The first waits for a random number of finished chunks, so
    every trial kills a run mid-way whatever the machine's load; the others sleep a random time,
    which also reaches the merge and the final writes."""
    _, expected, elapsed = reference
    make_project(tmp_path)
    rng = random.Random(1000 + trial)
    kills = 0
    for attempt in range(3):
        proc = start_ingest(tmp_path)
        if attempt == 0:
            wait_for_markers(tmp_path, proc, rng.randint(1, 40))
            time.sleep(rng.uniform(0, 0.05))
        else:
            time.sleep(rng.uniform(0.2, elapsed * 0.95))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
    result = run_cli(["ingest", "--no-progress"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert snapshot(tmp_path) == expected
    assert not list(tmp_path.rglob("*.tmp-*")), "a killed run's temporary file was left behind"
    assert not (tmp_path / "data/sentences/_work").exists()
    assert kills >= 1


def test_resume_skips_finished_shards(reference, tmp_path):
    """Kill during the clean step, then check the resumed run reports skipped work."""
    _, expected, _ = reference
    make_project(tmp_path)
    proc = start_ingest(tmp_path)
    clean_progress = tmp_path / "data/sentences/_work/clean/_progress"
    wait_for_markers(tmp_path, proc, 5)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # A shard is finished when its last output (the rejects) has its marker.
    finished = len(list((clean_progress.parent.parent / "rejected/_progress").glob("part-*.json")))
    assert finished >= 4
    result = run_cli(["ingest"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (
        f"cleaned {60 - finished} of 60 chunks; {finished} were already finished" in result.stderr
    )
    assert snapshot(tmp_path) == expected


@pytest.mark.slow
def test_dask_local_cluster_matches_in_process(reference, tmp_path):
    _, expected, _ = reference
    make_project(tmp_path)
    result = run_cli(["ingest", "--no-progress", "--workers", "2"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "dask LocalCluster (2 workers)" in result.stderr
    assert snapshot(tmp_path) == expected
