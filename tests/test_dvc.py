"""`dvc repro` of the demo in a fresh copy of the project: it runs, then reruns only what changed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT


def dvc(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    bin_dir = str(Path(sys.executable).parent)
    env = dict(
        os.environ,
        DVC_NO_ANALYTICS="1",
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        PYTHONPATH=str(ROOT),
    )
    return subprocess.run(
        [sys.executable, "-m", "dvc", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )


@pytest.fixture()
def project(tmp_path) -> Path:
    """A copy of the project's pipeline definition and demo data, as a fresh git + DVC repo."""
    dest = tmp_path / "project"
    dest.mkdir()
    for name in ("dvc.yaml", "params.yaml", ".dvc/config", ".dvc/.gitignore"):
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, dest / name)
    for folder in ("pipeline", "stages", "train", "data/demo"):
        shutil.copytree(ROOT / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    return dest


def test_every_stage_is_in_the_dvc_pipeline_and_it_resolves(project):
    """Every stage of the STAGES registry is a DVC stage, and the demo DAG (templated params,
    deps, outs) resolves with the edges the data flow needs."""
    from pairforge.stages import STAGES

    listed = dvc(["stage", "list"], project)
    assert listed.returncode == 0, listed.stderr
    names = {line.split()[0] for line in listed.stdout.splitlines() if line.strip()}
    assert set(STAGES) <= names, f"stages missing from dvc.yaml: {set(STAGES) - names}"
    dag = dvc(["dag", "--dot"], project)
    assert dag.returncode == 0, dag.stdout + dag.stderr
    for edge in (
        ("ingest", "backtranslate"),
        ("standin", "backtranslate"),
        ("backtranslate", "embed"),
        ("rewrite", "embed"),
        ("embed", "mine"),
        ("mine", "sample"),
        ("sample", "report"),
        ("sample", "train"),
        ("train", "evaluate"),
        ("ingest", "pretrain"),
        ("pretrain", "train"),
    ):
        assert f'"{edge[0]}" -> "{edge[1]}"' in dag.stdout, edge


@pytest.mark.slow
def test_dvc_repro_the_whole_demo(project):
    """The README's main job, ingest to the STS table (minutes on 2 cores; `-m slow`)."""
    first = dvc(["repro"], project)
    assert first.returncode == 0, first.stdout + first.stderr
    assert (project / "metrics/evaluate.json").exists()
    again = dvc(["repro"], project)
    assert again.returncode == 0 and "Running stage" not in again.stdout


def test_dvc_repro_demo_then_nothing_then_only_what_changed(project):
    first = dvc(["repro", "ingest"], project)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "Running stage 'ingest'" in first.stdout
    metrics = json.loads((project / "metrics/ingest.json").read_text())
    assert metrics["rows_read"] == metrics["rows_kept"] + metrics["rows_dropped_total"]
    assert metrics["rows_kept"] >= 1000
    assert metrics["rows_dropped"]["invalid_utf8"] > 0 and metrics["rows_dropped"]["duplicate"] > 0
    assert (project / "data/sentences/_manifest.json").exists()
    assert (project / "dvc.lock").exists()

    again = dvc(["repro", "ingest"], project)
    assert again.returncode == 0, again.stderr
    assert "Running stage" not in again.stdout
    assert "didn't change" in again.stdout

    params = yaml.safe_load((project / "params.yaml").read_text())
    params["ingest"]["min_words"] = 5
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    status = dvc(["status"], project)
    assert "ingest" in status.stdout and "modified" in status.stdout
    third = dvc(["repro", "ingest"], project)
    assert third.returncode == 0, third.stderr
    assert "Running stage 'ingest'" in third.stdout
    stricter = json.loads((project / "metrics/ingest.json").read_text())
    assert stricter["rows_dropped"]["too_short"] > metrics["rows_dropped"]["too_short"]
