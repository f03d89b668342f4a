"""The ``sample`` stage's pure per-shard function: score a batch of anchors' pools, draw, and
build its ``pairs`` rows (Arrow tables in, an Arrow table out; no files, no globals); and
``open_positives``, which reads the positive pools (the back-translation candidates and the LLM
rewrites, each with its embeddings)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.errors import (
    DataIntegrityError,
    IncompleteDatasetError,
    PairforgeError,
)
from pairforge.pipeline.plumbing.shards import Dataset, open_dataset
from pairforge.pipeline.plumbing.storage import dataset_path
from pairforge.pipeline.science.mining_inputs import (
    ArrowTexts,
    MappedVectors,
    check_same_encoder,
    embeddings_layout,
    iter_vectors,
    open_embeddings,
    take_rows,
)
from pairforge.pipeline.science.text import match_key
from pairforge.stages.sample.edits import PairScorer
from pairforge.stages.sample.ipw import keyed_exponentials
from pairforge.stages.sample.pairs import draw, gather, pick_route, ragged_list, score_pools
from pairforge.stages.sample.selection import (
    Selection,
    positive_scores,
    select,
    simans_probs,
    top_of_pools,
)

if TYPE_CHECKING:  # the draws read the stage's frozen config (no import at run time)
    from pairforge.stages.sample.stage import SampleConfig

EDIT_INDEX = "edit_index"  # the positives table's row in the scorer's candidate encoding
COS = "cos"

log = logging.getLogger("pairforge")
SINGLE_VIEWS = (
    (S.POSITIVE_TEXT, S.POSITIVE_TEXT_ID, "positive_route"),
    (S.VIEW1_TEXT, S.VIEW1_ID, "view1_route"),
    (S.VIEW2_TEXT, S.VIEW2_ID, "view2_route"),
)


def sample_shard(
    pools: pa.Table,
    positives: pa.Table,
    texts: ArrowTexts,
    ids: pa.Array,
    edits: PairScorer,
    cfg: SampleConfig,
    shard: int,
    batch: int = 0,
) -> tuple[pa.Table, dict[str, int], float]:
    """One shard (or anchor batch ``batch`` of it) of ``pools`` -> its ``pairs`` rows, counts,
    and the seconds spent scoring. Draws are keyed by (seed, anchor, candidate), or with
    ``draws: stream`` seeded by (seed, shard, batch).

    ``positives`` holds the shard's anchors' candidates sorted by anchor row (``row``,
    ``candidate_id``, ``text``, ``route``, ``noise``, ``identical``, ``cos``, ``edit_index``).
    ``texts``/``ids`` are the corpus by row; ``edits`` scores corpus rows against corpus rows
    (negatives) and against ``edit_index`` rows of the candidates (positives), with every text
    encoded once per run (``edits.edit_scorer``).
    """
    rows = _checked_rows(pools, ids, shard)
    t0 = time.perf_counter()
    # Positives first: the negatives' ceiling reads their scores (each side has its own stream).
    pos = _draw_positives(positives, rows, edits, cfg, shard, batch)
    neg = _draw_negatives(pools, rows, edits, cfg, shard, batch, pos)
    seconds = time.perf_counter() - t0
    columns = _pair_columns(pools, rows, texts, neg, pos)
    counts = _counts(len(rows), columns, neg, pos)
    _add_single_views(columns, counts, pos, cfg, len(rows))
    table = _apply_short(pa.table(columns), columns, neg, cfg)
    counts["dropped_short"] = len(rows) - table.num_rows
    counts["rows"] = table.num_rows
    return table, counts, seconds


def _checked_rows(pools: pa.Table, ids: pa.Array, shard: int) -> np.ndarray:
    """The anchors' corpus rows of a pools shard, ascending; raises ``DataIntegrityError`` when
    the ids at those rows are not the pools' anchor ids (pools mined from other sentences)."""
    rows = pools[S.ROW].to_numpy()
    if not ids.take(pa.array(rows)).equals(pools[S.ID].combine_chunks()):
        raise DataIntegrityError(
            f"pools shard {shard}: anchor ids do not match the sentences at their rows; "
            "the pools are stale, run mine again"
        )
    return rows


