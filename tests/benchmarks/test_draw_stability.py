"""benchmarks/draw_stability.py on a tiny mined folder: the moved embeddings stay a verified
dataset moved by what the level says, the comparison counts what changed, and the whole
benchmark (mine, sample with both draw schemes, compare) runs through the real CLI."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.errors import CorruptShardError
from pairforge.pipeline.plumbing.shards import open_dataset
from pairforge.pipeline.science.text import sentence_id

from tests.stages.mining_helpers import (
    candidate_rows,
    make_texts,
    write_anchor_embeddings,
    write_candidates,
    write_params,
    write_sentences,
)

SPEC = importlib.util.spec_from_file_location(
    "draw_stability", Path(__file__).resolve().parents[2] / "benchmarks/draw_stability.py"
)
stability = importlib.util.module_from_spec(SPEC)
sys.modules[SPEC.name] = stability
SPEC.loader.exec_module(stability)


def _vectors(root: Path, name: str) -> np.ndarray:
    table = open_dataset(root / "data/embeddings" / name, S.embeddings_spec(16)).read_table()
    return np.stack(table[S.VECTOR].to_numpy(zero_copy_only=False))


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A mined pipeline folder as ``quality.py --mine-only`` leaves one, small: 90 sentences in
    3 shards, their candidates, embeddings (candidates near their anchor), params on 1 thread."""
    root = tmp_path_factory.mktemp("mined")
    texts = make_texts(90, seed=3)
    write_sentences(root / "data/sentences", texts, rows_per_shard=30)
    ids = [sentence_id(t) for t in texts]
    write_candidates(root / "data/candidates", candidate_rows(ids, texts), rows_per_shard=200)
    write_anchor_embeddings(root, clusters=5, shard_rows=[30] * 3)
    write_params(
        root,
        {
            "mine": {"k": 16, "band_low": 0.1, "band_high": 0.8, "threads": 1},
            "sample": {"corpus_name": "test", "corpus_license": "CC0-1.0", "threads": 1},
        },
    )
    return root


def test_one_ulp_moves_that_fraction_and_the_shards_still_verify(folder, tmp_path):
    moved = tmp_path / "moved"
    stability.variant(folder, moved, moved=True)
    before = _vectors(moved, "sentences"), _vectors(moved, "candidates")
    count = stability.move_embeddings(moved, "ulp", 0.25)
    after = _vectors(moved, "sentences"), _vectors(moved, "candidates")
    total = sum(b.size for b in before)
    changed = sum(int((a != b).sum()) for a, b in zip(after, before, strict=True))
    assert changed == count
    assert 0.2 * total < count < 0.3 * total
    for a, b in zip(after, before, strict=True):
        hit = a != b
        up = np.nextafter(b[hit], np.float32(np.inf))
        down = np.nextafter(b[hit], np.float32(-np.inf))
        assert np.all((a[hit] == up) | (a[hit] == down))  # one ulp, either way
    # The source's embeddings were copied, not linked: they did not move.
    assert np.array_equal(_vectors(folder, "sentences"), before[0])
    # The manifest's checksums were rewritten: the moved shards verified as they were read
    # above, and the same rows in other bytes (another codec) do not.
    path = moved / "data/embeddings/sentences/data/part-00001.parquet"
    pq.write_table(pq.read_table(path), path, compression="none")
    with pytest.raises(CorruptShardError, match="is corrupt"):
        open_dataset(moved / "data/embeddings/sentences", S.embeddings_spec(16)).read_table()


def test_a_relative_error_moves_every_component_by_about_its_size(folder, tmp_path):
    moved = tmp_path / "moved"
    stability.variant(folder, moved, moved=True)
    before = _vectors(moved, "candidates")
    count = stability.move_embeddings(moved, "rel", 1e-3)
    after = _vectors(moved, "candidates")
    assert count == before.size + _vectors(moved, "sentences").size
    rel = (after.astype(np.float64) - before) / before
    assert 0.8e-3 < rel.std() < 1.2e-3


def _write(path: Path, columns: dict) -> None:
    (path / "data").mkdir(parents=True)
    pq.write_table(pa.table(columns), path / "data/part-00000.parquet")


def test_compare_counts_pools_changed_by_set_order_and_length(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    ids = ["x", "y", "z", "w"]
    pools_a = [["1", "2"], ["3", "4"], ["5"], ["6", "7"]]
    pools_b = [["1", "2"], ["4", "3"], ["5", "8"], ["6", "9"]]  # order; length; set
    pairs_a = {"id": ids, "negative_ids": [["1"], ["3"], ["5"], ["6"]],
               "positive_ids": [["p"], ["q"], ["r"], ["s"]]}  # fmt: skip
    pairs_b = {"id": ids, "negative_ids": [["1"], ["4"], ["5"], ["9"]],
               "positive_ids": [["p"], ["q"], ["r2"], ["s"]]}  # fmt: skip
    for root, pools, pairs in ((a, pools_a, pairs_a), (b, pools_b, pairs_b)):
        _write(root / "data/pools-knn", {"id": ids, "pool_ids": pools})
        for sampler in stability.SAMPLERS:
            for scheme in stability.SCHEMES:
                _write(root / f"data/pairs-knn-{sampler}-{scheme}", pairs)
    got = stability.compare(a, b, ["knn"])
    # z's pool grew by one (set and length), w's changed a member (set), y's only its order.
    assert got["pools-knn"] == {"anchors": 4, "set": 2, "order": 3, "length": 1}
    assert got["pairs-knn-uniform-keyed"] == {"rows": 4, "negatives": 2, "positives": 1}
    text = stability.table({"ulp0.1": {"components_moved": 1, **got}}, ["knn"])
    assert "| `knn` | pools changed (set / order / length) | | 2 / 3 / 1 |" in text
    assert "| `knn` | calibrated | stream | 2 / 1 |" in text


def test_the_benchmark_runs_end_to_end_and_keyed_uniform_draws_follow_the_pools(
    folder, tmp_path, monkeypatch, capsys
):
    """Through the real CLI: both schemes over the knn pools, unmoved against moved. A keyed
    uniform draw depends on its anchor's pool only: its rows change only where a pool did."""
    # A move that changes pools at 16 dimensions (the real levels are far smaller) and keeps the
    # norms within what `mine` accepts.
    monkeypatch.setitem(stability.LEVELS, "rel1e-5", ("rel", 0.005))
    out = tmp_path / "out"
    argv = ["draw_stability.py", "--folder", str(folder), "--out", str(out),
            "--levels", "rel1e-5", "--pools", "knn"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    stability.main()
    result = json.loads((out / "stability.json").read_text())["rel1e-5"]
    pools = result["pools-knn"]
    assert pools["anchors"] == 90
    assert 0 < pools["set"] < 90
    keyed = result["pairs-knn-uniform-keyed"]
    assert keyed["rows"] == 90
    assert keyed["negatives"] <= pools["set"]
    # The stream scheme's numbers shift along a batch after the first changed pool.
    assert result["pairs-knn-uniform-stream"]["negatives"] >= keyed["negatives"]
    assert "| `knn` | uniform | keyed |" in (out / "stability.md").read_text()
    assert not (out / "rel1e-5").exists()  # each moved variant removed after its comparison
    assert "load average" in capsys.readouterr().out
