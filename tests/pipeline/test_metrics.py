"""Headline metrics: each stage's full metrics JSON with a small headline beside it, and dvc.yaml
declaring only the headlines as metrics, so the top-level `dvc metrics show` stays narrow."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from pairforge.pipeline.plumbing.metrics import headline, headline_path, write_metrics
from pairforge.stages import declaration, declarations

ROOT = Path(__file__).parents[2]


def test_headline_picks_paths_wildcards_and_functions_and_skips_what_is_missing():
    metrics = {
        "rows": 5,
        "pool": {"p50": 3.0},
        "models": {"a": {"avg": 70.0}, "b": {"avg": 75.5}, "c": {"other": 1}},
        "debcse": {"steps": 200},
    }
    spec = {
        "rows_out": "rows",
        "pool_p50": "pool.p50",
        "sts_avg": "models.*.avg",
        "steps": lambda m: m["debcse"]["steps"],
        "gone": "pool.p90",
        "broken": lambda m: m["nothing"],
    }
    assert headline(metrics, spec) == {
        "rows_out": 5,
        "pool_p50": 3.0,
        "sts_avg": {"a": 70.0, "b": 75.5},
        "steps": 200,
    }


def test_write_metrics_writes_everything_and_the_headline_beside_it(tmp_path):
    metrics = {"rows_kept": 7, "rows_dropped_total": 2, "rows_dropped": {"empty": 2}}
    head = write_metrics(tmp_path / "m" / "ingest.json", metrics, declaration("ingest").headlines)
    assert (
        head
        == tmp_path / "m" / "headline" / "ingest.json"
        == headline_path(head.parent.parent / "ingest.json")
    )
    assert json.loads((tmp_path / "m" / "ingest.json").read_text()) == metrics
    assert json.loads(head.read_text()) == {"rows_out": 7, "dropped": 2}


def test_train_and_evaluate_headlines_name_the_objective_and_models():
    train = {"debcse": {"steps": 200, "best_dev": 80.9, "rows_used": 3200}}
    assert headline(train, declaration("train").headlines) == {"steps": 200, "best_dev": 80.9}
    evaluate = {"models": {"debcse": {"avg": 79.7, "sts12": 77.0}, "base (mean)": {"avg": 80.3}}}
    assert headline(evaluate, declaration("evaluate").headlines) == {
        "sts_avg": {"debcse": 79.7, "base (mean)": 80.3}
    }


def test_dvc_yaml_declares_the_headlines_as_metrics_and_the_full_files_as_outputs():
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    headlines = {name for name, stage in declarations().items() if stage.headlines}
    with_metrics = {name for name, stage in dvc.items() if stage.get("metrics")}
    assert with_metrics == headlines
    for name in headlines:
        stage = dvc[name]
        declared = [next(iter(entry)) for entry in stage["metrics"]]
        assert declared == [str(headline_path(params[name]["metrics"]))], name
        outs = [next(iter(entry)) if isinstance(entry, dict) else entry for entry in stage["outs"]]
        assert f"${{{name}.metrics}}" in outs, name
        assert "pipeline/plumbing/metrics.py" in stage["deps"], name


def test_a_stage_writes_its_headline(tmp_path):
    from pairforge.pipeline.plumbing.runner import LocalExecutor
    from pairforge.stages.ingest.stage import IngestConfig, run

    (tmp_path / "a.txt").write_text("one two three four five\n\nsix seven eight nine ten\n")
    cfg = IngestConfig(
        root=str(tmp_path),
        inputs=["a.txt"],
        output=str(tmp_path / "out" / "sentences"),
        quarantine=str(tmp_path / "out" / "quarantine"),
        metrics=str(tmp_path / "metrics" / "ingest.json"),
    )
    metrics = run(cfg, LocalExecutor(), progress=False)
    head = json.loads((tmp_path / "metrics" / "headline" / "ingest.json").read_text())
    assert head == {"rows_out": metrics["rows_kept"], "dropped": metrics["rows_dropped_total"]}
    assert head["rows_out"] == 2