@dataclass(frozen=True)
class _Negatives:
    """A shard's scored negative pools and their draw, over the candidates the selection rules
    kept (``stages.sample.selection``): ``kept`` (N_kept,) their positions among the pools' flat
    candidates, ``offsets`` (n + 1,) into the kept ones, ``cand_rows`` (N_kept,) their corpus
    rows, ``edit`` (N_kept,) their edit distances; ``pool_total`` the candidates before the
    rules, ``selection`` the rules' outcome."""

    kept: np.ndarray
    offsets: np.ndarray
    cand_rows: np.ndarray
    edit: np.ndarray
    scores: Any  # pairs.score_pools
    drawn: Any  # pairs.draw
    pool_total: int
    selection: Selection


def _draw_negatives(
    pools: pa.Table,
    rows: np.ndarray,
    edits: PairScorer,
    cfg: SampleConfig,
    shard: int,
    batch: int,
    pos: _Positives,
) -> _Negatives:
    """Narrow each pool by the rank window and the positive-aware ceiling, score what is left
    (edit distance, cosine, P_neg: eqs. 1, 3-4), then draw ``m`` per anchor with the sampler:
    without replacement (``_noise``, stream 0), or the top ``m``."""
    pool_rows = pools[S.POOL_ROWS].combine_chunks()
    n_off = pool_rows.offsets.to_numpy().astype(np.int64)
    n_off -= n_off[0]
    cos_all = pools[S.POOL_COS].combine_chunks().flatten().to_numpy(zero_copy_only=False)
    s_pos = positive_scores(pos.scores.cos, pos.offsets, cfg.positive_reference, cfg.positive_score)
    sel = select(
        cos_all,
        n_off,
        s_pos,
        cfg.range_min,
        cfg.range_max,
        cfg.absolute_margin,
        cfg.relative_margin,
    )
    kept = sel.kept
    offsets = sel.offsets
    cand_rows = pool_rows.flatten().to_numpy()[kept]
    cos = cos_all[kept]
    edit = edits.corpus(np.repeat(rows, np.diff(offsets)), cand_rows)  # (N_kept,), pools grouped
    form = cfg.ipw if cfg.negative_sampler == "ipw" else "uniform"
    neg = score_pools(edit, cos, offsets, "negative", cfg.lambda_n, cfg.temperature, form)
    if cfg.negative_sampler == "top":
        neg_draw = top_of_pools(cos, offsets, cfg.m)
        chosen = np.zeros(cos.size)
        chosen[neg_draw.indices] = 1.0
        sizes = np.diff(neg_draw.offsets)
        share = np.repeat(1.0 / np.maximum(sizes, 1), np.diff(offsets))  # (N_kept,)
        neg = replace(neg, prob=chosen * share)
    else:
        if cfg.negative_sampler == "simans":
            probs = simans_probs(cos, offsets, s_pos, cfg.simans_a, cfg.simans_b)
            neg = replace(neg, prob=probs)
        anchors = np.repeat(rows, np.diff(offsets))  # (N_kept,) each candidate's anchor row
        neg_draw = draw(neg, cfg.m, _noise(cfg, shard, batch, 0, anchors, cand_rows))
    return _Negatives(kept, offsets, cand_rows, edit, neg, neg_draw, int(n_off[-1]), sel)


def _noise(
    cfg: SampleConfig,
    shard: int,
    batch: int,
    stream: int,
    anchors: np.ndarray,
    candidates: np.ndarray | None,
) -> np.random.Generator | np.ndarray:
    """The randomness of one draw (``stream`` 0: negatives, 1: positives). ``keyed``: each
    candidate's Exp(1) number hashed from (seed, stream, anchor row, candidate key), so an
    anchor's draw depends on its own pool only; ``stream``: one generator seeded by (seed, shard,
    anchor batch, stream), whose numbers shift along the batch when any pool before differs."""
    if cfg.draws == "keyed":
        return keyed_exponentials(cfg.seed, stream, anchors, candidates)
    return np.random.default_rng([cfg.seed, shard, batch, stream])


