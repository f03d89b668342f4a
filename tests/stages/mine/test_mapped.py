"""The corpus matrix memory-mapped from ``_work`` (issue 16, item 4): the same values as the
in-memory matrix, every full pass blockwise with the same results at any block size, and the
pages a pass touches leave the process's resident set."""

from __future__ import annotations

from pathlib import Path

import faiss
import numpy as np
import pyarrow as pa
import pytest
from pairforge.pipeline.plumbing.errors import DataIntegrityError
from pairforge.pipeline.science import mining_inputs
from pairforge.pipeline.science.mining_inputs import (
    MappedVectors,
    load_vectors,
    open_embeddings,
    spill_vectors,
    take_rows,
)
from pairforge.stages.mine import index as index_module
from pairforge.stages.mine import searcher as searcher_module
from pairforge.stages.mine.index import build_index, check_vectors, exact_knn, measure_recall
from pairforge.stages.mine.searcher import Searcher, band_sizes

from tests.stages.mining_helpers import clustered_vectors, resident_kib, unit_rows, write_embeddings


@pytest.fixture(scope="module")
def vectors() -> np.ndarray:
    return clustered_vectors(3, 20, 24, 3000)


def test_spilled_vectors_equal_the_loaded_ones_and_check_their_ids(tmp_path, vectors):
    ids = [f"s{i}" for i in range(len(vectors))]
    write_embeddings(tmp_path / "emb", ids, vectors, [700, 700, 700, 700, 200])
    emb = open_embeddings(tmp_path / "emb")
    mapped = spill_vectors(emb, pa.array(ids), tmp_path / "work")
    assert mapped.path == tmp_path / "work/vectors.f32"
    assert np.array_equal(mapped.array, load_vectors(emb, pa.array(ids)))  # renormalised alike
    assert mapped.array.shape == (3000, 24) and mapped.array.dtype == np.float32
    assert [p.name for p in (tmp_path / "work").iterdir()] == ["vectors.f32"]
    # A second process maps the same file; a file of the wrong size is refused.
    again = MappedVectors(mapped.path, 3000, 24)
    assert np.array_equal(again.array, mapped.array)
    with pytest.raises(DataIntegrityError, match="3001 x 24 float32 vectors"):
        MappedVectors(mapped.path, 3001, 24)
    # Embeddings that do not embed the ids in order: refused, no temporary file left.
    with pytest.raises(
        DataIntegrityError, match="row 0 has id 's0' where the embedded dataset has 's1'"
    ):
        spill_vectors(emb, pa.array([ids[1], ids[0], *ids[2:]]), tmp_path / "work2")
    assert list((tmp_path / "work2").iterdir()) == []


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads Linux's /proc/self/smaps")
def test_release_drops_the_touched_pages(tmp_path):
    n, d = 20_000, 64  # 4.9 MiB
    data = unit_rows(np.random.default_rng(0).standard_normal((n, d)))
    (tmp_path / "v.f32").write_bytes(data.tobytes())
    mapped = MappedVectors(tmp_path / "v.f32", n, d)
    path = (tmp_path / "v.f32").resolve()
    assert float(mapped.array.sum()) == pytest.approx(float(data.sum()), rel=1e-5)  # all touched
    assert resident_kib(path) > 4000
    mapped.release()
    assert resident_kib(path) < 100
    rows = np.random.default_rng(1).choice(n, 5000, replace=False)
    assert np.array_equal(take_rows(mapped.array, rows, mapped.release), data[rows])
    assert resident_kib(path) < 100  # released after each chunk, the last one included


@pytest.fixture(scope="module")
def one_pass(vectors) -> dict:
    """What the passes give with every block the whole matrix (as before blocks existed)."""
    queries = vectors[:50]
    ivf = build_index(vectors, kind="ivf", nlist=16, nprobe=4, seed=3)
    hnsw = build_index(vectors, kind="hnsw", hnsw_m=8, ef_construction=40, ef_search=40)
    return {
        "ivf": ivf.search(queries, 10)[1],
        "hnsw": hnsw.search(queries, 10)[1],
        "recall": measure_recall(vectors, ivf, k=10, sample_size=200),
    }


