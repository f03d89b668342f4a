"""SIGKILL embed, mine and sample in the middle of their work; the resumed runs must finish only
the missing shards and give byte-identical datasets to an uninterrupted run. Also: the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pairforge.pipeline.science.text import sentence_id

from tests.conftest import ROOT, run_cli
from tests.stages.mining_helpers import (
    candidate_rows,
    copy_project,
    make_texts,
    stage_params,
    write_candidates,
    write_params,
    write_sentences,
)

OUTPUTS = {
    "embed": ["data/embeddings/sentences", "data/embeddings/candidates"],
    "mine": ["data/pools"],
    "sample": ["data/pairs"],
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_bert) -> Path:
    """1500 sentences in 60 shards and 6000 candidates in 60 shards: plenty of shards to kill in."""
    root = tmp_path_factory.mktemp("resume-inputs")
    texts = make_texts(1500, seed=5)
    write_sentences(root / "data/sentences", texts, rows_per_shard=25)
    ids = [sentence_id(t) for t in texts]
    write_candidates(
        root / "data/candidates", candidate_rows(ids, texts, seed=5), rows_per_shard=100
    )
    write_params(root, stage_params(tiny_bert, "resume test", batch_size=16))
    return root


def snapshot(root: Path, stage: str) -> dict:
    out = {}
    for name in OUTPUTS[stage]:
        manifest = json.loads((root / name / "_manifest.json").read_text())
        files = sorted(str(p.relative_to(root / name)) for p in (root / name).rglob("*"))
        out[name] = (manifest, files)
    return out


@pytest.fixture(scope="module")
def reference(inputs, tmp_path_factory) -> dict:
    root = copy_project(inputs, tmp_path_factory.mktemp("resume-reference"))
    snaps = {}
    for stage in OUTPUTS:
        result = run_cli([stage, "--no-progress"], cwd=root)
        assert result.returncode == 0, result.stderr
        snaps[stage] = snapshot(root, stage)
    return snaps


def _start(stage: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pairforge.stages.cli", stage, "--no-progress"],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _kill_after_markers(proc: subprocess.Popen, progress: Path, markers: int) -> int:
    """SIGKILL ``proc`` once ``progress`` holds ``markers`` finished-shard markers."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if progress.is_dir() and len(list(progress.glob("part-*.json"))) >= markers:
            break
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return len(list(progress.glob("part-*.json"))) if progress.is_dir() else 0


@pytest.mark.slow
def test_sigkill_then_resume_gives_identical_output(inputs, reference, tmp_path):
    root = copy_project(inputs, tmp_path)
    for stage, outputs in OUTPUTS.items():
        # The last output of the stage is written last: kill while its shards are being written.
        target = root / outputs[-1]
        proc = _start(stage, root)
        finished = _kill_after_markers(proc, target / "_progress", 3)
        assert not (target / "_manifest.json").exists(), f"{stage} finished before the kill"
        assert finished >= 3
        result = run_cli([stage, "--no-progress"], cwd=root)
        assert result.returncode == 0, result.stderr
        if stage != "embed":
            metrics = json.loads((root / f"metrics/{stage}.json").read_text())
            assert 0 < metrics["computed_shards"] <= metrics["shards"] - finished
        else:
            metrics = json.loads((root / "metrics/embed.json").read_text())
            assert metrics["candidates"]["computed_shards"] <= 60 - finished
        assert snapshot(root, stage) == reference[stage], f"{stage} output differs after resume"
        assert not list(root.rglob("*.tmp-*")), "a killed run's temporary file was left behind"


def test_cli_errors_are_one_line(inputs, tmp_path):
    root = copy_project(inputs, tmp_path)
    result = run_cli(["mine", "--no-progress"], cwd=root)  # no embeddings yet
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: dataset 'data/embeddings/sentences' is not complete")
    bad = run_cli(["mine", "--band-low", "0.8", "--band-high", "0.3"], cwd=root)
    assert bad.returncode == 2
    assert "band_low (0.8) must not exceed band_high (0.3)" in bad.stderr
    bad = run_cli(["sample", "--edit-kind", "token"], cwd=root)
    assert bad.returncode == 2 and "sample.edit_kind: 'token' is not allowed" in bad.stderr


def test_help_lists_every_option():
    from pairforge.stages.cli import app
    from pairforge.stages.embed.stage import EmbedConfig
    from pairforge.stages.mine.stage import MineConfig
    from pairforge.stages.report.stage import ReportConfig
    from pairforge.stages.sample.stage import SampleConfig
    from typer.testing import CliRunner

    runner = CliRunner()
    for name, model, skip in (
        ("embed", EmbedConfig, set()),
        ("mine", MineConfig, {"widen_limits"}),  # a pair: set it in params.yaml
        ("sample", SampleConfig, set()),
        ("report", ReportConfig, set()),
    ):
        result = runner.invoke(app, [name, "--help"], env={"COLUMNS": "250"})
        assert result.exit_code == 0
        missing = [
            f
            for f in model.model_fields
            if f not in skip and f"--{f.replace('_', '-')}" not in result.output
        ]
        assert not missing, f"{name}: no option for {missing}"
