"""mine at a million vectors in bounded memory (issue 16, item 4): the IVF lists written to disk as
they are added and searched mapped, the IVF trained without faiss's copies of the sample
(``stages/mine/ondisk.py``), and the corpus rows read with positioned reads
(``MappedVectors.take``). Each must give what the in-memory way gives, bit for bit; the reads
leave no mapped page resident."""

from __future__ import annotations

from pathlib import Path

import faiss
import numpy as np
import pytest
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.shards import open_dataset
from pairforge.pipeline.science import mining_inputs
from pairforge.pipeline.science.mining_inputs import MappedVectors, RowsRead
from pairforge.stages.mine import index as index_module
from pairforge.stages.mine import ondisk
from pairforge.stages.mine import searcher as searcher_module
from pairforge.stages.mine import shard as shard_module
from pairforge.stages.mine import stage as stage_module
from pairforge.stages.mine.index import build_index, measure_recall, search
from pairforge.stages.mine.searcher import Searcher, band_sizes
from pairforge.stages.mine.stage import run

from tests.stages.mine.helpers import mine_cfg
from tests.stages.mining_helpers import clustered_vectors, resident_kib, unit_rows

smaps = pytest.mark.skipif(
    not Path("/proc/self/smaps").exists(), reason="reads Linux's /proc/self/smaps"
)


@pytest.fixture(scope="module")
def vectors() -> np.ndarray:
    return clustered_vectors(5, 30, 32, 6000)


@pytest.fixture()
def mapped(tmp_path, vectors) -> MappedVectors:
    (tmp_path / "v.f32").write_bytes(vectors.tobytes())
    return MappedVectors(tmp_path / "v.f32", *vectors.shape)


# --- positioned reads -------------------------------------------------------------------------


@pytest.mark.parametrize(("gap", "span"), [(16, 8192), (0, 1), (3, 5)])
def test_take_equals_the_mapped_gather(monkeypatch, mapped, vectors, gap, span):
    """Sorted, shuffled, repeated, contiguous, single and no rows: ``array[rows]`` exactly,
    whatever the reads' coalescing (``READ_GAP``) and length (``READ_SPAN``)."""
    monkeypatch.setattr(mining_inputs, "READ_GAP", gap)
    monkeypatch.setattr(mining_inputs, "READ_SPAN", span)
    rng = np.random.default_rng(0)
    for rows in (
        np.sort(rng.choice(6000, 900, replace=False)),
        rng.integers(0, 6000, 500),  # unsorted, with repeats
        np.arange(1000, 3100),
        np.array([5999, 0, 5999, 17]),
        np.array([42]),
        np.array([], dtype=np.int64),
    ):
        got = mapped.take(rows)
        assert got.dtype == np.float32 and got.flags.c_contiguous
        assert np.array_equal(got, vectors[rows])
    with pytest.raises(IndexError, match="out of range"):
        mapped.take(np.array([3, 6000]))


@smaps
def test_take_maps_no_page(mapped, vectors):
    """Gathers, single rows (``RowsRead``: the random fill's cosines) and the band sizes'
    queries read with ``take``: the same values, no page of the mapping resident."""
    mapped.release()
    rows = np.random.default_rng(1).choice(6000, 3000, replace=False)
    mapped.take(rows)
    one = RowsRead(mapped.take, mapped.array.shape)
    assert one.shape == (6000, 32) and one.ndim == 2 and len(one) == 6000
    for i in (0, 17, 5999):
        assert np.array_equal(one[i], vectors[i])
        assert np.float32(one[i] @ one[5]) == np.float32(vectors[i] @ vectors[5])
    picked = rows[:40]
    assert np.array_equal(
        band_sizes(vectors, picked, 0.2, 0.7),
        band_sizes(mapped.array, picked, 0.2, 0.7, release=mapped.release, take=mapped.take),
    )
    assert resident_kib(mapped.path) == 0
    mapped.array[rows].sum()  # the mapped gather, for contrast
    assert resident_kib(mapped.path) > 0


