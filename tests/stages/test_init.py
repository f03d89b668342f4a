"""``pairforge init`` writes a working project into any folder: the profile's params, dvc.yaml with
the stages' code as hashes, the demo data, a README; DVC runs there with nothing of this
repository (the wheel-installed flow end to end: tests/test_init_wheel.py, slow)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml
from pairforge.pipeline.plumbing.stagedefs import code_hash
from pairforge.stages import declarations
from pairforge.stages.init import DEMO_FILES
from pairforge.stages.params import profile_params

from tests.conftest import ROOT, run_cli


def test_init_writes_a_project_that_dvc_runs_and_refuses_to_write_over_it(tmp_path):
    project = tmp_path / "team" / "embeddings"
    done = run_cli(["init", str(project)], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "dvc init --no-scm" in done.stdout and "cd " in done.stdout

    params = yaml.safe_load((project / "params.yaml").read_text())
    assert params == profile_params("demo")
    for name in DEMO_FILES:  # the packaged demo data, byte for byte the repository's
        assert (project / "data/demo" / name).read_bytes() == (
            ROOT / "data/demo" / name
        ).read_bytes()
    assert (project / ".dvc").is_dir() and (project / ".dvcignore").is_file()
    assert "data/demo/" in (project / "README.md").read_text()

    # The stages' code is no file of the project: each stage's hash is one of its params.
    stages = yaml.safe_load((project / "dvc.yaml").read_text())["stages"]
    hashes = yaml.safe_load((project / ".pairforge/code.yaml").read_text())
    for name, stage in declarations().items():
        assert hashes[name] == code_hash(stage)
        assert stages[name]["deps"] == list(stage.inputs), name
        assert stages[name]["params"][-1] == {".pairforge/code.yaml": [name]}
        assert not any(str(dep).endswith(".py") for dep in stages[name]["deps"])
    check = run_cli(["dvc-yaml", "--check"], cwd=project)
    assert check.returncode == 0, check.stderr

    # DVC runs the first stage there, and the lock then holds the code's hash as a param.
    repro = subprocess.run(
        [sys.executable, "-m", "dvc", "repro", "ingest"],
        cwd=project, capture_output=True, text=True, timeout=300,
        env={**os.environ, "DVC_NO_ANALYTICS": "1",
             "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])},
    )  # fmt: skip
    assert repro.returncode == 0, repro.stdout + repro.stderr
    lock = yaml.safe_load((project / "dvc.lock").read_text())
    assert lock["stages"]["ingest"]["params"][".pairforge/code.yaml"] == {
        "ingest": hashes["ingest"]
    }
    assert (project / "data/sentences/_manifest.json").is_file()

    # Again: refused, one line, nothing written; --force writes params.yaml over a user's edit.
    (project / "params.yaml").write_text("edited: true\n")
    again = run_cli(["init", str(project)], cwd=tmp_path)
    assert again.returncode == 2
    assert again.stderr.strip().splitlines() == [
        f"error: init: {str(project)!r} already holds params.yaml and dvc.yaml; pass --force to "
        "write over them (the data stays), or `pairforge profile use` to change the profile only"
    ]
    assert (project / "params.yaml").read_text() == "edited: true\n"
    forced = run_cli(["init", str(project), "--force", "--no-dvc"], cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert yaml.safe_load((project / "params.yaml").read_text()) == profile_params("demo")


def test_init_paper_leaves_the_corpus_folder_to_fill_and_an_unknown_profile_writes_nothing(
    tmp_path,
):
    done = run_cli(["init", "--profile", "paper", "--no-dvc"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    root = profile_params("paper")["ingest"]["root"]
    assert (tmp_path / root).is_dir() and not any((tmp_path / root).iterdir())
    assert f"Put the corpus in `{root}/`" in (tmp_path / "README.md").read_text()
    assert not (tmp_path / ".dvc").exists()

    empty = tmp_path / "other"
    bad = run_cli(["init", str(empty), "--profile", "nope"], cwd=tmp_path)
    assert bad.returncode == 2 and "'nope' is not a profile" in bad.stderr
    assert not empty.exists()
