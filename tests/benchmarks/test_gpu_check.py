"""The prepared GPU check (benchmarks/gpu_check.py) on the CPU: every step end to end with
``--device cpu --dry-run`` (the device side is the CPU too, so every comparison must hold
exactly; in the slow suite, which CI runs), a failing step as its own row, the budget, and the
parts that carry it to a device."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest

SPEC = importlib.util.spec_from_file_location(
    "gpu_check", Path(__file__).resolve().parents[2] / "benchmarks/gpu_check.py"
)
check = importlib.util.module_from_spec(SPEC)
sys.modules[SPEC.name] = check
SPEC.loader.exec_module(check)


def run(tmp_path, *extra) -> dict:
    out = tmp_path / "out"
    check.main(["run", "--device", "cpu", "--dry-run", "--out", str(out), "--work",
                str(tmp_path / "work"), *extra])  # fmt: skip
    facts = json.loads((out / "gpu_check.json").read_text())
    assert (out / "gpu_check.md").read_text().startswith("| step | what |")
    return facts


# About a minute of subprocesses (every stage's command, twice for the kill): the slow suite,
# which CI runs, keeps the default suite within its 3 minutes.
@pytest.mark.slow
def test_the_dry_run_runs_every_step_and_every_check_holds(tmp_path, tiny_encoder_dir):
    facts = run(tmp_path, "--model", str(tiny_encoder_dir))
    rows = facts["rows"]
    assert [r["step"] for r in rows if r["check"] == "budget spent"] == []
    steps = {r["step"] for r in rows}
    assert steps == set(check.STEPS) - {"mine large"}  # one mine size in the dry run
    failed = [r for r in rows if r["check"].startswith(("FAILED", "NOT", "DIFFERS"))]
    assert failed == []
    by_what = {r["what"]: r for r in rows}
    mine = next(r for r in rows if r["step"] == "mine")
    assert "exact (torch, gpu False) vs CPU faiss flat" in mine["what"]
    assert "identical 1.0000" in mine["check"]  # torch's exact search = faiss's, on the CPU
    embed = next(r for r in rows if r["step"] == "embed")
    assert "min cosine 1.0" in embed["check"] and embed["device"] > 0 and embed["cpu"] > 0
    resumed = next(r for r in rows if r["what"].startswith("killed after checkpoint 2 of 4"))
    assert resumed["check"] == "ok; weights identical"  # killed at step 2 of 4, resumed, equal
    assert embed["unit"] == "rows/s" and embed["speedup"] is not None
    tests = next(r for r in rows if r["step"] == "gpu tests")
    assert tests["check"] == "NONE RAN (every gpu test skipped)"  # no GPU here: said, not ok
    bt = [r for r in rows if r["step"] == "backtranslate"]
    assert "identical 1.0000" in bt[0]["check"] and len(bt) == 2  # transformers, CTranslate2
    assert next(r for r in rows if r["step"] == "torchrun")["check"] == "ok"
    assert facts["dry_run"] is True and "gpu tests" in {r["step"] for r in by_what.values()}
    with tarfile.open(tmp_path / "out/logs.tar.gz") as tar:  # the jobs' logs come back too
        assert "train/killed/train.log" in tar.getnames()


def test_a_failing_step_is_one_row_and_the_next_steps_run(tmp_path):
    facts = run(tmp_path, "--steps", "embed", "mine", "--model", str(tmp_path / "no-such-model"))
    rows = {r["step"]: r for r in facts["rows"]}
    assert "StepError: embed exited 2: error: embed.model" in rows["embed"]["check"]
    assert rows["mine"]["check"].startswith("ok; identical 1.0000")


def test_steps_past_the_budget_are_listed_as_not_run(tmp_path):
    facts = run(tmp_path, "--budget", "-1", "--steps", "environment", "mine")
    assert [(r["step"], r["check"]) for r in facts["rows"]] == [
        ("environment", "budget spent"),
        ("mine", "budget spent"),
    ]


def test_pools_agreement_and_the_generated_inputs():
    a = {"x": {"1", "2"}, "y": {"3"}}
    b = {"x": {"1", "2"}, "y": {"3", "4"}}
    assert check.agreement(a, b) == (0.5, 0.75)
    texts = check.sentences(500, seed=7)
    assert len(set(texts)) == 500 and texts == check.sentences(500, seed=7)
    v = check.mining_vectors(400)
    assert np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-5)
    cos = v @ v.T
    in_band = ((cos > 0.25) & (cos < 0.75)).sum(axis=1)
    assert np.median(in_band) >= 5  # neighbourhoods reach into the mining band


def test_pack_splits_what_the_device_lacks_into_calls(tmp_path):
    package = tmp_path / "pkg" / "tiny_encoder"
    (package / "model").mkdir(parents=True)
    (package / "model/weights.bin").write_bytes(np.random.default_rng(0).bytes(300_000))
    wheel = tmp_path / "faiss_cpu-1.0-cp312-none-any.whl"
    wheel.write_bytes(b"w" * 1000)
    into = check.ROOT / ".gpu-check-test"
    try:
        manifest = check.pack(into, 0.1, wheels=[wheel], package=package)
        calls = check.sitting_module().device_calls(
            manifest, into, 500, script="benchmarks/gpu_check.py"
        )
    finally:
        shutil.rmtree(into, ignore_errors=True)
    assert manifest["wheels"] == {"faiss_cpu": 1000} and len(manifest["parts"]) >= 3
    assert calls[-1]["command"].endswith("python3 benchmarks/gpu_check.py run --budget 500")
    assert all("gpu_sitting.py receive .gpu-check-test/part-" in c["command"] for c in calls)


def test_a_job_still_running_at_the_deadline_is_killed_and_said(tmp_path, monkeypatch):
    monkeypatch.setattr(check, "DEADLINE", [time.monotonic() + 2])
    started = time.monotonic()
    cmd = [sys.executable, "-c", "import time; time.sleep(60)"]
    with pytest.raises(check.StepError, match="cut at the budget's deadline"):
        check.run_logged(cmd, tmp_path, tmp_path / "job.log", check.env("cpu"))
    assert time.monotonic() - started < 30
