"""The newcomer: a fresh clone with nothing beside it runs the README's demo command to the end.

No ``../shared`` beside the clone and no ``PAIRFORGE_SHARED_DATA``: the STS data is absent, as on
every machine but CI's. The clone is of the committed HEAD of this repository; ``dev.py`` creates
its own ``.venv`` and installs it (pip's cache is reused, the install itself is tested), then
``dvc repro`` runs ingest through evaluate; the command again reruns nothing (the
slow suite's one whole demo run). About 10 minutes on an idle 2-core machine, far more
under load: marked slow (``python3 dev.py test -m slow``, which ``.ci/run`` runs).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from pairforge.pipeline.science import sts

from tests.conftest import ROOT
from tests.sts_reference import reference_score, st_encoder

pytestmark = pytest.mark.slow

STS_TASKS = ["sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr"]


def readme_demo_command() -> list[str]:
    """The Quick start's demo command, as the README states it."""
    readme = (ROOT / "README.md").read_text()
    quick_start = readme.split("## Quick start", 1)[1]
    match = re.search(r"^(python3 dev\.py demo)\b", quick_start, re.MULTILINE)
    assert match, "README's Quick start has no `python3 dev.py demo` line"
    return match.group(1).split()


def newcomer_env() -> dict[str, str]:
    """This environment less what a newcomer would not have: the shared data variable, this
    checkout's virtual environment (on PATH and as VIRTUAL_ENV) and its import path."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"PAIRFORGE_SHARED_DATA", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"}
    }
    venvs = [str(ROOT / ".venv"), os.environ.get("VIRTUAL_ENV") or str(ROOT / ".venv")]
    env["PATH"] = os.pathsep.join(
        entry
        for entry in os.environ.get("PATH", "").split(os.pathsep)
        if entry and not any(entry.startswith(venv) for venv in venvs)
    )
    return env


def test_a_fresh_clone_without_the_sts_data_runs_the_demo_to_the_evaluation_table(tmp_path):
    clone = tmp_path / "newcomer" / "pairforge"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=300)
    assert not (clone.parent / "shared").exists()
    env = newcomer_env()
    python3 = shutil.which("python3", path=env["PATH"])
    assert python3 and not Path(python3).is_relative_to(ROOT), python3
    command = readme_demo_command()
    result = subprocess.run(
        [python3, *command[1:]],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=80 * 60,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-8000:]

    # Evaluate said once that the STS data is absent, with the command that fetches it.
    said = [line for line in output.splitlines() if "evaluate: no STS data" in line]
    assert len(said) == 1, said
    assert "git clone https://github.com/facebookresearch/SentEval" in said[0]

    report = (clone / "reports" / "evaluate.md").read_text()
    assert "Sets scored: Demo test (240 pairs" in report
    assert "**Not scored: STS12, STS13, STS14, STS15, STS16, STS-B, SICK-R**" in report
    assert "| model | pooling | Demo test | Avg. | align | uniform |" in report
    assert report.strip() in result.stdout  # the demo ends with the table

    metrics = json.loads((clone / "metrics" / "evaluate.json").read_text())
    assert metrics["tasks"] == ["demo_test"] and metrics["skipped"] == STS_TASKS
    assert metrics["data"] is None and metrics["align_task"] == "demo_test"
    models = metrics["models"]
    assert "debcse" in models and len(models) >= 2  # the trained model beside its base
    demo_test = sts.load_task(clone / "data" / "demo" / "eval", "demo_test")
    for scores in models.values():
        assert -100 <= scores["demo_test"] <= 100 and scores["avg"] == scores["demo_test"]
        # Each score is what sentence-transformers' vectors and scipy's Spearman give.
        trained = scores["trained"] is not None
        encoder = st_encoder(scores["model"], scores["pooling"], trained, cwd=clone)
        reference = reference_score(encoder, demo_test)
        assert scores["demo_test"] == pytest.approx(reference, abs=0.01), scores["model"]
    # The checkpoint was selected on the demo set's dev split.
    assert models["debcse"]["trained"]["dev"]["demo_dev"] is not None
    assert "| debcse | " in report

    # The command again: nothing to install, no stage to rerun, the same table.
    again = subprocess.run(
        [python3, *command[1:]], cwd=clone, env=env, capture_output=True, text=True, timeout=600
    )
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    assert "Running stage" not in again.stdout and "pip install" not in again.stdout
    assert report.strip() in again.stdout
