"""The one fingerprint: exact params, inputs and declared code in; free keys and outputs out."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pytest
import yaml
from pairforge.pipeline.plumbing import fingerprint as fp_module
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing import stagedefs
from pairforge.pipeline.plumbing.fingerprint import dataset_token, fingerprint
from pairforge.pipeline.plumbing.shards import DatasetWriter, open_dataset
from pairforge.pipeline.plumbing.stagedefs import StageDef
from pairforge.pipeline.plumbing.version import code_version, source_hash
from pairforge.stages import declaration, declarations

from tests.conftest import ROOT

MINE, TRAIN = declaration("mine"), declaration("train")


def _params() -> dict:
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def test_a_declared_param_changes_the_fingerprint_a_free_key_or_an_output_does_not():
    mine = _params()["mine"]
    base = fingerprint(MINE, mine)
    assert fingerprint(MINE, dict(mine)) == base
    assert fingerprint(MINE, {**mine, "band_low": 0.3}) != base
    assert fingerprint(MINE, {**mine, "widen_limits": [-1.0, 0.8]}) != base
    for free in ("threads", "query_batch", "anchor_batch"):
        assert fingerprint(MINE, {**mine, free: 7}) == base, free
    assert fingerprint(MINE, {**mine, "output": "elsewhere", "metrics": "m.json"}) == base
    # Inputs count by their content (the inputs argument), not by their path.
    assert fingerprint(MINE, {**mine, "sentences": "data/other"}) == base
    assert fingerprint(MINE, mine, extra={"engine": "x"}) != base


def test_train_hashes_its_objectives_recipe_only():
    train = _params()["train"]
    assert train["objective"] == "debcse"
    base = fingerprint(TRAIN, train)
    other = {**train["recipes"], "bsl": {"options": {"k": 9, "delta": 0.9, "num_mlps": 2}}}
    assert fingerprint(TRAIN, {**train, "recipes": other}) == base
    own = {**train["recipes"], "debcse": {"options": {"temperature": 0.1}}}
    assert fingerprint(TRAIN, {**train, "recipes": own}) != base
    switched = {**train, "objective": "bsl"}
    assert stagedefs.exact_params(TRAIN, switched)["recipes.bsl"] == train["recipes"]["bsl"]
    assert "recipes.debcse" not in stagedefs.exact_params(TRAIN, switched)


def test_a_missing_declared_key_is_an_error_naming_it():
    mine = {k: v for k, v in _params()["mine"].items() if k != "band_low"}
    with pytest.raises(KeyError, match="mine.band_low"):
        fingerprint(MINE, mine)


def _dataset(path, texts: list[str], stage: StageDef | str = "t", run_fingerprint: str = "f"):
    writer = DatasetWriter(path, S.SENTENCES, stage=stage, params={}, fingerprint=run_fingerprint)
    table = pa.table(
        {
            S.ID: [f"{i:016x}" for i in range(len(texts))],
            S.TEXT: texts,
            S.SOURCE: ["s"] * len(texts),
            S.LINE: list(range(len(texts))),
        }
    )
    writer.write(0, table)
    writer.finalize(1)
    return open_dataset(path, S.SENTENCES)


def test_an_input_counts_by_its_content(tmp_path):
    mine = _params()["mine"]
    a = _dataset(tmp_path / "a", ["one two three", "four five six"])
    same = _dataset(tmp_path / "same", ["one two three", "four five six"])
    other = _dataset(tmp_path / "b", ["one two three", "four five seven"])
    assert dataset_token(a) == dataset_token(same)
    base = fingerprint(MINE, mine, {"sentences": a})
    assert fingerprint(MINE, mine, {"sentences": same}) == base
    assert fingerprint(MINE, mine, {"sentences": other}) != base
    assert fingerprint(MINE, mine, {"sentences": None}) != base


def test_the_code_hash_covers_the_code_the_stage_runs_only(tmp_path, monkeypatch):
    """A module the stage imports changes its code hash, and so does an import it gains; a
    module of the same folder that the stage does not run (the report's diagnostics, for mine)
    does not."""
    for entry in ("pipeline", "stages", "train"):
        shutil.copytree(
            ROOT / entry, tmp_path / entry, ignore=shutil.ignore_patterns("__pycache__")
        )
    monkeypatch.setattr(stagedefs, "ROOT", tmp_path)
    report_stage = declaration("report")
    base, report = stagedefs.code_hash(MINE), stagedefs.code_hash(report_stage)
    unrun = tmp_path / "stages/report/diagnostics.py"
    unrun.write_text(unrun.read_text() + "\n# an edit mine does not run\n")
    assert stagedefs.code_hash(MINE) == base
    assert stagedefs.code_hash(report_stage) != report
    run = tmp_path / "pipeline/science/pools.py"
    run.write_text(run.read_text() + "\n# an edit mine runs\n")
    edited = stagedefs.code_hash(MINE)
    assert edited != base
    # An import inside a function is code the stage runs: the imported module joins its code.
    index = tmp_path / "stages/mine/index.py"
    index.write_text(
        index.read_text() + "\n\ndef _later():\n    import pairforge.pipeline.science.sts\n"
    )
    stagedefs._code.cache_clear()
    assert "pipeline/science/sts.py" in stagedefs.code(MINE)
    assert stagedefs.code_hash(MINE) != edited
    stagedefs._code.cache_clear()


def test_manifests_name_the_same_code_the_fingerprint_hashes(tmp_path, monkeypatch):
    params = _params()
    for name, stage in declarations().items():
        assert source_hash(stage) == stagedefs.code_hash(stage)
        assert code_version(stage, git=False).endswith(f"+src.{stagedefs.code_hash(stage)}")
        # A dataset of the stage, written as its runs write them: the code its manifest names is
        # the code its fingerprint hashes (with it in place of the stage's code hash, the same
        # fingerprint; with another, not the same).
        section = params[name]
        real = fingerprint(stage, section)
        manifest = _dataset(tmp_path / name, ["one"], stage, real).manifest
        assert manifest["stage"] == name and manifest["fingerprint"] == real
        named = manifest["code_version"].rsplit("+src.", 1)[1]
        with monkeypatch.context() as patched:
            patched.setattr(fp_module, "source_hash", {stage: named}.get)
            assert fingerprint(stage, section) == real, name
            patched.setattr(fp_module, "source_hash", {stage: "0" * 12}.get)
            assert fingerprint(stage, section) != real, name