@pytest.mark.parametrize("part", [32_768, 13])
def test_rescoring_from_positioned_reads_equals_the_mapped_one(monkeypatch, mapped, vectors, part):
    """An sq8 IVF index's neighbours rescored from rows read by ``take`` (distinct ids in parts
    of ``RESCORE_ROWS``): the same scores and order, bit for bit, as from the matrix itself;
    padded slots (-1) stay -inf."""
    index = build_index(vectors, kind="ivf", nlist=24, nprobe=1, ivf_codec="sq8", seed=2)
    rows = np.arange(0, 6000, 7)
    plain = Searcher(index, vectors, 400, 8192, rescore=True)
    monkeypatch.setattr(searcher_module, "RESCORE_ROWS", part)
    read = Searcher(index, mapped.array, 400, 8192, True, mapped.release, mapped.take)
    for k in (12, 400):  # 400 > a cell: rows padded with -1
        want, got = plain.neighbours(rows, k), read.neighbours(rows, k)
        assert np.array_equal(want[1], got[1])
        assert want[0].tobytes() == got[0].tobytes()
    assert (got[1] == -1).any() and np.isneginf(got[0][got[1] == -1]).all()


# --- the IVF lists on disk --------------------------------------------------------------------


def _empty_ivf(d: int, nlist: int, codec: str) -> faiss.Index:
    quantizer = faiss.IndexFlatIP(d)
    if codec != "flat":
        qt = getattr(faiss.ScalarQuantizer, index_module.SQ_TYPES[codec])
        index = faiss.IndexIVFScalarQuantizer(quantizer, d, nlist, qt, faiss.METRIC_INNER_PRODUCT)
    else:
        index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
    index.own_fields = True
    quantizer.this.disown()
    index.cp.seed, index.cp.niter = 3, 4
    return index


@pytest.mark.parametrize(
    ("n", "d", "codec"),
    [
        (3000, 32, "sq8"),
        (130_011, 8, "sq8"),
        (3000, 32, "sq6"),
        (3000, 32, "sq4"),
        (130_011, 8, "sq4"),
        (3000, 32, "flat"),
    ],
    ids=["all-rows", "faiss-subsamples-100k", "6-bit", "4-bit", "4-bit-subsamples", "flat-codec"],
)
def test_training_in_less_memory_equals_faiss_train(n, d, codec):
    """``train_ivf``: the trained index serialises to the bytes of ``index.train`` (centroids,
    the 8-, 6- or 4-bit quantizer's ranges), also past the 100,000 rows faiss trains the quantizer
    on."""
    x = unit_rows(np.random.default_rng(n).standard_normal((n, d)))
    want, got = _empty_ivf(d, 24, codec), _empty_ivf(d, 24, codec)
    want.train(x)
    ondisk.train_ivf(got, x)
    assert got.is_trained
    assert faiss.serialize_index(got).tobytes() == faiss.serialize_index(want).tobytes()


@pytest.mark.parametrize("codec", ["sq8", "sq4", "flat"])
@pytest.mark.parametrize("block", [7, 1000, 65_536])
def test_index_written_as_built_equals_faiss_write_index(
    monkeypatch, tmp_path, vectors, codec, block
):
    """``build_index(on_disk=...)`` writes the bytes that ``faiss.write_index`` writes for the
    index built in memory (blocks of any size), and the index it returns maps that file."""
    monkeypatch.setattr(index_module, "BLOCK", block)
    monkeypatch.setattr(ondisk, "BLOCK", block)
    settings = dict(kind="ivf", nlist=40, nprobe=5, ivf_codec=codec, seed=4, use_gpu=False)
    faiss.write_index(build_index(vectors, **settings), str(tmp_path / "memory.faiss"))
    index = build_index(vectors, **settings, on_disk=tmp_path / "disk.faiss")
    assert (tmp_path / "disk.faiss").read_bytes() == (tmp_path / "memory.faiss").read_bytes()
    assert ondisk.is_mapped(index) and index.ntotal == len(vectors)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["disk.faiss", "memory.faiss"]


def test_index_with_few_lists_used_is_written_as_faiss_writes_it(tmp_path, vectors):
    """Fewer than half the lists hold vectors: faiss writes the sizes as (list, size) pairs."""
    trained = build_index(vectors, kind="ivf", nlist=40, nprobe=5, ivf_codec="sq8", seed=4)
    some = np.ascontiguousarray(vectors[:9])
    empty = faiss.clone_index(trained)
    empty.reset()
    ondisk.write_ivf(faiss.clone_index(empty), some, tmp_path / "disk.faiss")
    empty.add(some)
    faiss.write_index(empty, str(tmp_path / "memory.faiss"))
    assert (tmp_path / "disk.faiss").read_bytes() == (tmp_path / "memory.faiss").read_bytes()


