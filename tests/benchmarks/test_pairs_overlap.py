"""benchmarks/pairs_overlap.py: anchors matched by id, same draws counted, uniformity read."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location(
    "pairs_overlap", Path(__file__).parents[2] / "benchmarks" / "pairs_overlap.py"
)
overlap_module = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(overlap_module)


def _table(ids, negs, pos, probs, ent, sizes=None):
    return {
        "id": ids,
        "negative_ids": negs,
        "positive_text_id": pos,
        "negative_prob": probs,
        "negative_pool_size": sizes or [len(p) for p in probs],
        "negative_entropy": ent,
    }


def test_anchors_are_matched_by_id_and_same_draws_counted():
    a = _table(
        ["x", "y", "z"],
        [["n1", "n2"], ["n3"], ["n4"]],
        ["p1", "p2", "p3"],
        [[0.5, 0.5], [1.0], [0.25, 0.75]],
        [1.0, None, 0.8],
        [2, 1, 4],  # z: 0.75 x a pool of 4
    )
    # Another order, one anchor missing, one anchor's draw and another's positive changed.
    b = _table(
        ["z", "y", "w"],
        [["n4"], ["n9"], ["n5"]],
        ["p9", "p2", "p5"],
        [[0.1, 0.9], [1.0], [1.0]],
        [0.5, None, 1.0],
    )
    got = overlap_module.overlap(a, b)
    assert got["anchors"] == 2
    assert got["same_negatives"] == 1  # z
    assert got["same_positive"] == 1  # y
    assert got["uniformity"][0]["max"] == pytest.approx(3.0)  # 0.75 x 4
    assert got["uniformity"][0]["p50"] == pytest.approx(1.0)
    assert got["entropy"][0] == pytest.approx(0.9)
    text = overlap_module.markdown(["a", "b"], got)
    assert "2 anchors in both; the same negatives: 1 (50.0%)" in text
    assert "| b | 1.0000 | 1.6400 | 1.8000 |" in text


def test_datasets_with_no_common_anchor_are_a_clear_error():
    a = _table(["x"], [["n"]], ["p"], [[1.0]], [1.0])
    b = _table(["y"], [["n"]], ["p"], [[1.0]], [1.0])
    with pytest.raises(SystemExit, match="share no anchor id"):
        overlap_module.overlap(a, b)
