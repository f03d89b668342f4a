"""mine's torch search (stages/mine/torch_search.py), the GPU path without faiss-gpu, run here on
the CPU: the neighbours of faiss's exact index, blocks merged right, the same pools through the
whole stage, and the engine chosen as configured."""

from __future__ import annotations

import faiss
import numpy as np
import pytest
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.errors import ConfigError
from pairforge.pipeline.plumbing.shards import open_dataset
from pairforge.stages.mine import torch_search
from pairforge.stages.mine.searcher import search_engine
from pairforge.stages.mine.stage import MineConfig, run
from pairforge.stages.mine.torch_search import TorchFlatIndex

from tests.stages.mine.helpers import mine_cfg
from tests.stages.mining_helpers import unit


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        # The path users without faiss-gpu get on a GPU (TF32 off while searching).
        pytest.param(
            "cuda",
            marks=[pytest.mark.gpu, pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")],
        ),
    ],
)
def test_neighbours_are_faiss_flat_ones(monkeypatch, device):
    rng = np.random.default_rng(1)
    vectors = unit(rng.standard_normal((3000, 32))).astype(np.float32)
    queries = vectors[rng.choice(3000, 200, replace=False)]
    flat = faiss.IndexFlatIP(32)
    flat.add(vectors)
    want_s, want_i = flat.search(queries, 20)
    # Small score blocks: the running top-k is merged across many corpus blocks.
    monkeypatch.setattr(torch_search, "SCORE_BYTES", 4 * 200 * 257)
    index = TorchFlatIndex(vectors, device=device)
    got_s, got_i = index.search(queries, 20)
    assert index.on_gpu == (device == "cuda")
    assert got_i.dtype == np.int64 and got_s.dtype == np.float32
    np.testing.assert_array_equal(got_i, want_i)
    np.testing.assert_allclose(got_s, want_s, atol=1e-5)
    assert (got_s[:, :-1] >= got_s[:, 1:]).all()  # best first


def test_more_neighbours_than_vectors_are_padded():
    vectors = unit(np.random.default_rng(2).standard_normal((5, 8))).astype(np.float32)
    scores, ids = TorchFlatIndex(vectors).search(vectors[:2], 8)
    assert ids.shape == (2, 8) and (ids[:, 5:] == -1).all() and np.isneginf(scores[:, 5:]).all()
    assert sorted(ids[0, :5]) == [0, 1, 2, 3, 4] and ids[0, 0] == 0  # itself first


def test_the_stage_writes_faiss_pools_with_torch(project, tmp_path):
    run(mine_cfg(project, k=16, min_pool=4, pool_cap=64, search_engine="faiss"), progress=False)
    with_faiss = open_dataset(project / "data/pools", S.POOLS).read_table()
    other = tmp_path / "pools-torch"
    torch_cfg = mine_cfg(project, k=16, min_pool=4, pool_cap=64, search_engine="torch",
                     use_gpu="no", output=str(other))  # fmt: skip
    metrics = run(torch_cfg, progress=False)
    assert metrics["index"]["engine"] == "torch" and metrics["index"]["gpu"] is False
    with_torch = open_dataset(other, S.POOLS).read_table()
    assert with_torch.column_names == with_faiss.column_names
    for name in with_faiss.column_names:
        a, b = with_faiss[name].to_pylist(), with_torch[name].to_pylist()
        if name == S.POOL_COS:
            for x, y in zip(a, b, strict=True):
                np.testing.assert_allclose(np.asarray(x, float), np.asarray(y, float), atol=1e-5)
        else:
            assert a == b, name


def test_the_engine_is_chosen_as_configured(monkeypatch, tmp_path):
    import pairforge.stages.mine.searcher as searcher

    monkeypatch.setattr(searcher, "NVIDIA_DEVICE", tmp_path / "no-nvidiactl")  # no GPU
    base = MineConfig(sentences="s", embeddings="e", output="o")
    assert search_engine(base) == "faiss"
    forced = base.model_copy(update={"search_engine": "torch"})
    assert search_engine(forced) == "torch"
    # A GPU torch sees but faiss cannot use: auto takes torch.
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(searcher, "gpu_available", lambda: False)
    (tmp_path / "nvidiactl").touch()
    monkeypatch.setattr(searcher, "NVIDIA_DEVICE", tmp_path / "nvidiactl")
    assert search_engine(base) == "torch"
    no_gpu = base.model_copy(update={"use_gpu": "no"})
    assert search_engine(no_gpu) == "faiss"
    assert torch_search.torch_device("auto") == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert torch_search.torch_device("yes") is None and torch_search.torch_device("auto") == "cpu"


def test_torch_with_an_approximate_index_or_a_missing_gpu_is_one_line(project, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="mine.index: 'ivf' is a faiss index"):
        run(mine_cfg(project, search_engine="torch", index="ivf"), progress=False)
    with pytest.raises(ConfigError, match="use_gpu: 'yes', but torch sees no GPU"):
        run(mine_cfg(project, search_engine="torch", use_gpu="yes"), progress=False)
