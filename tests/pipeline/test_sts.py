"""STS evaluation: Spearman, SentEval's "all" aggregation, the file formats, alignment/uniformity.

Expected values are computed by hand: Spearman without ties as 1 - 6 sum(d^2) / (n (n^2 - 1)).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from pairforge.pipeline.plumbing.errors import PairforgeError
from pairforge.pipeline.science import sts

from tests.train.builders import STS_PAIRS


def test_rankdata_averages_ties():
    assert sts.rankdata(np.array([10, 20, 20, 30])).tolist() == [1, 2.5, 2.5, 4]
    assert sts.rankdata(np.array([3.0, 1.0, 2.0])).tolist() == [3, 1, 2]


def test_spearman_matches_the_rank_difference_formula():
    x = np.array([0.1, 0.4, 0.3, 0.9, 0.7])  # ranks 1 3 2 5 4
    y = np.array([1.0, 2.0, 3.0, 4.0, 5.0])  # ranks 1 2 3 4 5; sum d^2 = 4
    assert sts.spearman(x, y) == pytest.approx(1 - 6 * 4 / (5 * 24), abs=1e-12)
    assert sts.spearman(y, -y) == pytest.approx(-1.0)
    assert math.isnan(sts.spearman(np.ones(3), y[:3]))


def write_stsb(root, rows):
    (root / "stsb").mkdir(parents=True)
    lines = [f"g\tf\ty\t{i:04d}\t{gold}\t{a}\t{b}" for i, (a, b, gold) in enumerate(rows)]
    (root / "stsb" / "sts-test.csv").write_text("\n".join(lines) + "\n")


def test_known_embedding_reproduces_a_hand_computed_spearman(tmp_path):
    # cosines 1, 0, -1, 1/sqrt(2) -> ranks 4 2 1 3; gold 5 3 0 1 -> ranks 4 3 1 2; sum d^2 = 2
    rows = [("a1", "b1", 5.0), ("a2", "b2", 3.0), ("a3", "b3", 0.0), ("a4", "b4", 1.0)]
    write_stsb(tmp_path, rows)
    vectors = {
        "a1": [1, 0], "b1": [2, 0],
        "a2": [1, 0], "b2": [0, 3],
        "a3": [0, 1], "b3": [0, -1],
        "a4": [1, 0], "b4": [1, 1],
    }  # fmt: skip
    calls = []

    def embed(texts):
        calls.append(list(texts))
        return np.array([vectors[t] for t in texts], dtype=float)

    result = sts.evaluate(embed, tmp_path, ["stsb"], align_uniform=False)
    assert result["tasks"]["stsb"]["spearman"] == pytest.approx(100 * (1 - 6 * 2 / (4 * 15)))
    assert result["tasks"]["stsb"]["pairs"] == 4
    assert result["avg"] == result["tasks"]["stsb"]["spearman"]
    assert len(calls) == 1 and sorted(calls[0]) == sorted(vectors)  # each sentence once


def test_all_aggregation_is_one_spearman_over_the_concatenated_subsets():
    # Each subset alone is perfectly ranked; joined, cosines 4 3 2 1 vs gold ranks 4 2 3 1.
    data = sts.STSData(
        "sts12",
        ["a", "b", "c", "d"],
        ["e", "f", "g", "h"],
        np.array([5.0, 4.0, 4.5, 0.5]),
        np.array([0, 0, 1, 1]),
        ("A", "B"),
    )
    result = sts.score_task(data, np.array([0.9, 0.8, 0.2, 0.1]))
    assert result["spearman"] == pytest.approx(100 * (1 - 6 * 2 / (4 * 15)))
    assert result["subsets"] == {
        "A": {"spearman": pytest.approx(100.0), "pairs": 2},
        "B": {"spearman": pytest.approx(100.0), "pairs": 2},
    }
    assert result["mean"] == pytest.approx(100.0) and result["wmean"] == pytest.approx(100.0)


def test_loaders_read_every_format_and_drop_unscored_pairs(sts_dir):
    sts12 = sts.load_task(sts_dir, "sts12")
    assert len(sts12) == 2 * len(sts.STS_SUBSETS["sts12"])
    assert set(sts12.subset.tolist()) == set(range(5))
    sts15 = sts.load_task(sts_dir, "sts15")  # one empty gold line per subset is dropped
    assert len(sts15) == 2 * len(sts.STS_SUBSETS["sts15"])
    stsb = sts.load_task(sts_dir, "stsb")
    assert stsb.s1[1] == STS_PAIRS[1][0] and stsb.gold.tolist() == [p[2] for p in STS_PAIRS]
    sick = sts.load_task(sts_dir, "sickr")  # CRLF file, header skipped
    assert sick.s2 == [p[1] for p in STS_PAIRS]
    assert sick.gold.tolist() == pytest.approx([1 + 4 * p[2] / 5 for p in STS_PAIRS], abs=0.05)
    assert len(sts.load_task(sts_dir, "sickr_dev")) == len(STS_PAIRS)


def test_alignment_and_uniformity_match_hand_computed_values():
    a = np.array([[2.0, 0.0], [0.0, 1.0]])
    b = np.array([[0.0, 5.0], [0.0, 3.0]])
    assert sts.alignment(a, b) == pytest.approx((2.0 + 0.0) / 2)
    points = np.array([[1.0, 0.0], [0.0, 1.0], [-3.0, 0.0]])  # squared distances 2, 4, 2
    expected = math.log((2 * math.exp(-4) + math.exp(-8)) / 3)
    assert sts.uniformity(points) == pytest.approx(expected, rel=1e-12)


def test_evaluate_reports_every_task_with_alignment_on_stsb_positives(sts_dir):
    rng = np.random.default_rng(0)
    table: dict[str, np.ndarray] = {}

    def embed(texts):
        return np.array([table.setdefault(t, rng.normal(size=4)) for t in texts])

    result = sts.evaluate(embed, sts_dir)
    assert set(result["tasks"]) == set(sts.TEST_TASKS)
    assert result["avg"] == pytest.approx(
        np.mean([r["spearman"] for r in result["tasks"].values()])
    )
    assert result["alignment_pairs"] == sum(1 for p in STS_PAIRS if p[2] > 4)
    # The identical pair (gold 5) has distance 0; the alignment is the mean of the others.
    z = {t: v / np.linalg.norm(v) for t, v in table.items()}
    positives = [p for p in STS_PAIRS if p[2] > 4]
    expected = np.mean([np.sum((z[a] - z[b]) ** 2) for a, b, _ in positives])
    assert result["alignment"] == pytest.approx(expected)
    assert result["sentences_embedded"] == len({s for p in STS_PAIRS for s in p[:2]})


def test_missing_and_misaligned_files_are_clear_errors(tmp_path, sts_dir):
    with pytest.raises(PairforgeError, match=r"STS.input.FNWN.txt' not found; get the SentEval"):
        sts.load_task(tmp_path, "sts13")
    with pytest.raises(PairforgeError, match="unknown STS task 'sts17'"):
        sts.load_task(sts_dir, "sts17")
    bad = tmp_path / "bad"
    write_stsb(bad, [("a", "b", 1.0)])
    (bad / "stsb" / "sts-test.csv").write_text("g\tf\ty\t0\tfive\ta\tb\n")
    with pytest.raises(PairforgeError, match="gold score 'five' is not a number"):
        sts.load_task(bad, "stsb")
    folder = tmp_path / "sts13"
    folder.mkdir()
    for name in sts.STS_SUBSETS["sts13"]:
        (folder / f"STS.input.{name}.txt").write_text("a\tb\nc\td\n")
        (folder / f"STS.gs.{name}.txt").write_text("1.0\n")
    with pytest.raises(PairforgeError, match="has 1 lines but .* has 2"):
        sts.load_task(tmp_path, "sts13")


def test_subsample_is_seeded_and_keeps_file_order(sts_dir):
    data = sts.load_task(sts_dir, "sts14")
    a, b = sts.subsample(data, 5, seed=3), sts.subsample(data, 5, seed=3)
    assert a.s1 == b.s1 and len(a) == 5
    assert a.subset.tolist() == sorted(a.subset.tolist())  # subsets are consecutive in the files
    assert sts.subsample(data, 5, seed=4).subset.tolist() != a.subset.tolist()
    assert sts.subsample(data, None) is data


def test_the_real_sts_sets_load_with_senteval_counts(shared_data):
    """The shared STS data as shipped (its files' own formats, not the tests' rewrite of them):
    every test and dev task loads with SentEval's pair counts and per-subset sizes, gold in
    [0, 5] (SICK's relatedness in [1, 5])."""
    root = sts.find_data_folder(shared_data / "sts")
    expected = {
        "sts12": [750, 750, 459, 750, 399],
        "sts13": [189, 750, 561],
        "sts14": [450, 300, 750, 750, 750, 750],
        "sts15": [375, 750, 375, 750, 750],
        "sts16": [254, 249, 230, 244, 209],
        "stsb": [1379],
        "sickr": [4927],
        "stsb_dev": [1500],
        "sickr_dev": [500],
    }
    assert set(expected) == {*sts.TEST_TASKS, *sts.DEV_TASKS}
    for task, sizes in expected.items():
        data = sts.load_task(root, task)
        assert np.bincount(data.subset, minlength=len(data.subsets)).tolist() == sizes, task
        assert len(data.s1) == len(data.s2) == len(data) == sum(sizes), task
        assert all(data.s1) and all(data.s2), task
        low = 1.0 if task.startswith("sickr") else 0.0
        assert data.gold.min() >= low and data.gold.max() <= 5.0, task
