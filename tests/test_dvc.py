"""`dvc repro` of the demo in a fresh copy of the project: it runs, then reruns only what changed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.imports import imports


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


# ----------------------------------------------------------------------------- the declaration


def input_keys(stage: str) -> tuple[str, ...]:
    """The keys of the stage's own section that its ``inputs`` templates name."""
    from pairforge.pipeline import stagedefs

    keys = []
    for template in stagedefs.stage_def(stage).inputs:
        for ref in re.findall(r"\$\{([A-Za-z_][\w.]*)\}", template):
            section, _, key = ref.partition(".")
            if section == stage and key not in keys:
                keys.append(key)
    return tuple(keys)


def _dvc_stages() -> dict:
    return yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


def test_dvc_yaml_deps_and_params_are_the_stage_declarations():
    """dvc.yaml lists, for every stage, exactly the data, code and param keys that
    pipeline/stagedefs.py declares (and the fingerprints hash): they cannot drift apart."""
    from pairforge.pipeline import stagedefs

    stages = _dvc_stages()
    assert set(stages) == set(stagedefs.STAGES)
    for name, stage in stages.items():
        declared = stagedefs.stage_def(name)
        assert stage["deps"] == [*declared.inputs, *declared.code], name
        assert stage["params"] == [f"{name}.{key}" for key in declared.params], name
        # A whole section (`- train`) would rerun a stage for keys that change none of its output.
        assert all("." in key for key in stage["params"]), name


def test_every_config_key_is_declared_exactly_once_and_params_yaml_has_the_exact_keys():
    """Each key of a stage's config is an input, an output, an exact param or free, and only
    one of them; every exact key resolves in the demo's params.yaml."""
    from pairforge.pipeline import stagedefs
    from pairforge.stages import config_models

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    for name, model in config_models().items():
        d = stagedefs.STAGES[name]
        groups = {
            "inputs": set(input_keys(name)),
            "outputs": set(d.outputs),
            "params": {key.split(".")[0] for key in d.params},
            "free": set(d.free),
        }
        for a in groups:
            for b in groups:
                if a < b:
                    assert not groups[a] & groups[b], (name, a, b, groups[a] & groups[b])
        assert set().union(*groups.values()) == set(model.model_fields), name
        values = stagedefs.exact_params(name, params[name])
        assert len(values) == len(d.params), name
    assert (
        stagedefs.exact_params("train", params["train"])[f"recipes.{params['train']['objective']}"]
        == params["train"]["recipes"][params["train"]["objective"]]
    )


def _module_file(module: str) -> str | None:
    path = ROOT.joinpath(*module.split(".")[1:])
    if path.with_suffix(".py").is_file():
        return str(path.with_suffix(".py").relative_to(ROOT))
    if (path / "__init__.py").is_file():
        return str((path / "__init__.py").relative_to(ROOT))
    return None


def _project_imports(file: str) -> set[str]:
    """The project source files ``file`` imports (at the top or inside functions, relative and
    ``importlib`` imports resolved: tests/imports.py)."""
    found = set()
    for _, module in imports(ROOT / file, ROOT):
        if module.startswith("pairforge.") and (target := _module_file(module)):
            found.add(target)
    return found


def test_declared_code_covers_every_project_module_a_stage_runs():
    """A stage's declared code (its deps, and what its fingerprint hashes) holds its module and
    every project module it imports, transitively, except the plumbing that changes no output
    (package ``__init__`` files that only re-export are followed, not required)."""
    from pairforge.pipeline import stagedefs

    for name in stagedefs.STAGES:
        declared = stagedefs.STAGES[name].code
        for entry in declared:
            assert (ROOT / entry).exists(), f"{name}: declared code {entry} does not exist"

        def covered(file: str, declared=declared) -> bool:
            return any(file == e or file.startswith(e.rstrip("/") + "/") for e in declared)

        seen: set[str] = set()
        todo = [f"stages/{name}/stage.py"]
        while todo:
            file = todo.pop()
            if file in seen or file in stagedefs.PLUMBING:
                continue
            seen.add(file)
            if not file.endswith("__init__.py"):
                assert covered(file), f"{name} runs {file}, which pipeline/stagedefs.py omits"
            todo.extend(_project_imports(file))
