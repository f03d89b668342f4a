"""The demo evaluation set (data/demo/eval): its files, held out of the corpus, read as STS tasks."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest
from pairforge.pipeline.plumbing.errors import ConfigError, PairforgeError
from pairforge.pipeline.science import sts
from pairforge.pipeline.science.text import normalize_one

from tests.conftest import ROOT

EVAL = ROOT / "data" / "demo" / "eval"
KINDS = ("paraphrase", "detail_lost", "related", "near_miss", "same_topic", "unrelated")


def rows(split: str) -> list[list[str]]:
    return [line.split("\t") for line in (EVAL / f"{split}.tsv").read_text().splitlines()]


def corpus_texts() -> set[str]:
    """What ingest reads from the demo corpus, normalised as ingest does, casefolded."""
    texts = {normalize_one(line) for line in (ROOT / "data/demo/corpus.txt").open()}
    for line in (ROOT / "data/demo/extra.jsonl").open():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # the file's deliberately broken lines
        if isinstance(record, dict) and isinstance(record.get("text"), str):
            texts.add(normalize_one(record["text"]))
    return {text.casefold() for text in texts if text}


@pytest.mark.parametrize(("task", "pairs"), [("demo_dev", 120), ("demo_test", 240)])
def test_the_reader_loads_each_split_as_an_sts_task(task, pairs):
    data = sts.load_task(EVAL, task)
    assert len(data) == pairs
    assert data.gold.min() == 0.0 and 4.5 <= data.gold.max() <= 5.0  # STS's 0-5 scale
    assert all(s1 and s2 and s1 != s2 for s1, s2 in zip(data.s1, data.s2, strict=True))
    assert sts.task_files(EVAL, task) == [EVAL / sts.DEMO_FILES[task]]
    assert sts.LABELS[task].startswith("Demo")


@pytest.mark.parametrize("split", ["dev", "test"])
def test_every_line_is_stsb_layout_with_balanced_kinds_and_topics(split):
    lines = rows(split)
    assert all(len(columns) == 7 for columns in lines)
    assert [c[3] for c in lines] == [f"{i:04d}" for i in range(len(lines))]
    assert {c[2] for c in lines} == {split}
    kinds = defaultdict(int)
    for columns in lines:
        kinds[columns[1]] += 1
    assert set(kinds) == set(KINDS) and len(set(kinds.values())) == 1
    assert len({c[0] for c in lines}) == 20  # the corpus's 20 topics, in both splits


def test_gold_scores_order_the_kinds_of_pair_as_the_readme_says():
    gold = defaultdict(list)
    for split in ("dev", "test"):
        for columns in rows(split):
            gold[columns[1]].append(float(columns[4]))
    means = [np.mean(gold[kind]) for kind in KINDS]
    assert means == sorted(means, reverse=True)
    assert min(gold["paraphrase"]) >= 4.0 and max(gold["unrelated"]) <= 0.5
    assert max(gold["near_miss"]) <= 2.0 <= min(gold["related"])


def test_the_set_is_held_out_of_the_corpus_and_the_splits_share_no_sentence():
    sentences = {
        split: {s for columns in rows(split) for s in columns[5:7]} for split in ("dev", "test")
    }
    assert not sentences["dev"] & sentences["test"]
    seen = corpus_texts()
    assert len(seen) > 1300  # the corpus was read
    leaked = sorted(
        s for split in sentences.values() for s in split if normalize_one(s).casefold() in seen
    )
    assert leaked == []


def test_ingest_does_not_read_the_eval_folder_and_train_evaluate_depend_on_it():
    import yaml

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    inputs = params["ingest"]["inputs"]
    assert params["ingest"]["root"] == "data/demo"
    assert not any("eval" in pattern or "*" in pattern for pattern in inputs), inputs
    assert params["train"]["demo_dir"] == params["evaluate"]["demo_data"] == "data/demo/eval"
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert "${train.demo_dir}" in stages["train"]["deps"]
    assert "${evaluate.demo_data}" in stages["evaluate"]["deps"]
    assert not any("demo" in str(dep) for dep in stages["ingest"]["deps"][1:])


def test_task_folder_and_an_absent_sts_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("PAIRFORGE_NO_SUCH", raising=False)
    assert sts.task_folder("demo_dev", None, EVAL) == EVAL
    assert sts.task_folder("stsb_dev", tmp_path, EVAL) == tmp_path
    assert sts.find_data_folder(tmp_path / "none") is None
    assert sts.find_data_folder("$PAIRFORGE_NO_SUCH/sts") is None
    assert sts.find_data_folder(tmp_path) == tmp_path
    with pytest.raises(ConfigError, match="does not exist; get the SentEval"):
        sts.task_folder("stsb", tmp_path / "none", EVAL)
    with pytest.raises(ConfigError, match="needs the demo evaluation set's folder"):
        sts.task_folder("demo_test", tmp_path, None)


def test_a_missing_demo_file_names_it_and_where_the_set_ships(tmp_path):
    with pytest.raises(PairforgeError) as info:
        sts.load_task(tmp_path, "demo_test")
    message = str(info.value)
    assert str(tmp_path / "test.tsv") in message and "data/demo/eval" in message
    assert "SentEval" not in message
