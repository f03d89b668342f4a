"""`dvc repro` of the demo in a fresh copy of the project: it runs, then reruns only what changed.
The whole demo, ingest to the evaluation table and then nothing rerun, is the newcomer's test
(tests/test_newcomer.py: one demo run for the slow suite)."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pairforge.pipeline.plumbing import stagedefs
from pairforge.pipeline.plumbing.imports import changes_no_output, imports, module_file
from pairforge.stages import declarations

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


def test_dvc_yaml_is_what_the_declarations_generate():
    """dvc.yaml is `pairforge dvc-yaml`'s output for the stages as declared: a stage's deps are
    its inputs and code, its params the exact keys its fingerprint hashes. Run the command after
    editing a declaration or an import; this fails until then."""
    from pairforge.stages.dvcfile import render

    assert (ROOT / "dvc.yaml").read_text() == render(), "dvc.yaml is stale: run pairforge dvc-yaml"
    stages = yaml.safe_load(render())["stages"]
    for name, stage in declarations().items():
        entry = stages[name]
        assert entry["deps"] == [*stage.inputs, *stagedefs.code(stage)], name
        assert entry["params"] == [f"{name}.{key}" for key in stage.params], name
        # A whole section (`- train`) would rerun a stage for keys that change none of its output.
        assert all("." in key for key in entry["params"]), name


def test_the_check_fails_on_a_stale_dvc_yaml(tmp_path):
    """`pairforge dvc-yaml --check` exits 1 on a hand edit and 0 once the file is written again."""
    path = tmp_path / "dvc.yaml"
    path.write_text((ROOT / "dvc.yaml").read_text().replace("- mine.k\n", ""))
    run = [sys.executable, "-m", "pairforge.stages.cli", "dvc-yaml", "--path", str(path), "--code",
           "files"]  # fmt: skip
    stale = subprocess.run([*run, "--check"], capture_output=True, text=True)
    assert stale.returncode == 1 and "run `pairforge dvc-yaml`" in stale.stderr, stale.stderr
    assert subprocess.run(run, capture_output=True).returncode == 0
    assert path.read_text() == (ROOT / "dvc.yaml").read_text()
    assert subprocess.run([*run, "--check"], capture_output=True).returncode == 0


def test_every_config_key_is_declared_exactly_once_and_params_yaml_has_the_exact_keys():
    """Each key of a stage's config is an input, an output, an exact param or free, and only
    one of them (the params are the rest: a declared input, output or free key that is no
    config field fails here); every exact key resolves in the demo's params.yaml."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    for name, d in declarations().items():
        groups = {
            "inputs": set(stagedefs.input_keys(d)),
            "outputs": set(d.outputs),
            "params": {key.split(".")[0] for key in d.params},
            "free": set(d.free),
        }
        for a in groups:
            for b in groups:
                if a < b:
                    assert not groups[a] & groups[b], (name, a, b, groups[a] & groups[b])
        assert set().union(*groups.values()) == set(d.config.model_fields), name
        values = stagedefs.exact_params(d, params[name])
        assert len(values) == len(d.params), name
    train = declarations()["train"]
    assert (
        stagedefs.exact_params(train, params["train"])[f"recipes.{params['train']['objective']}"]
        == params["train"]["recipes"][params["train"]["objective"]]
    )


def _changes_no_output(file: Path) -> bool:
    return changes_no_output(ast.parse(file.read_text()))


def test_a_stage_code_is_its_module_and_everything_it_imports():
    """A stage's code holds its module and every project module it imports, transitively
    (inside functions too), except the plumbing that says it changes no output; a module it
    never imports is not in it."""
    neutral = {
        p.relative_to(ROOT).as_posix()
        for folder in ("pipeline", "stages")
        for p in (ROOT / folder).rglob("*.py")
        if _changes_no_output(p)
    }
    assert {"pipeline/plumbing/locks.py", "stages/options.py"} <= neutral
    assert "pipeline/plumbing/shards.py" not in neutral
    for name, stage in declarations().items():
        files = stagedefs.code(stage)
        assert f"stages/{name}/stage.py" in files, name
        assert not set(files) & neutral, name
        for file in files:
            assert (ROOT / file).exists(), f"{name}: code {file} does not exist"
            if file.endswith(".py"):
                for _, module in imports(ROOT / file, ROOT):
                    target = module_file(module, ROOT)
                    if target is not None:
                        rel = target.relative_to(ROOT).as_posix()
                        assert rel in files or rel in neutral, (name, file, rel)
    sample = stagedefs.code(declarations()["sample"])
    assert "stages/export/layouts.py" not in sample and "stages/report/diagnostics.py" not in sample
    # mine reads the pools module; sample reads mine's datasets, never its code
    assert "pipeline/science/pools.py" in stagedefs.code(declarations()["mine"])
    assert "pipeline/science/pools.py" not in sample
