"""What a ``mine`` run reports: pool sizes, band coverage (how much of each anchor's cosine band
the search reached, on a seeded sample), short pools and fallbacks, exclusions by reason, and the
index's facts; read from the finished pools and their manifest, so a rerun that finds them
finished reports the same."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow.compute as pc
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.shards import Dataset, open_dataset
from pairforge.pipeline.science.pools import EXCLUSION_REASONS

if TYPE_CHECKING:
    from pairforge.stages.mine.searcher import Searcher
    from pairforge.stages.mine.stage import MineConfig

log = logging.getLogger("pairforge")


@dataclass
class SearchFacts:
    """What this run's search learnt, for the manifest and the metrics: the index (kind, build
    time, recall), the band-coverage sample, what each source of own augmentations held, and the
    seconds the shards' searches took. Empty when the pools were already finished."""

    index: dict[str, Any] = field(default_factory=dict)
    coverage_sample: dict[str, Any] = field(default_factory=dict)
    augmentations: dict[str, Any] = field(default_factory=dict)
    rewrites: dict[str, Any] = field(default_factory=dict)
    search_seconds: float = 0.0


def size_stats(sizes: np.ndarray) -> dict[str, Any]:
    if not sizes.size:
        return {"mean": None}
    q = np.percentile(sizes, [10, 50, 90])
    return {
        "mean": round(float(sizes.mean()), 3),
        "p10": float(q[0]),
        "p50": float(q[1]),
        "p90": float(q[2]),
        "max": int(sizes.max()),
        "empty": int((sizes == 0).sum()),
    }


def band_coverage(searcher: Searcher, cfg: MineConfig) -> dict[str, Any]:
    """How much of the band the search reaches, on a seeded sample of ``recall_sample`` anchors:
    the exact band size (brute force, every other sentence with a cosine in the band) against
    the in-band neighbours that the grown search returns. An approximate index's misses count
    against the coverage too."""
    from pairforge.stages.mine.searcher import band_sizes

    n = len(searcher.vectors)
    rng = np.random.default_rng(cfg.seed)
    rows = np.sort(rng.choice(n, size=min(cfg.recall_sample, n), replace=False))
    band = band_sizes(  # (s,)
        searcher.vectors,
        rows,
        cfg.band_low,
        cfg.band_high,
        release=searcher.release,
        take=searcher.take,
    )
    cap = None if cfg.pool_cap is None else cfg.pool_cap + 1
    found = searcher.band_neighbours(rows, cfg.band_low, cap)
    in_band = (found.ids >= 0) & (found.ids != rows[:, None])
    in_band &= (found.scores >= np.float32(cfg.band_low)) & (
        found.scores <= np.float32(cfg.band_high)
    )
    return {"rows": rows, "band": band, "retrieved": in_band.sum(axis=1)}


def coverage_metrics(
    cfg: MineConfig, totals: dict[str, int], sizes: np.ndarray, sample: dict[str, Any]
) -> dict[str, Any]:
    """The ``band_coverage`` metrics: the cap, the share of anchors it stopped, and (from the
    coverage sample, when this run searched) band size, in-band neighbours reached and pool size.
    ``coverage`` = in-band neighbours reached / band size, pooled over the sample."""
    anchors = max(1, int(sizes.size))
    out: dict[str, Any] = {
        "k": cfg.k,
        "pool_cap": cfg.pool_cap,
        "capped": totals.get("capped", 0),
        "capped_share": round(totals.get("capped", 0) / anchors, 4),
        "mean_band_retrieved": round(totals.get("band_retrieved", 0) / anchors, 3),
        "mean_pool": round(float(sizes.mean()), 3) if sizes.size else None,
    }
    if sample:
        band, got = sample["band"], sample["retrieved"]
        rows = sample["rows"]
        pool = sizes[rows] if rows.size and sizes.size > rows.max() else None
        out.update(
            sample=int(band.size),
            mean_band_size=round(float(band.mean()), 3),
            mean_band_reached=round(float(got.mean()), 3),
            coverage=round(float(got.sum() / band.sum()), 4) if band.sum() else 1.0,
            pool_over_band=round(float(pool.sum() / band.sum()), 4)
            if pool is not None and band.sum()
            else None,
        )
    return out


def stage_metrics(
    cfg: MineConfig,
    manifest: dict[str, Any],
    facts: SearchFacts,
    *,
    computed: int,
    shards: int,
) -> dict[str, Any]:
    """The stage's metrics but ``seconds`` (added last by ``run``), from the finished pools and
    their manifest (so a rerun that finds them finished reports the same) and this run's index
    facts."""
    coverage_sample = {
        k: np.asarray(v, dtype=np.int64) for k, v in manifest.get("band_sample", {}).items()
    }
    totals: dict[str, int] = {}
    for shard in manifest["shards"]:
        for key, value in shard["counts"].items():
            totals[key] = totals.get(key, 0) + value
    pools = open_dataset(cfg.output, S.POOLS)
    sizes = pool_sizes(pools)
    return {
        "anchors": pools.num_rows,
        "index": facts.index or manifest.get("index", {}),
        "k": cfg.k,
        "pool_cap": cfg.pool_cap,
        "band_coverage": coverage_metrics(cfg, totals, sizes, coverage_sample),
        "band": [cfg.band_low, cfg.band_high],
        "fallback": cfg.fallback,
        "min_pool": cfg.min_pool,
        "pool_size": size_stats(sizes),
        "candidates_in_pools": totals.get("candidates", 0),
        "random_candidates": totals.get("random_candidates", 0),
        "short_before_fallback": totals.get("was_short", 0),
        "short_after_fallback": totals.get("short", 0),
        "fallback_used": {f: totals.get(f"fallback_{f}", 0) for f in ("widen", "random")},
        "excluded": {r: totals.get(f"excluded_{r}", 0) for r in EXCLUSION_REASONS},
        "augmentations": manifest.get("augmentations", {}),
        "rewrites": manifest.get("rewrites", {}),
        "computed_shards": computed,
        "shards": shards,
        "pool_seconds": round(facts.search_seconds, 3),
    }


def pool_sizes(pools: Dataset) -> np.ndarray:
    """Every anchor's pool size, in row order: ``(anchors,)`` int64."""
    return np.concatenate(
        [
            pc.list_value_length(t[S.POOL_ROWS]).to_numpy(zero_copy_only=False)
            for t in pools.iter_shards([S.POOL_ROWS])
        ]
        or [np.empty(0, np.int64)]
    )


def log_summary(cfg: MineConfig, metrics: dict[str, Any]) -> None:
    """Log the band coverage and the pool sizes of ``metrics``, two lines."""
    st = metrics["pool_size"]
    cov = metrics["band_coverage"]
    log.info(
        "mine: band coverage %s (retrieved in band / band, sample of %s anchors), %s of anchors "
        "capped at %s neighbours",
        cov.get("coverage"),
        cov.get("sample"),
        cov.get("capped_share"),
        cfg.pool_cap or cfg.k,
    )
    log.info(
        "mine: %d anchors, pool size mean %s (p10 %s), %d short before fallback, %d after (%s)",
        metrics["anchors"],
        st.get("mean"),
        st.get("p10"),
        metrics["short_before_fallback"],
        metrics["short_after_fallback"],
        cfg.fallback,
    )
