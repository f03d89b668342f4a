"""The ``mine`` stage's pure per-shard function: one batch of anchors and the corpus's searcher ->
their negative pools, as the ``pools`` schema's table, and the counts of what the pool rules did."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.science.mining_inputs import ArrowTexts
from pairforge.pipeline.science.pools import NegativePools, build_negative_pools

if TYPE_CHECKING:
    # FAISS loads with the searcher: only when the stage runs.
    from pairforge.stages.mine.searcher import Searcher

# Anchors whose pool rules run at once (mine_shard). The rules hold each distinct neighbour's
# text, raw and normalised; an anchor batch's distinct neighbours grow with the corpus until it
# holds far more than batch x k rows (16,384 anchors x 65: 96k rows at 100k, 650k at 1M).
RULE_BATCH = 4096
AUGMENTATIONS = "augmentations"  # list<string> column of the per-shard input table


def mine_shard(
    table: pa.Table,
    searcher: Searcher,
    texts: ArrowTexts,
    ids: pa.Array,
    *,
    band: tuple[float, float],
    near_duplicate_threshold: float | None,
    min_pool: int,
    fallback: str,
    widen_step: float,
    widen_limits: tuple[float, float],
    seed: int,
    workers: int,
    pool_cap: int | None = None,
) -> tuple[pa.Table, dict[str, int]]:
    """Anchors (``id``, ``row``, ``augmentations`` list<string>) -> their ``pools`` table.

    ``texts`` and ``ids`` are the whole corpus (row ``i`` of the sentences dataset); neighbours
    come from ``searcher``, grown past its k while the band lasts, up to ``pool_cap + 1`` slots
    (the anchor usually finds itself). Returns the table and its counts
    (``NegativePools.counts``, plus ``capped``: anchors whose band went on past the cap, and
    ``band_retrieved``: retrieved neighbours inside the band before the pool rules).
    """
    rows = table[S.ROW].to_numpy()
    found = searcher.band_neighbours(rows, band[0], None if pool_cap is None else pool_cap + 1)
    scores, neighbours = found.scores, found.ids
    augmentations = table[AUGMENTATIONS].to_pylist()
    # The pool rules hold every distinct neighbour's text, raw and normalised: RULE_BATCH
    # anchors at a time. A pool depends on its anchor alone, so the cut changes no pool.
    parts, counts = [], {}
    for lo in range(0, len(rows), RULE_BATCH):
        part = slice(lo, lo + RULE_BATCH)
        pools = build_negative_pools(
            neighbours[part],
            scores[part],
            rows[part],
            texts,
            augmentations[part],
            low=band[0],
            high=band[1],
            near_duplicate_threshold=near_duplicate_threshold,
            m=min_pool,
            fallback=fallback,  # type: ignore[arg-type]
            widen_step=widen_step,
            widen_limits=widen_limits,
            vectors=searcher.rows if fallback == "random" else None,
            seed=seed,
            workers=workers,
            searched=found.searched[part],
        )
        parts.append(pools_table(table[S.ID].slice(lo, RULE_BATCH), pools, ids))
        for key, value in pools.counts().items():
            counts[key] = counts.get(key, 0) + value
    in_band = (neighbours >= 0) & (neighbours != rows[:, None])
    in_band &= (scores >= np.float32(band[0])) & (scores <= np.float32(band[1]))
    counts.update(capped=int(found.capped.sum()), band_retrieved=int(in_band.sum()))
    if len(parts) == 1:
        return parts[0], counts
    return pa.concat_tables(parts).combine_chunks(), counts


def pools_table(
    anchor_ids: pa.ChunkedArray | pa.Array, pools: NegativePools, ids: pa.Array
) -> pa.Table:
    """``NegativePools`` -> the ``pools`` schema's table (``ids``: the corpus's sentence ids)."""
    offsets = pa.array(pools.offsets.astype(np.int32))

    def ragged(values: pa.Array) -> pa.ListArray:
        return pa.ListArray.from_arrays(offsets, values)

    cand = pools.candidate_ids
    return pa.table(
        {
            S.ID: anchor_ids,
            S.ROW: pa.array(pools.anchor_ids, pa.int64()),
            S.POOL_ROWS: ragged(pa.array(cand, pa.int64())),
            S.POOL_IDS: ragged(ids.take(pa.array(cand, pa.int64()))),
            S.POOL_COS: ragged(pa.array(pools.cosines, pa.float32())),
            S.POOL_RANDOM: ragged(pa.array(pools.from_random, pa.bool_())),
            S.BAND_LOW: pa.array(pools.band_low, pa.float32()),
            S.BAND_HIGH: pa.array(pools.band_high, pa.float32()),
            S.WAS_SHORT: pa.array(pools.was_short, pa.bool_()),
            S.SHORT: pa.array(pools.short, pa.bool_()),
            S.FALLBACK: pa.array(pools.fallback.tolist(), pa.string()),
        }
    )


def anchor_table(
    ids: pa.Array, start: int, stop: int, aug_rows: np.ndarray, aug_texts: pa.Array
) -> pa.Table:
    """The anchors of corpus rows ``[start, stop)``: ``id``, ``row`` and their own augmentations
    (``aug_rows``: sorted corpus rows, ``aug_texts``: their texts), the per-shard input table."""
    lo, hi = np.searchsorted(aug_rows, [start, stop])
    local = aug_rows[lo:hi] - start
    counts = np.bincount(local, minlength=stop - start)
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    return pa.table(
        {
            S.ID: ids.slice(start, stop - start),
            S.ROW: pa.array(np.arange(start, stop, dtype=np.int64)),
            AUGMENTATIONS: pa.ListArray.from_arrays(offsets, aug_texts.slice(lo, hi - lo)),
        }
    )