@pytest.mark.parametrize("block", [7, 1000, 65_536])
def test_block_passes_equal_one_pass(monkeypatch, vectors, one_pass, block):
    """Adding, checking, exact search, recall and band sizes: the same at any block size as in
    one pass, and ``release`` is called (once per block at least)."""
    monkeypatch.setattr(index_module, "BLOCK", block)
    monkeypatch.setattr(searcher_module, "BLOCK", block)
    monkeypatch.setattr(mining_inputs, "GATHER", 11)
    calls = []

    def release():
        calls.append(1)

    index = build_index(vectors, kind="ivf", nlist=16, nprobe=4, seed=3, release=release)
    assert len(calls) >= 2 * -(-len(vectors) // block)  # checked and added block by block
    queries = vectors[:50]
    assert np.array_equal(index.search(queries, 10)[1], one_pass["ivf"])
    hnsw = build_index(vectors, kind="hnsw", hnsw_m=8, ef_construction=40, ef_search=40)
    assert np.array_equal(hnsw.search(queries, 10)[1], one_pass["hnsw"])  # one add, one graph
    flat = build_index(vectors, kind="flat", release=release)
    assert faiss.rev_swig_ptr(flat.get_xb(), flat.ntotal * flat.d).tobytes() == vectors.tobytes()
    want = faiss.knn(queries, vectors, 10, metric=faiss.METRIC_INNER_PRODUCT)[1]
    assert np.array_equal(exact_knn(queries, vectors, 10, release), want)
    assert (
        measure_recall(vectors, index, k=10, sample_size=200, release=release)
        == (one_pass["recall"])
    )
    rows = np.array([0, 5, 6, 999, 2999])
    cos = vectors[rows] @ vectors.T
    cos[np.arange(len(rows)), rows] = np.nan
    want_band = ((cos >= 0.25) & (cos <= 0.75)).sum(axis=1)
    assert band_sizes(vectors, rows, 0.25, 0.75, release=release).tolist() == want_band.tolist()
    before = len(calls)
    picked = np.random.default_rng(2).choice(len(vectors), 100, replace=False)
    assert np.array_equal(take_rows(vectors, picked, release), vectors[picked])
    assert len(calls) - before == -(-100 // 11)  # a release after every chunk of GATHER rows


def test_blockwise_checks_name_the_first_bad_row_and_count_them_all(monkeypatch, vectors):
    monkeypatch.setattr(index_module, "BLOCK", 100)
    bad = vectors.copy()
    bad[[250, 2500], 3] = np.inf
    with pytest.raises(ValueError, match=r"in 2 of 3000 rows \(first: row 250\)"):
        check_vectors(bad)
    loose = vectors.copy()
    loose[1234] *= 1.5
    with pytest.raises(ValueError, match="not L2-normalised: row 1234 has norm 1.5"):
        check_vectors(loose)


def test_rescoring_in_chunks_equals_one_chunk(monkeypatch, vectors):
    index = build_index(vectors, kind="ivf", nlist=16, nprobe=4, ivf_codec="sq8", seed=3)
    rows = np.arange(0, 3000, 3)
    whole = Searcher(index, vectors, 12, 8192, rescore=True).neighbours(rows)
    monkeypatch.setattr(searcher_module, "RESCORE_CHUNK", 7)
    calls = []
    chunked = Searcher(index, vectors, 12, 8192, True, lambda: calls.append(1)).neighbours(rows)
    assert np.array_equal(whole[0], chunked[0]) and np.array_equal(whole[1], chunked[1])
    assert len(calls) == 1 + -(-len(rows) // 7)  # the queries' gather, then every chunk
    exact = np.einsum("ij,ikj->ik", vectors[rows], vectors[whole[1]])
    assert np.allclose(whole[0], exact, atol=1e-6)
