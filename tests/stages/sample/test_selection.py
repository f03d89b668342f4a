"""Negative selection: the rank window, the positive-aware ceiling and the samplers (top, SimANS),
by hand on ragged pools, then in the stage on the mined fixture project."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.compute as pc
import pytest
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.shards import open_dataset
from pairforge.pipeline.science.mining_inputs import load_vectors, open_embeddings
from pairforge.pipeline.science.text import match_key
from pairforge.stages.sample.selection import (
    pool_ranks,
    positive_scores,
    select,
    simans_probs,
    top_of_pools,
)
from pairforge.stages.sample.stage import SampleConfig, run

from tests.stages.mining_helpers import copy_project
from tests.stages.sample.test_sample import _cfg, mined  # noqa: F401 (the fixture)

COS = np.array([0.5, 0.9, 0.7, 0.3, 0.8, 0.6, 0.95])
OFFSETS = np.array([0, 4, 4, 7])  # pools of 4, 0 and 3 candidates


def test_ranks_are_by_cosine_most_similar_first_within_each_pool():
    np.testing.assert_array_equal(pool_ranks(COS, OFFSETS), [2, 0, 1, 3, 1, 2, 0])
    ties = pool_ranks(np.array([0.5, 0.5, 0.7]), np.array([0, 3]))
    np.testing.assert_array_equal(ties, [1, 2, 0])  # ties: the earlier first


def test_rank_window_and_ceilings_keep_what_sentence_transformers_keeps():
    s_pos = np.array([0.9, 0.5, 0.85])
    window = select(COS, OFFSETS, s_pos, range_min=1, range_max=3)
    # pool 0 keeps ranks 1, 2 (0.7, 0.5); pool 2 keeps ranks 1, 2 (0.8, 0.6).
    np.testing.assert_array_equal(window.kept, [0, 2, 4, 5])
    np.testing.assert_array_equal(window.offsets, [0, 2, 2, 4])
    assert window.outside_window == 3 and window.above_ceiling == 0
    absolute = select(COS, OFFSETS, s_pos, absolute_margin=0.1)
    # keep cos <= s+ - 0.1: pool 0 <= 0.8 (0.5, 0.7, 0.3); pool 2 <= 0.75 (0.6).
    np.testing.assert_array_equal(absolute.kept, [0, 2, 3, 5])
    assert absolute.above_ceiling == 3
    relative = select(COS, OFFSETS, s_pos, relative_margin=0.05)
    # keep cos <= 0.95 s+: pool 0 <= 0.855 (0.5, 0.7, 0.3); pool 2 <= 0.8075 (0.8, 0.6).
    np.testing.assert_array_equal(relative.kept, [0, 2, 3, 4, 5])
    both = select(COS, OFFSETS, s_pos, range_max=2, relative_margin=0.05)
    # the window first (ranks 0, 1), then the ceiling of what is left; each counted once.
    np.testing.assert_array_equal(both.kept, [2, 4])
    assert both.outside_window == 3 and both.above_ceiling == 2
    off = select(COS, OFFSETS, s_pos)
    assert off.keep.all() and off.outside_window == off.above_ceiling == 0


def test_the_positive_score_is_the_best_positive_or_the_fixed_one():
    pos_cos = np.array([0.7, 0.92, 0.8])
    pos_offsets = np.array([0, 2, 2, 3])  # anchor 1 has no positive
    np.testing.assert_allclose(positive_scores(pos_cos, pos_offsets, "best", 1.0), [0.92, 1.0, 0.8])
    np.testing.assert_allclose(positive_scores(pos_cos, pos_offsets, "fixed", 0.9), [0.9] * 3)
    empty = positive_scores(np.empty(0), np.array([0, 0, 0]), "best", 0.95)
    np.testing.assert_allclose(empty, [0.95, 0.95])


def test_simans_weights_peak_at_the_shifted_positive_score():
    cos = np.array([0.2, 0.5, 0.6, 0.9, 0.4, 0.45])
    offsets = np.array([0, 4, 6])
    p = simans_probs(cos, offsets, np.array([0.8, 0.4]), a=10.0, b=-0.2)
    np.testing.assert_allclose([p[:4].sum(), p[4:].sum()], [1.0, 1.0])
    assert int(np.argmax(p[:4])) == 2  # 0.6 = 0.8 - 0.2
    w = np.exp(-10.0 * (cos[:4] - 0.6) ** 2)
    np.testing.assert_allclose(p[:4], w / w.sum())
    assert p[4] > p[5]  # 0.4 is nearer 0.2 than 0.45 is


def test_top_takes_the_most_similar_in_order_and_flags_short_pools():
    drawn = top_of_pools(COS, OFFSETS, 2)
    np.testing.assert_array_equal(drawn.indices, [1, 2, 6, 4])
    np.testing.assert_array_equal(drawn.offsets, [0, 2, 2, 4])
    np.testing.assert_array_equal(drawn.short, [False, True, False])


def test_the_stage_applies_the_rules_counts_their_removals_and_samples_top(
    mined,  # noqa: F811
    tmp_path,
):
    root = copy_project(mined, tmp_path / "a")
    # The candidates as an Apertium run's manifest records them (the card names the engine).
    manifest_path = root / "data/candidates/_manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["engine"] = {"engine": "apertium", "compute_type": "rules"}
    manifest_path.write_text(json.dumps(manifest))
    metrics = run(
        _cfg(root, relative_margin=0.3, positive_reference="fixed", positive_score=0.8,
             range_max=6, negative_sampler="top", m=2),
        progress=False,
    )  # fmt: skip
    pools = (
        open_dataset(root / "data/pools", S.POOLS)
        .read_table([S.ID, S.POOL_IDS, S.POOL_COS])
        .to_pylist()
    )
    pairs = {
        r[S.ID]: r for r in open_dataset(root / "data/pairs", S.PAIRS).read_table().to_pylist()
    }
    ceiling = 0.8 * (1 - 0.3)
    outside = above = 0
    for pool in pools:
        ranked = sorted(zip(pool[S.POOL_COS], pool[S.POOL_IDS], strict=True), key=lambda x: -x[0])
        window = ranked[:6]
        outside += len(ranked) - len(window)
        allowed = [(c, i) for c, i in window if c <= ceiling + 1e-7]
        above += len(window) - len(allowed)
        row = pairs[pool[S.ID]]
        # top: the two most similar of what the rules left, most similar first.
        assert row[S.NEGATIVE_IDS] == [i for _, i in allowed[:2]]
        assert all(c <= ceiling + 1e-6 for c in row["negative_cos"])
    counts = metrics["counts"]
    assert counts["negatives_outside_rank_window"] == outside > 0
    assert counts["negatives_above_positive_ceiling"] == above > 0
    assert metrics["params"]["negative_sampler"] == "top"
    card = (root / "data/pairs/README.md").read_text()
    assert "negatives_above_positive_ceiling" in card and f"{above:,}" in card
    assert "candidates (used, engine apertium)" in " ".join(card.split())
    assert (
        "Negatives drawn the most similar first (no randomness) from ranks 0 to 5 by cosine; "
        "cos <= s+ x (1 - 0.3), s+ = 0.8 (removals in the counts below)."
    ) in " ".join(card.split())


def _best_positive(root) -> dict[str, float]:
    """Each anchor's s+: the cosine of its most similar candidate that the sampler keeps (not
    identical, the first of its text), from the embeddings, by hand."""
    ids = open_dataset(root / "data/sentences", S.SENTENCES).read_table([S.ID])[S.ID]
    vectors = load_vectors(open_embeddings(root / "data/embeddings/sentences"), ids)
    row_of = {sid: i for i, sid in enumerate(ids.to_pylist())}
    cands = open_dataset(root / "data/candidates", S.CANDIDATES).read_table()
    cvec = load_vectors(open_embeddings(root / "data/embeddings/candidates"))
    best: dict[str, float] = {}
    seen = set()
    for i, c in enumerate(cands.to_pylist()):
        key = (c[S.ID], match_key(c[S.TEXT]))
        if c[S.IDENTICAL] or key in seen:
            continue
        seen.add(key)
        cos = float(vectors[row_of[c[S.ID]]] @ cvec[i])
        best[c[S.ID]] = max(best.get(c[S.ID], -1.0), cos)
    return best


def test_the_best_positive_sets_each_anchors_ceiling_and_simans_draws(mined, tmp_path):  # noqa: F811
    root = copy_project(mined, tmp_path / "b")
    metrics = run(
        _cfg(root, absolute_margin=0.2, negative_sampler="simans", simans_a=5.0, simans_b=-0.3),
        progress=False,
    )
    s_pos = _best_positive(root)
    pools = open_dataset(root / "data/pools", S.POOLS).read_table([S.ID, S.POOL_COS]).to_pylist()
    above = sum(sum(c > s_pos.get(p[S.ID], 1.0) - 0.2 + 1e-6 for c in p[S.POOL_COS]) for p in pools)
    near = sum(
        sum(abs(c - (s_pos.get(p[S.ID], 1.0) - 0.2)) <= 1e-6 for c in p[S.POOL_COS]) for p in pools
    )
    assert abs(metrics["counts"]["negatives_above_positive_ceiling"] - above) <= near
    assert above > 0
    for row in open_dataset(root / "data/pairs", S.PAIRS).read_table().to_pylist():
        for c in row["negative_cos"]:
            assert c <= s_pos.get(row[S.ID], 1.0) - 0.2 + 1e-5
    probs = pc.list_flatten(
        open_dataset(root / "data/pairs", S.PAIRS).read_table(["negative_prob"])["negative_prob"]
    ).to_numpy()
    assert np.all((probs > 0) & (probs <= 1))


def test_window_bounds_are_validated():
    with pytest.raises(ValueError, match="range_max \\(2\\) must exceed range_min \\(2\\)"):
        SampleConfig(range_min=2, range_max=2)
    with pytest.raises(ValueError):
        SampleConfig(relative_margin=1.0)