def test_mapped_index_finds_what_the_in_memory_one_finds(tmp_path, vectors):
    """The index searched with its lists mapped from the file: the same ids and the same scores
    as the index held in memory (search batches of several sizes, k past a cell's size, the
    recall check)."""
    settings = dict(kind="ivf", nlist=40, nprobe=5, ivf_codec="sq8", seed=4, use_gpu=False)
    memory = build_index(vectors, **settings)
    mapped = build_index(vectors, **settings, on_disk=tmp_path / "disk.faiss")
    assert not ondisk.is_mapped(memory)
    queries = vectors[::5]
    for k, batch in ((10, 8192), (10, 100), (500, 333)):
        want = search(memory, queries, k, batch)
        got = search(mapped, queries, k, batch)
        assert np.array_equal(want[1], got[1]) and want[0].tobytes() == got[0].tobytes()
    assert measure_recall(vectors, mapped, k=10, sample_size=300) == measure_recall(
        vectors, memory, k=10, sample_size=300
    )


def test_stage_pools_equal_those_of_the_in_memory_index(monkeypatch, project, tmp_path):  # noqa: F811
    """The mine stage (IVF sq8, rescored from positioned reads, lists mapped) writes the pools
    it wrote with the index and the vectors in memory: the same shard bytes; and a run that
    finds the saved index in ``_work`` (a resumed run) maps it and writes them again."""
    cfg = dict(index="ivf", ivf_codec="sq8", nlist=8, nprobe=3, k=12, anchor_batch=50)
    run(mine_cfg(project, **cfg), progress=False)
    mapped = _shard_bytes(project)

    def in_memory(vectors, kind, **kw):
        kw.pop("on_disk")
        kw.pop("take")
        return build_index(vectors, kind, **kw)

    with monkeypatch.context() as m:
        m.setattr(searcher_module, "build_index", in_memory)
        m.setattr(searcher_module, "Searcher", _plain_searcher)
        (project / "data/pools").rename(tmp_path / "pools-mapped")
        run(mine_cfg(project, **cfg), progress=False)
    assert _shard_bytes(project) == mapped
    # A run that stops after its first shard, resumed: the index it saved in _work is mapped,
    # not rebuilt, and the pools are the same.
    (project / "data/pools").rename(tmp_path / "pools-memory")
    call = stage_module.MineShard.__call__

    def stop_at_second(self, anchors, i):
        if i == 1:
            raise RuntimeError("stopped")
        return call(self, anchors, i)

    with monkeypatch.context() as m:
        m.setattr(stage_module.MineShard, "__call__", stop_at_second)
        with pytest.raises(RuntimeError, match="stopped"):
            run(mine_cfg(project, **cfg), progress=False)
    assert (project / "data/pools/_work/index.faiss").exists()
    metrics = run(mine_cfg(project, **cfg), progress=False)
    assert metrics["index"]["loaded_from_work"] is True
    assert metrics["computed_shards"] == 5
    assert _shard_bytes(project) == mapped


def _plain_searcher(index, vectors, k, batch, rescore, release, take):
    """The searcher as it was: queries and rescoring from the (mapped) matrix itself."""
    return Searcher(index, vectors, k, batch, rescore, release)


def _shard_bytes(root: Path) -> list[bytes]:
    pools = open_dataset(root / "data/pools", S.POOLS)
    assert pools.num_rows == 240
    return [pools.shard_path(i).read_bytes() for i in range(len(pools))]


def test_pool_rules_in_parts_write_the_same_bytes(monkeypatch, project, tmp_path):  # noqa: F811
    """The pool rules ``RULE_BATCH`` anchors at a time within an anchor batch (random fills
    included: ``min_pool`` past every pool): the same shard bytes and the same counts."""
    cfg = dict(k=16, pool_cap=None, min_pool=30, anchor_batch=40, fallback="random")
    whole = run(mine_cfg(project, **cfg), progress=False)
    want = _shard_bytes(project)
    monkeypatch.setattr(shard_module, "RULE_BATCH", 7)
    parts = run(mine_cfg(project, **cfg, output=str(tmp_path / "pools")), progress=False)
    got = [p.read_bytes() for p in sorted((tmp_path / "pools/data").iterdir())]
    assert got == want
    assert whole["random_candidates"] > 0
    for key in ("pool_size", "excluded", "random_candidates", "short_before_fallback"):
        assert parts[key] == whole[key]
