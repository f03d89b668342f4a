"""FAISS index: exact search against numpy, approximate recall, batching, input validation."""

from __future__ import annotations

import faiss
import numpy as np
import pytest
from pairforge.stages.mine.index import (
    build_index,
    check_vectors,
    gpu_available,
    measure_recall,
    recall_at_k,
    search,
)


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def random_vectors() -> np.ndarray:
    return _unit(np.random.default_rng(0).standard_normal((2000, 32)))


@pytest.fixture(scope="module")
def clustered_vectors() -> np.ndarray:
    rng = np.random.default_rng(1)
    centers = rng.standard_normal((50, 32)) * 3
    labels = rng.integers(0, 50, 20_000)
    return _unit(centers[labels] + rng.standard_normal((20_000, 32)))


def test_flat_equals_numpy_brute_force(random_vectors):
    x = random_vectors
    queries = x[:300]
    k = 10
    scores, ids = search(build_index(x, kind="flat"), queries, k)
    sims = queries.astype(np.float64) @ x.T.astype(np.float64)  # (300, 2000)
    want_ids = np.argsort(-sims, axis=1)[:, :k]
    want_scores = np.take_along_axis(sims, want_ids, axis=1)
    # The test only makes sense if the top-k scores are distinct: check the margin to the next one.
    assert np.diff(np.sort(sims, axis=1)[:, -k - 1 :], axis=1).min() > 1e-6
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(scores, want_scores, atol=1e-5)
    assert scores.dtype == np.float32 and ids.dtype == np.int64
    assert np.all(ids[:, 0] == np.arange(300))  # every vector is its own nearest neighbour


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_batching_gives_the_same_results(random_vectors, kind):
    index = build_index(random_vectors, kind=kind, nlist=16, nprobe=4)
    one = search(index, random_vectors[:500], 7, batch_size=10_000)
    many = search(index, random_vectors[:500], 7, batch_size=33)
    np.testing.assert_array_equal(one[1], many[1])
    np.testing.assert_array_equal(one[0], many[0])


@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_approximate_recall_on_clustered_data(clustered_vectors, kind):
    index = build_index(clustered_vectors, kind=kind, seed=0)
    recall = measure_recall(clustered_vectors, index, k=10, sample_size=500, seed=0)
    assert recall >= 0.9, f"{kind} recall@10 = {recall:.3f}"


def test_recall_detects_a_poor_index(clustered_vectors):
    # One probed cell out of 256: many true neighbours live in other cells, so recall must drop.
    index = build_index(clustered_vectors, kind="ivf", nlist=256, nprobe=1, seed=0)
    assert measure_recall(clustered_vectors, index, k=50, sample_size=300) < 0.9


def test_flat_recall_is_one(random_vectors):
    assert measure_recall(random_vectors, build_index(random_vectors), k=5, sample_size=100) == 1.0


def test_ivf_is_seeded(clustered_vectors):
    a = build_index(clustered_vectors, kind="ivf", nlist=64, nprobe=2, seed=7)
    b = build_index(clustered_vectors, kind="ivf", nlist=64, nprobe=2, seed=7)
    np.testing.assert_array_equal(
        search(a, clustered_vectors[:200], 5)[1], search(b, clustered_vectors[:200], 5)[1]
    )


def test_auto_kind_switches_on_size(random_vectors):
    assert isinstance(build_index(random_vectors), faiss.IndexFlatIP)
    ivf = build_index(random_vectors, flat_max=1000)
    assert isinstance(ivf, faiss.IndexIVFFlat)
    assert ivf.nlist == 51  # 4 sqrt(2000) = 179 capped at 2000 // 39 = 51 cells
    assert ivf.nprobe == 8


def test_recall_at_k_by_hand():
    assert recall_at_k(np.array([[1, 2, 3]]), np.array([[1, 2, 4]])) == pytest.approx(2 / 3)
    assert recall_at_k(np.array([[5, 6], [1, 2]]), np.array([[6, 5], [3, 4]])) == 0.5
    assert recall_at_k(np.array([[1, -1]]), np.array([[1, -1]])) == 1.0


def test_k_beyond_the_index_pads_with_minus_one(random_vectors):
    index = build_index(random_vectors[:3])
    scores, ids = search(index, random_vectors[:1], 5)
    assert ids[0, 3:].tolist() == [-1, -1]
    assert np.all(np.isneginf(scores[0, 3:]))


def test_bad_vectors_raise_clear_errors(random_vectors):
    bad = random_vectors.copy()
    bad[17, 3] = np.nan
    with pytest.raises(
        ValueError, match=r"NaN or infinite values in 1 of 2000 rows \(first: row 17\)"
    ):
        build_index(bad)
    with pytest.raises(TypeError, match="float32"):
        build_index(random_vectors.astype(np.float64))
    with pytest.raises(ValueError, match="2-D"):
        check_vectors(random_vectors[0])
    with pytest.raises(ValueError, match="empty"):
        check_vectors(np.zeros((0, 8), dtype=np.float32))
    with pytest.raises(ValueError, match="not L2-normalised: row 0"):
        build_index(random_vectors * 2)
    with pytest.raises(ValueError, match="kind"):
        build_index(random_vectors, kind="lsh")


def test_dimension_mismatch(random_vectors):
    index = build_index(random_vectors)
    with pytest.raises(
        ValueError, match="dimension mismatch: queries have d=16 but the index has d=32"
    ):
        search(index, _unit(np.ones((2, 16), dtype=np.float32)), 3)
    with pytest.raises(ValueError, match="index holds 2000 vectors but 100 were given"):
        measure_recall(random_vectors[:100], index)


@pytest.mark.skipif(gpu_available(), reason="checks the no-GPU error")
def test_use_gpu_true_without_gpu(random_vectors):
    with pytest.raises(RuntimeError, match="no GPU support or no GPU is visible"):
        build_index(random_vectors, use_gpu=True)
    # "auto" falls back to CPU.
    assert isinstance(build_index(random_vectors, use_gpu="auto"), faiss.IndexFlatIP)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs faiss with GPU support and a GPU")
def test_gpu_flat_matches_cpu(random_vectors):
    cpu = search(build_index(random_vectors, use_gpu=False), random_vectors[:100], 5)
    gpu = search(build_index(random_vectors, use_gpu=True), random_vectors[:100], 5)
    np.testing.assert_array_equal(cpu[1], gpu[1])
