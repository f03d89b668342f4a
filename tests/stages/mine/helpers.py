"""The mine tests' helpers: clustered unit vectors, the sentence ids and a config over a copied
mining project (its fixture, ``project``, is in this folder's conftest)."""

from __future__ import annotations

import numpy as np
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.shards import open_dataset
from pairforge.stages.mine.stage import MineConfig

from tests.stages.mining_helpers import unit


def vectors(n: int, d: int = 16, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((6, d))
    return unit(centres[rng.integers(0, 6, n)] + 0.9 * rng.standard_normal((n, d)))


def sentence_ids(root) -> list[str]:
    return open_dataset(root / "data/sentences", S.SENTENCES).read_table([S.ID])[S.ID].to_pylist()


def mine_cfg(root, **kw) -> MineConfig:
    base = dict(
        sentences=str(root / "data/sentences"),
        embeddings=str(root / "data/embeddings/sentences"),
        candidates=str(root / "data/candidates"),
        rewrites=str(root / "data/rewrites"),
        output=str(root / "data/pools"),
        metrics=str(root / "metrics/mine.json"),
    )
    return MineConfig(**{**base, **kw})
