"""A team's own project: pairforge built as a wheel, installed into a fresh virtual environment,
``pairforge init`` in an empty folder outside this repository, then ``dvc repro`` there runs every
stage to the evaluation table, with nothing of the repository (no params, no dvc.yaml, no data,
no source) and without the STS data, as README's "Your own project" says.

The fresh environment gets the wheel's pairforge with no dependency of its own: the test
environment's installed packages (torch, DVC, ...) are on its path by a ``.pth`` line, which
does not run the editable install's hooks, so only the wheel provides ``pairforge``. Training is
cut to a few steps (the demo's full run: tests/test_newcomer.py). About 4 minutes, slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.test_newcomer import newcomer_env

pytestmark = pytest.mark.slow


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: int = 900) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args}:\n{(done.stdout + done.stderr)[-6000:]}"
    return done.stdout + done.stderr


def test_a_wheel_in_a_fresh_environment_inits_a_project_that_dvc_repro_runs(tmp_path):
    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
          "-w", str(wheels), str(ROOT)], tmp_path, dict(os.environ))  # fmt: skip
    (wheel,) = wheels.glob("pairforge-*.whl")

    env_dir = tmp_path / "env"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                tmp_path, {})  # fmt: skip
    Path(site.strip(), "test-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    env = newcomer_env()
    env.update(PATH=os.pathsep.join([str(env_dir / "bin"), env["PATH"]]), DVC_NO_ANALYTICS="1",
               VIRTUAL_ENV=str(env_dir))  # fmt: skip
    _run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], tmp_path, env)
    where = _run([str(python), "-c", "import pairforge.stages as s; print(s.__file__)"],
                 tmp_path, env)  # fmt: skip
    assert Path(where.strip()).is_relative_to(env_dir), where  # the wheel's, not this checkout's

    project = tmp_path / "our-embeddings"
    project.mkdir()
    said = _run([str(env_dir / "bin" / "pairforge"), "init"], project, env)
    assert "a pairforge project (demo profile) is ready" in said
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["pretrain"]["steps"] = 2
    params["pretrain"]["checkpoint_every"] = 2
    params["train"].update(max_steps=4, save_every=4, eval_every=2)
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    _run([str(python), "-m", "dvc", "repro"], project, env, timeout=1800)
    status = _run([str(python), "-m", "dvc", "status"], project, env)
    assert "up to date" in status, status
    report = (project / "reports/evaluate.md").read_text()
    assert "Demo test" in report and "| debcse | mean |" in report, report[:2000]
    verified = _run([str(env_dir / "bin" / "pairforge"), "verify", "data/pairs"], project, env)
    assert "data/pairs: ok" in verified
    manifest = json.loads((project / "data/pairs/_manifest.json").read_text())
    assert manifest["rows"] > 0
    assert not (project / "pipeline").exists() and not (project / "stages").exists()
