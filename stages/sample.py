"""sample: DebCSE inverse-propensity-weighted sampling of positives and negatives -> ``data/pairs``.

Per anchor, score then decide:

1. **Score** every candidate of its negative pool (from ``mine``) and of its positive pool (its
   augmentation candidates; copies identical to the anchor skipped and counted): edit distance to
   the anchor (rapidfuzz, ``edit_kind``/``edit_normalized``/``edit_metric``), cosine, S_sur and
   S_sem (eqs. 1-2), P_neg (eqs. 3-4, λn) and P_pos (eqs. 5-6, λp), softmax ``temperature``.
2. **Draw** ``m`` negatives and ``m_positive`` positives without replacement from P, seeded per
   shard (the same input and seed give the same pairs, resumed or not).
3. Pick the single-view columns: ``positive_text`` (DenoSent, route ``positive_route``),
   ``view1_text`` / ``view2_text`` (BSL, ``view1_route`` / ``view2_route``).

Default edit distance: **word-level, normalised Levenshtein**. Normalised, because eq. 1 puts the
distance inside ``exp``: raw distances tens of operations apart collapse the softmax onto one
candidate. Word-level, because the surface similarity DebCSE wants in a hard negative is shared
wording (its own diagnostic, Tables 1 and 4, counts shared words), and a word edit counts a
changed word once where a character distance counts its letters, so long words and morphology do
not dominate; it is also 3-4x faster on encoded sentences (see benchmarks/mine.py).

Output: ``data/pairs`` (``pairs`` schema), shard ``i`` for anchor shard ``i``, with a dataset card
(``_README.md``) beside the shards; metrics: counts, entropy ratios of P, score distributions.
``pairforge export`` writes the sentence-transformers layouts.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import typer
from pydantic import Field

from pipeline import schemas as S
from pipeline.cli_options import ParamsOpt, ProgressOpt, cli_errors
from pipeline.config import StageConfig, stage_config
from pipeline.errors import ConfigError, DataIntegrityError, PairforgeError
from pipeline.progress import Progress
from pipeline.shards import (
    Dataset,
    DatasetWriter,
    atomic_write_bytes,
    atomic_write_json,
    open_dataset,
)
from stages.mining.card import CARD, distribution, render_card
from stages.mining.edits import WordCodes, encoded_distances
from stages.mining.inputs import (
    ArrowTexts,
    check_same_encoder,
    embeddings_layout,
    encoder_info,
    fingerprint,
    iter_vectors,
    load_vectors,
    open_embeddings,
)
from stages.mining.pairs import draw, gather, pick_route, ragged_list, score_pools

log = logging.getLogger("pairforge")

STAGE = "sample"
EDIT_STRING = "edit_string"  # the positives table's text as the edit distance compares it
COS = "cos"
SINGLE_VIEWS = (
    (S.POSITIVE_TEXT, S.POSITIVE_TEXT_ID, "positive_route"),
    (S.VIEW1_TEXT, S.VIEW1_ID, "view1_route"),
    (S.VIEW2_TEXT, S.VIEW2_ID, "view2_route"),
)


class SampleConfig(StageConfig):
    """The ``sample`` section of params.yaml."""

    sentences: str = "data/sentences"
    pools: str = "data/pools"
    embeddings: str = "data/embeddings/sentences"
    candidates: str | None = Field("data/candidates", description="null: negatives only")
    candidate_embeddings: str = "data/embeddings/candidates"
    output: str = "data/pairs"
    metrics: str = "metrics/sample.json"
    m: int = Field(2, ge=1, description="negatives drawn per anchor (DebCSE: 2)")
    m_positive: int | None = Field(None, ge=1, description="positives per anchor; null: m")
    lambda_n: float = Field(0.8, ge=0.0, le=1.0, description="eq. 3 weight of semantics")
    lambda_p: float = Field(0.8, ge=0.0, le=1.0, description="eq. 5 weight of semantics")
    temperature: float = Field(1.0, gt=0.0, description="softmax temperature (1 = the paper)")
    edit_kind: Literal["word", "char"] = "word"
    edit_normalized: bool = True
    edit_metric: Literal["levenshtein", "indel"] = "levenshtein"
    identical: Literal["skip", "keep"] = Field("skip", description="candidates equal to the anchor")
    short: Literal["keep", "drop", "error"] = Field(
        "keep", description="anchors with fewer than m negatives: keep (flagged), drop, error"
    )
    positive_route: str = "en-zh-en"
    view1_route: str = "en-de-en"
    view2_route: str = "en-fr-en"
    seed: int = 0
    threads: int = Field(-1, description="rapidfuzz threads; -1: all cores")
    anchor_batch: int = Field(
        16384, ge=1, description="anchors scored at once (bounds memory; seeds the draws)"
    )
    corpus_name: str = Field("corpus", description="for the dataset card")
    corpus_license: str = Field("unknown", description="licence of the corpus text, for the card")


# --- the pure per-shard function --------------------------------------------------------------


def _gather(strings: pa.Array, rows: np.ndarray) -> list[str]:
    """``strings[rows]`` as a list of Python strings, each distinct row converted once (pools
    repeat corpus sentences: the list then holds references, not copies)."""
    uniq, inverse = np.unique(rows, return_inverse=True)
    objs = np.empty(len(uniq), dtype=object)
    objs[:] = strings.take(pa.array(uniq)).to_pylist()
    return objs[inverse].tolist()


def sample_shard(
    pools: pa.Table,
    positives: pa.Table,
    texts: ArrowTexts,
    ids: pa.Array,
    edit_strings: pa.Array,
    cfg: SampleConfig,
    shard: int,
    batch: int = 0,
) -> tuple[pa.Table, dict[str, int], float]:
    """One shard (or anchor batch ``batch`` of it) of ``pools`` -> its ``pairs`` rows, counts,
    and the seconds spent scoring. Draws are seeded by (seed, shard, batch).

    ``positives`` holds the shard's anchors' candidates sorted by anchor row (``row``,
    ``candidate_id``, ``text``, ``route``, ``noise``, ``identical``, ``cos``, ``edit_string``).
    ``texts``/``ids``/``edit_strings`` are the corpus by row (``edit_strings`` is the text the
    edit distance compares: the text itself, or its word codes).
    """
    rows = pools[S.ROW].to_numpy()
    n = len(rows)
    if not ids.take(pa.array(rows)).equals(pools[S.ID].combine_chunks()):
        raise DataIntegrityError(
            f"pools shard {shard}: anchor ids do not match the sentences at their rows; "
            "the pools are stale, run mine again"
        )
    anchor_edit = np.empty(n, dtype=object)  # (n,) for C-speed repeats below
    anchor_edit[:] = edit_strings.take(pa.array(rows)).to_pylist()
    t0 = time.perf_counter()

    # Negatives: score every pool candidate, then draw m.
    pool_rows = pools[S.POOL_ROWS].combine_chunks()
    n_off = pool_rows.offsets.to_numpy().astype(np.int64)
    n_off -= n_off[0]
    cand_rows = pool_rows.flatten().to_numpy()
    edit = encoded_distances(
        np.repeat(anchor_edit, np.diff(n_off)).tolist(),
        _gather(edit_strings, cand_rows),
        cfg.edit_normalized,
        cfg.threads,
        cfg.edit_metric,
    )
    cos = pools[S.POOL_COS].combine_chunks().flatten().to_numpy(zero_copy_only=False)
    neg = score_pools(edit, cos, n_off, "negative", cfg.lambda_n, cfg.temperature)
    neg_draw = draw(neg, cfg.m, np.random.default_rng([cfg.seed, shard, batch, 0]))
    picked = pa.array(neg_draw.indices)

    # Positives: the anchors' candidates, identical copies skipped unless kept.
    local = np.searchsorted(rows, positives[S.ROW].to_numpy())  # rows ascend within a shard
    identical = positives[S.IDENTICAL].to_numpy(zero_copy_only=False)
    keep = ~identical if cfg.identical == "skip" else np.ones(len(local), dtype=bool)
    pos_t = positives.filter(pa.array(keep))
    local_k = local[keep]
    p_off = np.concatenate([[0], np.cumsum(np.bincount(local_k, minlength=n))]).astype(np.int64)
    pos_edit = encoded_distances(
        anchor_edit[local_k].tolist(),
        pos_t[EDIT_STRING].to_pylist(),
        cfg.edit_normalized,
        cfg.threads,
        cfg.edit_metric,
    )
    pos = score_pools(
        pos_edit, pos_t[COS].to_numpy(), p_off, "positive", cfg.lambda_p, cfg.temperature
    )
    pos_draw = draw(
        pos, cfg.m_positive or cfg.m, np.random.default_rng([cfg.seed, shard, batch, 1])
    )
    pos_picked = pa.array(pos_draw.indices)
    seconds = time.perf_counter() - t0

    columns: dict[str, pa.Array] = {
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
            neg_draw.offsets, texts.array.take(pa.array(cand_rows[neg_draw.indices]))
        ),
        S.NEGATIVE_IDS: ragged_list(
            neg_draw.offsets, pools[S.POOL_IDS].combine_chunks().flatten().take(picked)
        ),
        S.NEGATIVE_RANDOM: ragged_list(
            neg_draw.offsets, pools[S.POOL_RANDOM].combine_chunks().flatten().take(picked)
        ),
        **gather(pos, pos_draw, "positive"),
        **gather(neg, neg_draw, "negative"),
        S.BAND_LOW: pools[S.BAND_LOW].combine_chunks(),
        S.BAND_HIGH: pools[S.BAND_HIGH].combine_chunks(),
        S.FALLBACK: pools[S.FALLBACK].combine_chunks(),
        S.IDENTICAL_SKIPPED: pa.array(
            np.bincount(local[~keep], minlength=n).astype(np.int32), pa.int32()
        ),
    }
    counts = {
        "anchors": n,
        "negative_candidates": int(n_off[-1]),
        "positive_candidates": int(p_off[-1]),
        "negatives_sampled": len(neg_draw.indices),
        "positives_sampled": len(pos_draw.indices),
        "random_negatives": int(pc.sum(columns[S.NEGATIVE_RANDOM].flatten()).as_py() or 0),
        "short_negatives": int(neg_draw.short.sum()),
        "no_negative": int((np.diff(neg_draw.offsets) == 0).sum()),
        "no_positive": int((np.diff(pos_draw.offsets) == 0).sum()),
        "identical_skipped": int((~keep).sum()),
        "edit_pairs": int(len(edit) + len(pos_edit)),
    }
    route_col = pos_t[S.ROUTE].to_numpy(zero_copy_only=False)
    noise_col = pos_t[S.NOISE].to_numpy(zero_copy_only=False)
    for text_col, id_col, key in SINGLE_VIEWS:
        best = pick_route(local_k, route_col, noise_col, pos.prob, getattr(cfg, key), n)
        has = best >= 0
        take = (
            pa.array(np.where(has, best, 0), mask=~has) if len(pos_t) else pa.nulls(n, pa.int64())
        )
        columns[text_col] = (
            pos_t[S.TEXT].combine_chunks().take(take) if len(pos_t) else pa.nulls(n, pa.string())
        )
        columns[id_col] = (
            pos_t[S.CANDIDATE_ID].combine_chunks().take(take)
            if len(pos_t)
            else pa.nulls(n, pa.string())
        )
        counts[f"{text_col}_missing"] = int((~has).sum())
    table = pa.table(columns)

    short = neg_draw.short
    if cfg.short == "error" and short.any():
        first = int(np.flatnonzero(short)[0])
        raise PairforgeError(
            f"sample: anchor {columns[S.ID][first].as_py()!r} has {int(np.diff(neg_draw.offsets)[first])} "
            f"negative candidates, fewer than m={cfg.m} (short=error; mine with fallback "
            "random or a wider band, or set sample.short to keep or drop)"
        )
    if cfg.short == "drop":
        table = table.filter(pa.array(~short))
    counts["dropped_short"] = n - table.num_rows
    counts["rows"] = table.num_rows
    return table, counts, seconds


# --- the stage --------------------------------------------------------------------------------


def _open_positives(
    cfg: SampleConfig,
    sent_embeddings: Dataset,
    sent_ids: pa.Array,
    sent_vectors: np.ndarray,
) -> tuple[pa.Table, dict[str, Any], Dataset | None, Dataset | None]:
    """All candidates with their cosine to their anchor, sorted by anchor row."""
    empty = pa.table(
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
    if cfg.candidates is None:
        return empty, {"status": "disabled", "rows": 0}, None, None
    if not Path(cfg.candidates).exists():
        log.warning(
            "sample: no candidates dataset at %s: no positives will be sampled", cfg.candidates
        )
        return empty, {"status": "absent", "rows": 0}, None, None
    candidates = open_dataset(cfg.candidates, S.CANDIDATES)
    cand_emb = open_embeddings(cfg.candidate_embeddings)
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
        cos = np.einsum("ij,ij->i", vectors[valid], sent_vectors[rows])  # (n_valid,)
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
    table = pa.concat_tables([empty, *parts]).combine_chunks()
    order = np.argsort(table[S.ROW].to_numpy(), kind="stable")
    facts = {"status": "used", "rows": candidates.num_rows, "orphans": orphans}
    if orphans:
        log.warning("sample: %d candidates belong to no sentence (stale candidates?)", orphans)
    return table.take(pa.array(order)), facts, candidates, cand_emb


def _edit_strings(
    cfg: SampleConfig, texts: pa.Array, positives: pa.Table
) -> tuple[pa.Array, pa.Table]:
    """What the edit distance compares for the corpus and the candidates (encoded once)."""
    if cfg.edit_kind == "char":
        return texts, positives.append_column(EDIT_STRING, positives[S.TEXT])
    corpus = texts.to_pylist()
    cand = positives[S.TEXT].to_pylist()
    codes = WordCodes(corpus + cand)
    return (
        pa.array(codes.encode(corpus), pa.string()),
        positives.append_column(EDIT_STRING, pa.array(codes.encode(cand), pa.string())),
    )


def _post_stats(path: str) -> dict[str, dict[str, Any]]:
    """Score distributions of the sampled items and entropy ratios, read back from the shards."""
    cols = [f"{side}_{s}" for side in ("negative", "positive") for s in ("cos", "edit", "prob")]
    cols += ["negative_entropy", "positive_entropy"]
    table = open_dataset(path, S.PAIRS).read_table(cols)
    dists = {}
    for c in cols:
        col = table[c]
        if pa.types.is_list(col.type):
            col = pc.list_flatten(col)
        values = col.to_numpy(zero_copy_only=False).astype(np.float64) if len(col) else np.empty(0)
        # Entropy ratios sit within 1e-4 of 1 under the paper's equations: keep the digits.
        dists[c] = distribution(values, 6 if c.endswith("entropy") else 4)
    return dists


def run(cfg: SampleConfig, progress: bool = True) -> dict[str, Any]:
    """Score and sample every anchor; returns the metrics written to ``cfg.metrics``."""
    t_start = time.monotonic()
    sentences = open_dataset(cfg.sentences, S.SENTENCES)
    pools = open_dataset(cfg.pools, S.POOLS)
    sent_emb = open_embeddings(cfg.embeddings)
    if pools.num_rows != sentences.num_rows or len(pools) != len(sentences):
        raise DataIntegrityError(
            f"{cfg.pools} holds {pools.num_rows} anchors in {len(pools)} shards but {cfg.sentences} "
            f"holds {sentences.num_rows} sentences in {len(sentences)}: run mine again"
        )
    table = sentences.read_table([S.ID, S.TEXT])
    ids = table[S.ID].combine_chunks()
    texts = table[S.TEXT].combine_chunks()
    sent_vectors = load_vectors(sent_emb, ids)
    positives, pos_facts, candidates, cand_emb = _open_positives(cfg, sent_emb, ids, sent_vectors)
    del sent_vectors
    mined = pools.manifest.get("params", {})
    if mined.get("min_pool", cfg.m) < cfg.m:
        log.warning(
            "sample: mine.min_pool=%s < sample.m=%d: short pools were not topped up to m",
            mined.get("min_pool"),
            cfg.m,
        )
    params = cfg.model_dump(exclude={"output", "metrics", "threads"})
    fp = fingerprint(
        STAGE,
        params,
        {
            "sentences": sentences,
            "pools": pools,
            "embeddings": sent_emb,
            "candidates": candidates,
            "candidate_embeddings": cand_emb,
        },
    )
    writer = DatasetWriter(
        cfg.output, S.PAIRS, stage=STAGE, params=cfg.model_dump(), fingerprint=fp, name=cfg.output
    )
    todo = [i for i in range(len(pools)) if not writer.is_done(i)]
    edit_s, edit_pairs = 0.0, 0
    if todo:
        edit_strings, positives = _edit_strings(cfg, texts, positives)
        pos_rows = positives[S.ROW].to_numpy()
        corpus = ArrowTexts(texts)
        bar = Progress("sample", total=len(pools), skipped=len(pools) - len(todo), enabled=progress)
        for i in todo:
            shard = pools.read_shard(i)
            parts, counts = [], {}
            # In anchor batches: the scores of one batch's pools are held at a time.
            for j, start in enumerate(range(0, max(shard.num_rows, 1), cfg.anchor_batch)):
                part = shard.slice(start, cfg.anchor_batch)
                rows = part[S.ROW].to_numpy()
                lo, hi = np.searchsorted(pos_rows, [rows[0], rows[-1] + 1]) if len(rows) else (0, 0)
                out, part_counts, seconds = sample_shard(
                    part, positives.slice(lo, hi - lo), corpus, ids, edit_strings, cfg, i, j
                )
                parts.append(out)
                for key, value in part_counts.items():
                    counts[key] = counts.get(key, 0) + value
                edit_s += seconds
                edit_pairs += part_counts["edit_pairs"]
            out = pa.concat_tables(parts)
            writer.write(i, out, counts)
            bar.advance(done=1, rows=out.num_rows)
        bar.close()
    totals: dict[str, int] = {}
    for info in writer.finished_shards():
        for key, value in info.counts.items():
            totals[key] = totals.get(key, 0) + value
    if pools.num_rows and totals.get("negative_candidates", 0) == 0:
        raise PairforgeError(
            f"sample: every negative pool in {cfg.pools} is empty: nothing to sample. Check "
            "mine.band_low/band_high against the encoder's cosines (metrics/mine.json), or "
            "mine with fallback: random"
        )
    card_text = _card(cfg, sentences, pools, sent_emb, totals, pos_facts, writer)
    manifest = writer.finalize(len(pools), extra={"card": CARD})
    dists = _post_stats(cfg.output)
    card_text = card_text(dists)
    atomic_write_bytes(Path(cfg.output) / CARD, card_text.encode())
    metrics = {
        "anchors": pools.num_rows,
        "rows": manifest["rows"],
        "counts": totals,
        "candidates": pos_facts,
        "entropy_ratio": {side: dists[f"{side}_entropy"] for side in ("negative", "positive")},
        "scores": {k: v for k, v in dists.items() if not k.endswith("entropy")},
        "edit": {
            "kind": cfg.edit_kind,
            "normalized": cfg.edit_normalized,
            "metric": cfg.edit_metric,
            "scoring_seconds": round(edit_s, 3),
            # Scoring of this run's shards: distances, eqs. 1-6 and the draws.
            "pairs_per_second": round(edit_pairs / edit_s) if edit_s > 0 else None,
        },
        "params": {
            k: params[k] for k in ("m", "m_positive", "lambda_n", "lambda_p", "temperature", "seed")
        },
        "computed_shards": len(todo),
        "shards": len(pools),
        "seconds": round(time.monotonic() - t_start, 3),
    }
    Path(cfg.metrics).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(Path(cfg.metrics), metrics)
    ent = metrics["entropy_ratio"]["negative"]
    log.info(
        "sample: %d rows, %d negatives and %d positives sampled; P_neg entropy ratio mean %s "
        "(1 = uniform); %d anchors short of negatives, %d without a positive",
        metrics["rows"],
        totals.get("negatives_sampled", 0),
        totals.get("positives_sampled", 0),
        ent.get("mean"),
        totals.get("short_negatives", 0),
        totals.get("no_positive", 0),
    )
    return metrics


def _card(cfg, sentences, pools, sent_emb, totals, pos_facts, writer):
    """The card renderer, with everything known before the post-pass statistics."""
    ingest = sentences.manifest.get("params", {})
    mined = pools.manifest.get("params", {})
    mining = {**mined, "index": pools.manifest.get("index", {})}
    shown = [
        "anchors",
        "rows",
        "dropped_short",
        "negatives_sampled",
        "positives_sampled",
        "negative_candidates",
        "positive_candidates",
        "short_negatives",
        "no_positive",
        "random_negatives",
        "identical_skipped",
        "positive_text_missing",
        "view1_text_missing",
        "view2_text_missing",
    ]
    counts = {k: totals.get(k, 0) for k in shown}
    source = {
        "path": cfg.output,
        "corpus_name": cfg.corpus_name,
        "corpus_license": cfg.corpus_license,
        "sentences": sentences.num_rows,
        "inputs": [str(x) for x in ingest.get("inputs", [])],
        "augmentations": f"{pos_facts.get('rows', 0):,} candidates ({pos_facts.get('status')})",
    }
    columns = [(f.name, str(f.type)) for f in S.PAIRS.schema]

    def render(dists):
        return render_card(
            name=cfg.corpus_name,
            schema_doc=S.PAIRS.doc,
            columns=columns,
            params=cfg.model_dump(),
            encoder=encoder_info(sent_emb),
            mining=mining,
            counts=counts,
            distributions=dists,
            source=source,
        )

    return render


@cli_errors
def command(
    m: Annotated[int | None, typer.Option(help="Negatives drawn per anchor.")] = None,
    m_positive: Annotated[
        int | None, typer.Option(help="Positives drawn per anchor (default m).")
    ] = None,
    lambda_n: Annotated[float | None, typer.Option(help="Eq. 3 weight of semantics (0-1).")] = None,
    lambda_p: Annotated[float | None, typer.Option(help="Eq. 5 weight of semantics (0-1).")] = None,
    temperature: Annotated[
        float | None, typer.Option(help="Softmax temperature (1 = paper).")
    ] = None,
    edit_kind: Annotated[str | None, typer.Option(help="Edit distance unit: word or char.")] = None,
    edit_normalized: Annotated[
        bool | None, typer.Option(help="Normalise the edit distance to [0, 1].")
    ] = None,
    edit_metric: Annotated[str | None, typer.Option(help="levenshtein or indel.")] = None,
    identical: Annotated[
        str | None, typer.Option(help="Candidates equal to the anchor: skip or keep.")
    ] = None,
    short: Annotated[
        str | None, typer.Option(help="Anchors short of negatives: keep, drop or error.")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Sampling seed.")] = None,
    threads: Annotated[int | None, typer.Option(help="rapidfuzz threads (-1: all).")] = None,
    sentences: Annotated[str | None, typer.Option(help="Sentences dataset folder.")] = None,
    pools: Annotated[str | None, typer.Option(help="Pools dataset folder.")] = None,
    candidates: Annotated[str | None, typer.Option(help="Candidates dataset folder.")] = None,
    embeddings: Annotated[str | None, typer.Option(help="Sentence embeddings folder.")] = None,
    candidate_embeddings: Annotated[
        str | None, typer.Option(help="Candidate embeddings folder.")
    ] = None,
    positive_route: Annotated[
        str | None, typer.Option(help="Route of positive_text (DenoSent).")
    ] = None,
    view1_route: Annotated[str | None, typer.Option(help="Route of view1_text (BSL).")] = None,
    view2_route: Annotated[str | None, typer.Option(help="Route of view2_text (BSL).")] = None,
    corpus_name: Annotated[str | None, typer.Option(help="Corpus name for the card.")] = None,
    corpus_license: Annotated[str | None, typer.Option(help="Corpus licence for the card.")] = None,
    output: Annotated[str | None, typer.Option(help="Pairs dataset folder.")] = None,
    metrics: Annotated[str | None, typer.Option(help="Metrics JSON path.")] = None,
    params: ParamsOpt = "params.yaml",
    progress: ProgressOpt = True,
) -> None:
    """Sample DebCSE positives and hard negatives by inverse propensity weighting (eqs. 1-6).

    Every option defaults to the key of the same name in the `sample` section of params.yaml.
    Writes the training pairs with every score used, and a dataset card beside the shards.
    """
    overrides = {k: v for k, v in locals().items() if k in SampleConfig.model_fields}
    cfg = stage_config(STAGE, SampleConfig, params, overrides)
    run(cfg, progress=progress)


@cli_errors
def export_command(
    input: Annotated[str, typer.Option("--input", help="Pairs dataset folder.")] = "data/pairs",
    output: Annotated[
        str, typer.Option(help="Output folder (Hugging Face Hub layout).")
    ] = "data/export/sentence-transformers",
    format: Annotated[str, typer.Option("--format", help="triplet, n-tuple or pair.")] = "triplet",
    m: Annotated[
        int | None,
        typer.Option(help="n-tuple: negatives per row (default: sample.m of the dataset)."),
    ] = None,
) -> None:
    """Export a pairs dataset to the sentence-transformers (anchor, positive, negative) layout."""
    from stages.mining.export import FORMATS, write_export

    if format not in FORMATS:
        raise ConfigError(
            f"export: --format {format!r} is not allowed; allowed values: {', '.join(FORMATS)}"
        )
    ds = open_dataset(input, S.PAIRS)
    params = ds.manifest.get("params", {})
    m = m if m is not None else int(params.get("m", 2))
    totals = write_export(
        list(ds.iter_shards([S.TEXT, S.POSITIVE_TEXTS, S.NEGATIVE_TEXTS])),
        Path(output),
        format,  # type: ignore[arg-type]
        m,
        {
            "name": params.get("corpus_name", "pairs"),
            "license": params.get("corpus_license", "other"),
            "source": input,
        },
    )
    typer.echo(
        f"export: {totals.get('rows', 0):,} {format} rows from {totals.get('anchors', 0):,} anchors -> {output}"
    )
    skipped = {k: v for k, v in totals.items() if k not in ("rows", "anchors") and v}
    if skipped:
        typer.echo(
            "export: anchors without a row: " + ", ".join(f"{k} {v:,}" for k, v in skipped.items())
        )