def text_keys(texts: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """(n,) uint64: xxh3-64 of each text's UTF-8 bytes, the key of a candidate that has no
    corpus row (a positive: one per distinct text of its anchor)."""
    return np.fromiter(
        (xxhash.xxh3_64_intdigest(t.encode()) for t in texts.to_pylist()),
        dtype=np.uint64,
        count=len(texts),
    )


@dataclass(frozen=True)
class _Positives:
    """A shard's positive candidates at each step: ``kept`` (identical copies skipped unless
    kept; ``keep`` its mask over the shard's candidates, ``local`` their anchor positions),
    ``kept_local`` its anchor positions, ``rep`` (n_kept,) the first kept candidate of its text,
    ``distinct`` its mask of first texts, ``pool`` the distinct ones (``offsets`` by anchor),
    which are scored and drawn from."""

    local: np.ndarray
    keep: np.ndarray
    kept: pa.Table
    kept_local: np.ndarray
    rep: np.ndarray
    distinct: np.ndarray
    pool: pa.Table
    offsets: np.ndarray
    edit: np.ndarray
    scores: Any  # pairs.score_pools
    drawn: Any  # pairs.draw


def _draw_positives(
    positives: pa.Table,
    rows: np.ndarray,
    edits: PairScorer,
    cfg: SampleConfig,
    shard: int,
    batch: int,
) -> _Positives:
    """Score the anchors' distinct candidates (edit distance, cosine, P_pos: eqs. 2, 5-6), then
    draw ``m_positive`` (default ``m``) per anchor (``_noise``, stream 1)."""
    n = len(rows)
    # Identical copies skipped unless kept, then one candidate per distinct text (the first in
    # source order), so that a text two routes both produced is one candidate: scored once,
    # drawn at most once, no likelier than any other.
    local = np.searchsorted(rows, positives[S.ROW].to_numpy())  # rows ascend within a shard
    identical = positives[S.IDENTICAL].to_numpy(zero_copy_only=False)
    keep = ~identical if cfg.identical == "skip" else np.ones(len(local), dtype=bool)
    pos_k = positives.filter(pa.array(keep))
    local_kk = local[keep]
    rep = first_of_text(local_kk, pos_k[S.TEXT].to_pylist())  # (n_kept,) its text's first row
    distinct = rep == np.arange(rep.size)
    pos_t = pos_k.filter(pa.array(distinct))
    local_k = local_kk[distinct]
    p_off = np.concatenate([[0], np.cumsum(np.bincount(local_k, minlength=n))]).astype(np.int64)
    pos_edit = edits.candidates(rows[local_k], pos_t[EDIT_INDEX].to_numpy())
    pos = score_pools(
        pos_edit, pos_t[COS].to_numpy(), p_off, "positive", cfg.lambda_p, cfg.temperature, cfg.ipw
    )
    keys = text_keys(pos_t[S.TEXT]) if cfg.draws == "keyed" else None
    noise = _noise(cfg, shard, batch, 1, rows[local_k], keys)
    pos_draw = draw(pos, cfg.m_positive or cfg.m, noise)
    return _Positives(
        local, keep, pos_k, local_kk, rep, distinct, pos_t, p_off, pos_edit, pos, pos_draw
    )


def _pair_columns(
    pools: pa.Table, rows: np.ndarray, texts: ArrowTexts, neg: _Negatives, pos: _Positives
) -> dict[str, pa.Array]:
    """The ``pairs`` columns of the drawn positives and negatives, in schema order up to
    ``identical_skipped`` (the single views are added by ``_add_single_views``)."""
    pos_t, pos_draw, neg_draw = pos.pool, pos.drawn, neg.drawn
    pos_picked = pa.array(pos_draw.indices)
    picked = pa.array(neg.kept[neg_draw.indices])  # positions among the pools' candidates
    return {
        S.ID: pools[S.ID].combine_chunks(),
        S.TEXT: texts.array.take(pa.array(rows)),
        S.POSITIVE_TEXTS: ragged_list(
            pos_draw.offsets, pos_t[S.TEXT].take(pos_picked).combine_chunks()
        ),
        S.POSITIVE_IDS: ragged_list(
            pos_draw.offsets, pos_t[S.CANDIDATE_ID].take(pos_picked).combine_chunks()
        ),
        S.POSITIVE_ROUTES: ragged_list(
            pos_draw.offsets, pos_t[S.ROUTE].take(pos_picked).combine_chunks()
        ),
        S.POSITIVE_NOISES: ragged_list(
            pos_draw.offsets, pos_t[S.NOISE].take(pos_picked).combine_chunks()
        ),
        S.NEGATIVE_TEXTS: ragged_list(
            neg_draw.offsets, texts.array.take(pa.array(neg.cand_rows[neg_draw.indices]))
        ),
        S.NEGATIVE_IDS: ragged_list(
            neg_draw.offsets, pools[S.POOL_IDS].combine_chunks().flatten().take(picked)
        ),
        S.NEGATIVE_RANDOM: ragged_list(
            neg_draw.offsets, pools[S.POOL_RANDOM].combine_chunks().flatten().take(picked)
        ),
        **gather(pos.scores, pos_draw, "positive"),
        **gather(neg.scores, neg_draw, "negative"),
        S.BAND_LOW: pools[S.BAND_LOW].combine_chunks(),
        S.BAND_HIGH: pools[S.BAND_HIGH].combine_chunks(),
        S.FALLBACK: pools[S.FALLBACK].combine_chunks(),
        S.IDENTICAL_SKIPPED: pa.array(
            np.bincount(pos.local[~pos.keep], minlength=len(rows)).astype(np.int32), pa.int32()
        ),
    }


def _counts(
    n: int, columns: dict[str, pa.Array], neg: _Negatives, pos: _Positives
) -> dict[str, int]:
    """The shard's counts of candidates, draws and skips (before the single views and the
    ``short`` policy, which add theirs)."""
    neg_draw, pos_draw = neg.drawn, pos.drawn
    return {
        "anchors": n,
        "negative_candidates": neg.pool_total,
        "negatives_outside_rank_window": neg.selection.outside_window,
        "negatives_above_positive_ceiling": neg.selection.above_ceiling,
        "positive_candidates": int(pos.offsets[-1]),
        "negatives_sampled": len(neg_draw.indices),
        "positives_sampled": len(pos_draw.indices),
        "random_negatives": int(pc.sum(columns[S.NEGATIVE_RANDOM].flatten()).as_py() or 0),
        "short_negatives": int(neg_draw.short.sum()),
        "no_negative": int((np.diff(neg_draw.offsets) == 0).sum()),
        "no_positive": int((np.diff(pos_draw.offsets) == 0).sum()),
        "identical_skipped": int((~pos.keep).sum()),
        "repeated_positive_text": int((~pos.distinct).sum()),
        "edit_pairs": int(len(neg.edit) + len(pos.edit)),
    }


def _add_single_views(
    columns: dict[str, pa.Array],
    counts: dict[str, int],
    pos: _Positives,
    cfg: SampleConfig,
    n: int,
) -> None:
    """Add the single-view columns (``SINGLE_VIEWS``: text and id of the view's route, null
    when the anchor has none) to ``columns`` and their ``<text>_missing`` counts to ``counts``."""
    # The single views choose among every kept candidate of their route, a repeated text
    # included (its route is still that route), with its text's P_pos.
    pos_k, rep = pos.kept, pos.rep
    route_col = pos_k[S.ROUTE].to_numpy(zero_copy_only=False)
    noise_col = pos_k[S.NOISE].to_numpy(zero_copy_only=False)
    prob_k = pos.scores.prob[np.cumsum(pos.distinct)[rep] - 1] if rep.size else pos.scores.prob
    for text_col, id_col, key in SINGLE_VIEWS:
        best = pick_route(pos.kept_local, route_col, noise_col, prob_k, getattr(cfg, key), n)
        has = best >= 0
        take = (
            pa.array(np.where(has, best, 0), mask=~has) if len(pos_k) else pa.nulls(n, pa.int64())
        )
        columns[text_col] = (
            pos_k[S.TEXT].combine_chunks().take(take) if len(pos_k) else pa.nulls(n, pa.string())
        )
        columns[id_col] = (
            pos_k[S.CANDIDATE_ID].combine_chunks().take(take)
            if len(pos_k)
            else pa.nulls(n, pa.string())
        )
        counts[f"{text_col}_missing"] = int((~has).sum())


def _apply_short(
    table: pa.Table, columns: dict[str, pa.Array], neg: _Negatives, cfg: SampleConfig
) -> pa.Table:
    """The ``short`` policy for anchors with fewer than ``m`` negative candidates: ``keep``
    returns ``table`` as is, ``drop`` without them, ``error`` raises ``PairforgeError`` naming
    the first such anchor and the fixes."""
    short = neg.drawn.short
    if cfg.short == "error" and short.any():
        first = int(np.flatnonzero(short)[0])
        raise PairforgeError(
            f"sample: anchor {columns[S.ID][first].as_py()!r} has {int(np.diff(neg.drawn.offsets)[first])} "
            f"negative candidates, fewer than m={cfg.m} (short=error; mine with fallback "
            "random or a wider band, or set sample.short to keep or drop)"
        )
    if cfg.short == "drop":
        table = table.filter(pa.array(~short))
    return table


def first_of_text(group: np.ndarray, texts: Sequence[str]) -> np.ndarray:
    """For each candidate, the position of the first candidate of its group (anchor) whose text
    is the same once normalised (``text.match_key``: NFKC, case-folded, spaces collapsed);
    a candidate is its own first when its text is new. Shape ``(len(texts),)`` int64."""
    seen: dict[tuple[int, str], int] = {}
    return np.fromiter(
        (
            seen.setdefault((int(g), match_key(t)), i)
            for i, (g, t) in enumerate(zip(group, texts, strict=True))
        ),
        dtype=np.int64,
        count=len(texts),
    )


@dataclass(frozen=True)
class PositiveSource:
    """One dataset of positive candidates (``candidates`` schema) and its embeddings.

    ``name`` keys the metrics and the fingerprint (``candidates``: back-translations,
    ``rewrites``: LLM rewrites); ``path`` None means disabled. ``embed_key`` is the ``embed``
    param that embeds it, for error messages.
    """

    name: str
    path: str | None
    embeddings: str
    embed_key: str


def _empty_positives() -> pa.Table:
    return pa.table(
        {
            S.ROW: pa.array([], pa.int64()),
            S.CANDIDATE_ID: pa.array([], pa.string()),
            S.TEXT: pa.array([], pa.string()),
            S.ROUTE: pa.array([], pa.string()),
            S.NOISE: pa.array([], pa.string()),
            S.IDENTICAL: pa.array([], pa.bool_()),
            COS: pa.array([], pa.float32()),
        }
    )


def _read_source(
    source: PositiveSource,
    sent_embeddings: Dataset,
    sent_ids: pa.Array,
    sent_vectors: MappedVectors,
) -> tuple[list[pa.Table], dict[str, Any], Dataset | None, Dataset | None]:
    """One source's candidates with their cosine to their anchor (unsorted parts), its facts
    for the metrics, and the two datasets read (None when absent, disabled or not needed)."""
    if source.path is None:
        return [], {"status": "disabled", "rows": 0}, None, None
    if not dataset_path(source.path).exists():
        log.warning("sample: no %s dataset at %s: no positives from it", source.name, source.path)
        return [], {"status": "absent", "rows": 0}, None, None
    candidates = open_dataset(source.path, S.CANDIDATES)  # a schema mismatch says so here
    if candidates.num_rows == 0:  # e.g. the demo's rewrites (rewrite disabled): nothing to embed
        return [], {"status": "empty", "rows": 0}, candidates, None
    try:
        cand_emb = open_embeddings(source.embeddings)
    except IncompleteDatasetError as exc:
        raise IncompleteDatasetError(
            f"{exc}; it should embed the {candidates.num_rows} rows of {source.path}: run embed "
            f"(embed.{source.embed_key}: {source.path})"
        ) from None
    d_s, _ = embeddings_layout(sent_embeddings.path)
    d_c, _ = embeddings_layout(cand_emb.path)
    if d_s != d_c:
        raise PairforgeError(
            f"dimension mismatch: {sent_embeddings.path} holds {d_s}-d vectors but "
            f"{cand_emb.path} holds {d_c}-d vectors; embed both with one encoder"
        )
    if cand_emb.num_rows:
        check_same_encoder(sent_embeddings, cand_emb)
    if cand_emb.num_rows != candidates.num_rows or len(cand_emb) != len(candidates):
        raise DataIntegrityError(
            f"{cand_emb.path} embeds {cand_emb.num_rows} candidates in {len(cand_emb)} shards but "
            f"{candidates.path} holds {candidates.num_rows} in {len(candidates)}: run embed again"
        )
    parts = []
    orphans = 0
    cols = [S.ID, S.CANDIDATE_ID, S.TEXT, S.ROUTE, S.NOISE, S.IDENTICAL]
    for i in range(len(candidates)):
        table = candidates.read_shard(i, cols)
        parts_i = list(iter_vectors(cand_emb, i))
        emb_ids = pa.chunked_array([x for x, _ in parts_i], pa.string())
        if not emb_ids.equals(table[S.CANDIDATE_ID]):
            raise DataIntegrityError(
                f"{cand_emb.path} shard {i} does not embed the candidates of {candidates.path} "
                f"shard {i} (ids differ): run embed again"
            )
        vectors = np.concatenate([v for _, v in parts_i]) if parts_i else np.empty((0, d_c))
        anchor = pc.index_in(table[S.ID], value_set=sent_ids)
        valid = pc.is_valid(anchor).to_numpy(zero_copy_only=False)
        orphans += int((~valid).sum())
        rows = anchor.to_numpy(zero_copy_only=False)[valid].astype(np.int64)
        anchors = take_rows(sent_vectors.array, rows, sent_vectors.release)  # (n_valid, d)
        cos = np.einsum("ij,ij->i", vectors[valid], anchors)  # (n_valid,)
        kept = table.filter(pa.array(valid))
        parts.append(
            pa.table(
                {
                    S.ROW: pa.array(rows, pa.int64()),
                    **{c: kept[c] for c in cols[1:]},
                    COS: pa.array(cos.astype(np.float32), pa.float32()),
                }
            )
        )
    if orphans:
        log.warning(
            "sample: %d %s belong to no sentence (stale %s?)", orphans, source.name, source.path
        )
    made_by = candidates.manifest.get("engine")
    engine = made_by.get("engine") if isinstance(made_by, dict) else made_by
    if candidates.manifest.get("standin"):
        engine = "stand-in"
    facts = {"status": "used", "rows": candidates.num_rows, "orphans": orphans}
    if engine:
        facts["engine"] = engine
    return parts, facts, candidates, cand_emb


def open_positives(
    sources: Sequence[PositiveSource],
    sent_embeddings: Dataset,
    sent_ids: pa.Array,
    sent_vectors: MappedVectors,
) -> tuple[pa.Table, dict[str, dict[str, Any]], dict[str, Dataset | None]]:
    """The positive pools of every anchor, from all ``sources`` (back-translations, LLM
    rewrites): one table sorted by anchor row, each anchor's candidates in source order (columns
    ``row``, ``candidate_id``, ``text``, ``route``, ``noise``, ``identical``, ``cos``), facts per
    source for the metrics, and the datasets read by name (``<name>`` and
    ``<name>_embeddings``; None when not read) for the fingerprint.

    The ``route`` column says where a positive came from (``en-zh-en``, ..., ``llm`` for the
    rewrite stage's rewrites); candidate ids must be unique across the sources.
    """
    parts: list[pa.Table] = []
    facts: dict[str, dict[str, Any]] = {}
    datasets: dict[str, Dataset | None] = {}
    seen_ids: list[pa.ChunkedArray] = []
    for source in sources:
        found, facts[source.name], data, emb = _read_source(
            source, sent_embeddings, sent_ids, sent_vectors
        )
        datasets[source.name], datasets[f"{source.name}_embeddings"] = data, emb
        if found:
            ids = pa.chunked_array([t[S.CANDIDATE_ID] for t in found], pa.string())
            for earlier in seen_ids:
                clash = pc.is_in(ids, value_set=earlier.combine_chunks())
                if pc.any(clash).as_py():
                    first = ids.filter(clash)[0].as_py()
                    raise DataIntegrityError(
                        f"sample: candidate id {first!r} of {source.path} is also in another "
                        "positive source; candidate ids must be unique across candidates and "
                        "rewrites"
                    )
            seen_ids.append(ids)
        parts += found
    table = pa.concat_tables([_empty_positives(), *parts]).combine_chunks()
    order = np.argsort(table[S.ROW].to_numpy(), kind="stable")
    return table.take(pa.array(order)), facts, datasets
