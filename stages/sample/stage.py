"""sample: DebCSE inverse-propensity-weighted sampling of positives and negatives -> ``data/pairs``.

Per anchor, score then decide:

1. **Score** every candidate of its negative pool (from ``mine``) and of its positive pool (its
   augmentations: the back-translations of ``candidates`` and the LLM rewrites of ``rewrites``,
   route ``llm``; copies identical to the anchor skipped and counted): edit distance to
   the anchor (``edit_kind``/``edit_normalized``/``edit_metric``; ``edit_backend``: the numba
   kernels by default, rapidfuzz as the reference and fallback, the same distances), cosine,
   S_sur and S_sem (eqs. 1-2), P_neg (eqs. 3-4, λn) and P_pos (eqs. 5-6, λp), softmax
   ``temperature``.
2. **Draw** ``m`` negatives and ``m_positive`` positives without replacement from P. ``draws:
   keyed`` (the default) gives each candidate a random number hashed from (seed, anchor,
   candidate), so the same input and seed give the same pairs resumed or not, sharded or batched
   any way, and pools that differ in a few anchors (another machine's last bits) give pairs that
   differ in those anchors only; ``draws: stream`` seeds one generator per shard and batch.
3. Pick the single-view columns: ``positive_text`` (DenoSent, route ``positive_route``),
   ``view1_text`` / ``view2_text`` (BSL, ``view1_route`` / ``view2_route``).

Default edit distance: **word-level, normalised Levenshtein**. Normalised, because eq. 1 puts the
distance inside ``exp``: raw distances tens of operations apart collapse the softmax onto one
candidate. Word-level, because the surface similarity DebCSE wants in a hard negative is shared
wording (its own diagnostic, Tables 1 and 4, counts shared words), and a word edit counts a
changed word once where a character distance counts its letters, so long words and morphology do
not dominate; it is also the fast path: each corpus sentence and candidate is encoded once per
run into word codes, then pairs are scored by row with compiled bit-parallel kernels
(benchmarks/edit_throughput.py).

Output: ``data/pairs`` (``pairs`` schema), shard ``i`` for anchor shard ``i``, with a dataset card
(``README.md``) beside ``data/``; metrics: counts, entropy ratios of P, score distributions.
``pairforge export`` writes the sentence-transformers layouts.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.config import StageConfig
from pairforge.pipeline.plumbing.errors import DataIntegrityError, PairforgeError
from pairforge.pipeline.plumbing.files import atomic_write_bytes
from pairforge.pipeline.plumbing.runner import (
    Executor,
    LocalExecutor,
    ShardResult,
    pending,
)
from pairforge.pipeline.plumbing.shards import Dataset, DatasetWriter, open_dataset, work_folder
from pairforge.pipeline.plumbing.stagedefs import StageDef
from pairforge.pipeline.plumbing.stagerun import StageRun
from pairforge.pipeline.plumbing.storage import dataset_path
from pairforge.pipeline.science.dataset_card import (
    CARD,
    distribution,
    effective_number,
    render_card,
    sharpness,
    sharpness_section,
)
from pairforge.pipeline.science.mining_inputs import (
    ArrowTexts,
    encoder_info,
    open_embeddings,
    spill_vectors,
)
from pairforge.stages.options import executor, stage_command
from pairforge.stages.sample.edits import PairScorer, edit_scorer
from pairforge.stages.sample.ipw import IpwForm
from pairforge.stages.sample.sampling import (
    EDIT_INDEX,
    PositiveSource,
    open_positives,
    sample_shard,
)
from pydantic import Field, model_validator

log = logging.getLogger("pairforge")

SHARPNESS_KEYS = ("entropy", "entropy2", "effective", "effective_share")


class SampleConfig(StageConfig):
    """The ``sample`` section of params.yaml."""

    sentences: str = Field("data/sentences", description="sentences dataset folder")
    pools: str = Field("data/pools", description="pools dataset folder")
    embeddings: str = Field("data/embeddings/sentences", description="sentence embeddings folder")
    candidates: str | None = Field(
        "data/candidates", description="back-translation candidates (positives); null: none"
    )
    candidate_embeddings: str = Field(
        "data/embeddings/candidates", description="candidate embeddings folder"
    )
    rewrites: str | None = Field(
        "data/rewrites", description="LLM rewrites (rewrite stage), more positives; null: none"
    )
    rewrite_embeddings: str = Field(
        "data/embeddings/rewrites", description="LLM rewrite embeddings folder"
    )
    output: str = Field("data/pairs", description="pairs dataset folder")
    metrics: str = Field("metrics/sample.json", description="metrics JSON path")
    m: int = Field(2, ge=1, description="negatives drawn per anchor (DebCSE: 2)")
    m_positive: int | None = Field(None, ge=1, description="positives per anchor; null: m")
    lambda_n: float = Field(0.8, ge=0.0, le=1.0, description="eq. 3 weight of semantics")
    lambda_p: float = Field(0.8, ge=0.0, le=1.0, description="eq. 5 weight of semantics")
    ipw: IpwForm = Field(
        "calibrated",
        description="paper: eqs. 1-6 as printed (near-uniform P); calibrated: one softmax over "
        "z-scored edit and cosine at `temperature` (stages/sample/ipw.py); uniform: P = 1/n "
        "within each pool, no debiasing (a control: the band alone decides)",
    )
    temperature: float = Field(
        0.5,
        gt=0.0,
        description="paper: every softmax's temperature (1 = the paper); calibrated: tau",
    )
    negative_sampler: Literal["ipw", "top", "simans"] = Field(
        "ipw",
        description="how negatives are drawn from what the rules keep: ipw (P from `ipw`), top "
        "(the m most similar), simans (p ~ exp(-a (cos - s+ - b)^2); stages/sample/selection.py)",
    )
    range_min: int = Field(
        0, ge=0, description="skip each pool's range_min most similar candidates (rank window)"
    )
    range_max: int | None = Field(
        None, ge=1, description="keep only each pool's range_max most similar; null: all"
    )
    absolute_margin: float | None = Field(
        None, ge=0.0, description="keep a negative only if cos <= s+ - absolute_margin; null: off"
    )
    relative_margin: float | None = Field(
        None,
        ge=0.0,
        lt=1.0,
        description="keep a negative only if cos <= s+ * (1 - relative_margin) (0.05: NV-Retriever's "
        "TopK-PercPos, 95% of the positive's score); null: off",
    )
    positive_reference: Literal["best", "fixed"] = Field(
        "best",
        description="s+ of the margins and SimANS: best (the cosine of the anchor's most similar "
        "positive candidate; positive_score without one) or fixed (positive_score for every anchor: "
        "dropout positives)",
    )
    positive_score: float = Field(
        1.0, ge=-1.0, le=1.0, description="s+ where there is no positive candidate, or fixed"
    )
    simans_a: float = Field(1.0, gt=0.0, description="SimANS: a (the weights' sharpness)")
    simans_b: float = Field(0.0, description="SimANS: b (shift of the peak from s+)")
    edit_kind: Literal["word", "char"] = Field(
        "word", description="edit distance unit: word or char"
    )
    edit_normalized: bool = Field(True, description="normalise the edit distance to [0, 1]")
    edit_metric: Literal["levenshtein", "indel"] = Field(
        "levenshtein", description="levenshtein or indel"
    )
    edit_backend: Literal["numba", "rapidfuzz"] = Field(
        "numba",
        description="numba: compiled kernels over texts encoded once (falls back to rapidfuzz "
        "with a warning when numba cannot run); rapidfuzz: the reference; same distances",
    )
    identical: Literal["skip", "keep"] = Field("skip", description="candidates equal to the anchor")
    short: Literal["keep", "drop", "error"] = Field(
        "keep", description="anchors with fewer than m negatives: keep (flagged), drop, error"
    )
    positive_route: str = Field("en-zh-en", description="route of positive_text (DenoSent)")
    view1_route: str = Field("en-de-en", description="route of view1_text (BSL)")
    view2_route: str = Field("en-fr-en", description="route of view2_text (BSL)")
    seed: int = Field(0, description="sampling seed")
    draws: Literal["keyed", "stream"] = Field(
        "keyed",
        description="keyed: each candidate's random number hashed from (seed, anchor, candidate), "
        "so an anchor's draw depends on its own pool alone (not on other anchors, shards, anchor "
        "batches or pool order); stream: one generator per (seed, shard, anchor batch), the "
        "earlier scheme, which benchmarks/quality.py keeps for its records (a pool that differs "
        "shifts every later draw of its batch)",
    )
    threads: int = Field(-1, description="edit-distance threads (numba or rapidfuzz); -1: all")
    anchor_batch: int = Field(
        16384,
        ge=1,
        description="anchors scored at once (bounds memory; with draws: stream, seeds the draws)",
    )
    corpus_name: str = Field("corpus", description="corpus name, for the dataset card")
    corpus_license: str = Field("unknown", description="licence of the corpus text, for the card")
    corpus_source: str | None = Field(
        None, description="the corpus's Hub dataset id, for the card's source_datasets"
    )

    @model_validator(mode="after")
    def _window(self) -> SampleConfig:
        if self.range_max is not None and self.range_max <= self.range_min:
            raise ValueError(
                f"range_max ({self.range_max}) must exceed range_min ({self.range_min})"
            )
        return self


STAGE = StageDef(
    name="sample",
    module=__name__,
    config=SampleConfig,
    inputs=(
        "${sample.sentences}",
        "${sample.pools}",
        "${sample.embeddings}",
        "${sample.candidates}",
        "${sample.candidate_embeddings}",
        "${sample.rewrites}",
        "${sample.rewrite_embeddings}",
    ),
    outputs=("output", "metrics"),
    datasets=("output",),
    # The numba and rapidfuzz backends give equal distances.
    free=("edit_backend", "threads"),
    headlines={"rows_out": "rows"},
)


# --- the stage --------------------------------------------------------------------------------


def _scorer(cfg: SampleConfig, texts: pa.Array, positives: pa.Table) -> tuple[PairScorer, pa.Table]:
    """The edit-distance scorer over the corpus and the positive candidates (each text encoded
    once), and the positives with their row in its candidate encoding."""
    scorer = edit_scorer(
        texts,
        positives[S.TEXT].combine_chunks(),
        cfg.edit_kind,
        cfg.edit_normalized,
        cfg.edit_metric,
        cfg.edit_backend,
        cfg.threads,
    )
    index = pa.array(np.arange(positives.num_rows, dtype=np.int64))
    return scorer, positives.append_column(EDIT_INDEX, index)


def _route_counts(positives: pa.Table) -> dict[str, int]:
    """Positive candidates per route over all sources (``llm``: the LLM rewrites)."""
    counts = pc.value_counts(positives[S.ROUTE].combine_chunks()).to_pylist()
    return {c["values"]: c["counts"] for c in sorted(counts, key=lambda c: c["values"])}


def _post_stats(path: str) -> dict[str, dict[str, Any]]:
    """Score distributions of the sampled items and entropy ratios, read back from the shards."""
    cols = [f"{side}_{s}" for side in ("negative", "positive") for s in ("cos", "edit", "prob")]
    cols += ["negative_entropy", "positive_entropy"]
    sizes = ["negative_pool_size", "positive_pool_size"]
    table = open_dataset(path, S.PAIRS).read_table(cols + sizes)
    dists = {}
    for side in ("negative", "positive"):
        ratio, eff, share = effective_number(table[f"{side}_entropy"], table[f"{side}_pool_size"])
        dists[f"{side}_entropy2"] = distribution(ratio, 6)
        dists[f"{side}_effective"] = distribution(eff, 3)
        dists[f"{side}_effective_share"] = distribution(share, 4)
    for c in cols:
        col = table[c]
        if pa.types.is_list(col.type):
            col = pc.list_flatten(col)
        values = col.to_numpy(zero_copy_only=False).astype(np.float64) if len(col) else np.empty(0)
        # Entropy ratios sit within 1e-4 of 1 under the paper's equations: keep the digits.
        dists[c] = distribution(values, 6 if c.endswith("entropy") else 4)
    return dists


def _open_inputs(cfg: SampleConfig) -> dict[str, Any]:
    """Every input of the stage, opened and checked: the datasets, the corpus ids and texts by
    row, and the positive pools (``open_positives``). The driver and each Dask worker call it
    (workers read the datasets from the shared filesystem rather than receive them)."""
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
    # The sentences' vectors (for the positives' cosines) spilled to a folder of this process's
    # own under <output>/_work and mapped: the candidates' gathers release their pages shard by
    # shard. The file is unlinked at once (the mapping keeps it readable), so a worker's copy
    # never outlives its process; the run's end removes _work (and a killed spill's leftovers).
    work_folder(cfg.output).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="vectors-", dir=work_folder(cfg.output)))
    mapped = spill_vectors(sent_emb, ids, work)
    mapped.path.unlink()
    work.rmdir()
    sources = [
        PositiveSource("candidates", cfg.candidates, cfg.candidate_embeddings, "candidates"),
        PositiveSource("rewrites", cfg.rewrites, cfg.rewrite_embeddings, "rewrites"),
    ]
    positives, pos_facts, pos_datasets = open_positives(sources, sent_emb, ids, mapped)
    return dict(
        sentences=sentences,
        pools=pools,
        sent_emb=sent_emb,
        ids=ids,
        texts=texts,
        positives=positives,
        pos_facts=pos_facts,
        pos_datasets=pos_datasets,
    )


# The scoring state of the run a worker process last served, by the run's key: built once per
# process (reading the inputs and encoding every text), not once per task.
_STATE: dict[str, dict[str, Any]] = {}
_STATE_LOCK = threading.Lock()


class SampleShard:
    """The per-shard work of ``sample``: one pools shard (and its index, which seeds stream draws)
    -> its ``pairs`` rows and counts, and facts (scoring seconds, backend) for the metrics.

    Picklable for Dask: what travels is the config and the run's key; a worker opens the inputs
    and builds the edit scorer on its first shard and keeps them for the run's later shards.
    In-process, the driver's already-opened inputs are reused (``inputs``).
    """

    def __init__(self, cfg: SampleConfig, key: str, inputs: dict[str, Any] | None = None):
        self.cfg = cfg
        self.key = key
        if inputs is not None:
            with _STATE_LOCK:
                _STATE.clear()  # one run's state per process: memory stays bounded
                _STATE[key] = {"inputs": inputs}

    def __getstate__(self) -> dict[str, Any]:
        return {"cfg": self.cfg.model_dump(), "key": self.key}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.cfg = SampleConfig(**state["cfg"])
        self.key = state["key"]

    def _state(self) -> dict[str, Any]:
        with _STATE_LOCK:
            state = _STATE.get(self.key)
            if state is None:
                _STATE.clear()
                state = _STATE[self.key] = {"inputs": _open_inputs(self.cfg)}
            if "scorer" not in state:
                inputs = state["inputs"]
                scorer, positives = _scorer(self.cfg, inputs["texts"], inputs["positives"])
                state.update(
                    scorer=scorer,
                    positives=positives,
                    pos_rows=positives[S.ROW].to_numpy(),
                    corpus=ArrowTexts(inputs["texts"]),
                    reported=False,
                )
            return state

    def __call__(self, shard: pa.Table, i: int) -> ShardResult:
        state = self._state()
        scorer, positives, pos_rows = state["scorer"], state["positives"], state["pos_rows"]
        ids = state["inputs"]["ids"]
        batch = self.cfg.anchor_batch
        parts, counts, seconds = [], {}, 0.0
        # In anchor batches: the scores of one batch's pools are held at a time.
        for j, start in enumerate(range(0, max(shard.num_rows, 1), batch)):
            part = shard.slice(start, batch)
            rows = part[S.ROW].to_numpy()
            lo, hi = np.searchsorted(pos_rows, [rows[0], rows[-1] + 1]) if len(rows) else (0, 0)
            out, part_counts, part_s = sample_shard(
                part,
                positives.slice(lo, hi - lo),
                state["corpus"],
                ids,
                scorer,
                self.cfg,
                i,
                j,
            )
            parts.append(out)
            for key, value in part_counts.items():
                counts[key] = counts.get(key, 0) + value
            seconds += part_s
        facts: dict[str, Any] = {"scoring_seconds": seconds, "edit_pairs": counts["edit_pairs"]}
        if not state["reported"]:
            # Once per process: how this process's scorer was had (encoding, kernels).
            state["reported"] = True
            facts["scorer"] = {
                "backend": scorer.backend,
                "encode_seconds": scorer.encode_seconds,
                "kernels": scorer.kernels,
                "compile_seconds": scorer.compile_seconds,
            }
        return ShardResult({"pairs": pa.concat_tables(parts)}, counts, facts)


def run(
    cfg: SampleConfig, progress: bool = True, executor: Executor | None = None
) -> dict[str, Any]:
    """Score and sample every anchor, on ``executor`` (default: in this process, one shard
    after another); returns the metrics written to ``cfg.metrics``. The pairs are the same
    bytes whichever executor computes them: draws are keyed by anchor and candidate (or seeded
    by shard and anchor batch)."""
    with StageRun(STAGE, cfg, executor, progress) as run:
        inputs = _open_inputs(cfg)
        _warn_unfilled_pools(cfg, inputs["pools"])
        # The writer is fingerprinted by the config and every input dataset, so that a run
        # resumes only over the same inputs. Threads and the backend are free keys (the
        # backends give equal distances): a run may resume with others.
        run.depend("sentences", inputs["sentences"])
        run.depend("pools", inputs["pools"])
        run.depend("embeddings", inputs["sent_emb"])
        for name, dataset in inputs["pos_datasets"].items():  # candidates, their embeddings...
            run.depend(name, dataset)
        writer = run.output("output", S.PAIRS)
        todo = pending([writer], len(inputs["pools"]))
        shard_facts = _sample_shards(run, inputs, writer, todo)
        totals = _totals(cfg, inputs["pools"], writer)
        rows, dists = _finish_dataset(cfg, inputs, writer, totals)
        metrics = _metrics(cfg, inputs, rows, totals, dists, _edit_facts(shard_facts), len(todo))
        run.finish(metrics, timed=True)
        _log_summary(metrics, totals)
        return metrics


def _warn_unfilled_pools(cfg: SampleConfig, pools: Dataset) -> None:
    """Warn when the pools were mined with ``min_pool`` below ``m``: short pools were not
    topped up, so anchors may fall under the ``short`` policy."""
    mined = pools.manifest.get("params", {})
    if mined.get("min_pool", cfg.m) < cfg.m:
        log.warning(
            "sample: mine.min_pool=%s < sample.m=%d: short pools were not topped up to m",
            mined.get("min_pool"),
            cfg.m,
        )


def _sample_shards(
    run: StageRun, inputs: dict[str, Any], writer: DatasetWriter, todo: list[int]
) -> list[dict[str, Any]]:
    """Compute and write the pending shards ``todo`` (``SampleShard`` on the run's executor);
    returns each computed shard's facts (scoring seconds, edit pairs, scorer)."""
    if not todo:
        return []
    cfg = run.cfg
    in_process = isinstance(run.executor, LocalExecutor)
    # The run's key: its fingerprint and the settings outside it that a scorer depends on.
    key = f"{writer.fingerprint}:{cfg.edit_backend}:{cfg.threads}"
    fn = SampleShard(cfg, key, inputs if in_process else None)
    try:
        shard_facts = run.map(fn, inputs["pools"], {"pairs": writer}, with_index=True)
    finally:
        with _STATE_LOCK:
            _STATE.pop(key, None)
    return shard_facts


def _edit_facts(shard_facts: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's edit scoring figures from its shards' facts: ``scoring_seconds`` and
    ``edit_pairs`` summed, the scorer's ``backend``/``kernels`` and its ``encode_seconds`` /
    ``compile_seconds`` (the slowest process; None when no shard was computed)."""
    scorers = [f["scorer"] for f in shard_facts if "scorer" in f]
    backend, encode_s, compile_s, kernels = None, None, None, None
    if scorers:
        # Several worker processes each encode and load kernels: the slowest is what waited.
        backend, kernels = scorers[0]["backend"], scorers[0]["kernels"]
        encode_s = round(max(s["encode_seconds"] for s in scorers), 3)
        compiled = [s["compile_seconds"] for s in scorers if s["compile_seconds"] is not None]
        compile_s = round(max(compiled), 3) if compiled else None
    return {
        "scoring_seconds": sum(f["scoring_seconds"] for f in shard_facts),
        "edit_pairs": sum(f["edit_pairs"] for f in shard_facts),
        "backend": backend,
        "encode_seconds": encode_s,
        "kernels": kernels,
        "compile_seconds": compile_s,
    }


def _totals(cfg: SampleConfig, pools: Dataset, writer: DatasetWriter) -> dict[str, int]:
    """Every finished shard's counts summed; raises ``PairforgeError`` when no anchor had a
    negative candidate (nothing was sampled: the mining band is off)."""
    totals = StageRun.totals(writer)
    if pools.num_rows and totals.get("negative_candidates", 0) == 0:
        raise PairforgeError(
            f"sample: every negative pool in {cfg.pools} is empty: nothing to sample. Check "
            "mine.band_low/band_high against the encoder's cosines (metrics/mine.json), or "
            "mine with fallback: random"
        )
    return totals


# What a receiving team trains from: the encoder the pools and cosines were computed with (not
# how it ran: engine, device and precision are the embeddings manifest's).
ENCODER_FACTS = ("model", "pooling", "max_length", "prompt", "dim")


def _encoder(embeddings: Dataset) -> dict[str, Any]:
    info = encoder_info(embeddings)
    return {key: info.get(key) for key in ENCODER_FACTS}


def _finish_dataset(
    cfg: SampleConfig, inputs: dict[str, Any], writer: DatasetWriter, totals: dict[str, int]
) -> tuple[int, dict[str, dict[str, Any]]]:
    """Write the manifest, then the dataset card with the post-pass statistics read back from
    the shards; returns the dataset's rows and those statistics (``_post_stats``)."""
    render = _card(
        cfg,
        inputs["sentences"],
        inputs["pools"],
        inputs["sent_emb"],
        totals,
        inputs["pos_facts"],
        writer,
    )
    manifest = writer.finalize(
        len(inputs["pools"]), extra={"card": CARD, "encoder": _encoder(inputs["sent_emb"])}
    )
    if work_folder(cfg.output).exists():  # a killed run's spilled vectors
        shutil.rmtree(work_folder(cfg.output), ignore_errors=True)
    dists = _post_stats(cfg.output)
    atomic_write_bytes(dataset_path(cfg.output) / CARD, render(dists).encode())
    return manifest["rows"], dists


def _metrics(
    cfg: SampleConfig,
    inputs: dict[str, Any],
    rows: int,
    totals: dict[str, int],
    dists: dict[str, dict[str, Any]],
    edit: dict[str, Any],
    computed: int,
) -> dict[str, Any]:
    """The stage's metrics but ``seconds`` (added last by ``run``): counts, positive sources
    and routes, entropy ratios and sharpness of P, score distributions, edit scoring figures
    (``_edit_facts``), the draw params and the shards computed by this run."""
    pos_facts, edit_s = inputs["pos_facts"], edit["scoring_seconds"]
    return {
        "anchors": inputs["pools"].num_rows,
        "rows": rows,
        "counts": totals,
        "candidates": pos_facts["candidates"],
        "rewrites": pos_facts["rewrites"],
        "positive_routes": _route_counts(inputs["positives"]),
        "entropy_ratio": {side: dists[f"{side}_entropy"] for side in ("negative", "positive")},
        "sharpness": sharpness(dists, cfg.ipw, cfg.temperature),
        "scores": {k: v for k, v in dists.items() if not k.endswith(SHARPNESS_KEYS)},
        "edit": {
            "kind": cfg.edit_kind,
            "normalized": cfg.edit_normalized,
            "metric": cfg.edit_metric,
            "backend": edit["backend"],  # the one used (null: every shard was already done)
            "encode_seconds": edit["encode_seconds"],  # once per run: word codes / integer codes
            # numba: compiled now (a fresh install) or loaded from numba's cache, before any
            # scoring, so never part of pairs_per_second (null: rapidfuzz, or nothing to do)
            "kernels": edit["kernels"],
            "compile_seconds": edit["compile_seconds"],
            "scoring_seconds": round(edit_s, 3),
            # Scoring of this run's shards: distances, eqs. 1-6 and the draws.
            "pairs_per_second": round(edit["edit_pairs"] / edit_s) if edit_s > 0 else None,
        },
        "params": {
            k: getattr(cfg, k)
            for k in (
                "m",
                "m_positive",
                "lambda_n",
                "lambda_p",
                "ipw",
                "temperature",
                "negative_sampler",
                "range_min",
                "range_max",
                "absolute_margin",
                "relative_margin",
                "positive_reference",
                "positive_score",
                "simans_a",
                "simans_b",
                "seed",
                "draws",
            )
        },
        "computed_shards": computed,
        "shards": len(inputs["pools"]),
    }


def _log_summary(metrics: dict[str, Any], totals: dict[str, int]) -> None:
    """One log line: rows, draws, P_neg's mean entropy ratio, anchors short or without a
    positive."""
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
        "negatives_outside_rank_window",
        "negatives_above_positive_ceiling",
        "positive_candidates",
        "short_negatives",
        "no_positive",
        "random_negatives",
        "identical_skipped",
        "repeated_positive_text",
        "positive_text_missing",
        "view1_text_missing",
        "view2_text_missing",
    ]
    counts = {k: totals.get(k, 0) for k in shown}
    source = {
        "path": cfg.output,
        "corpus_name": cfg.corpus_name,
        "corpus_license": cfg.corpus_license,
        "corpus_source": cfg.corpus_source,
        "sentences": sentences.num_rows,
        "inputs": [str(x) for x in ingest.get("inputs", [])],
        "augmentations": "; ".join(
            f"{facts.get('rows', 0):,} {name} ({facts.get('status')}"
            + (f", engine {facts['engine']}" if facts.get("engine") else "")
            + ")"
            for name, facts in pos_facts.items()
        ),
    }
    columns = [(f.name, str(f.type)) for f in S.PAIRS.schema]

    def render(dists):
        card = render_card(
            name=cfg.corpus_name,
            schema_doc=S.PAIRS.doc,
            columns=columns,
            params=cfg.model_dump(),
            encoder=encoder_info(sent_emb),
            mining=mining,
            counts=counts,
            distributions={k: v for k, v in dists.items() if not k.endswith(SHARPNESS_KEYS[1:])},
            source=source,
        )
        # The sharpness section goes before the counts: whether the debiasing acted is the
        # first thing a user of the pairs should learn.
        section = sharpness_section(sharpness(dists, cfg.ipw, cfg.temperature))
        return card.replace("\n## Counts\n", f"\n{section}\n## Counts\n", 1)

    return render


@stage_command(STAGE)
def command(cfg: SampleConfig, workers: int, scheduler: str | None, progress: bool) -> None:
    """Sample DebCSE positives and hard negatives by inverse propensity weighting (eqs. 1-6).

    Every option defaults to the key of the same name in the `sample` section of params.yaml.
    Writes the training pairs with every score used, and a dataset card beside the shards.
    """
    with executor(workers, scheduler) as ex:
        run(cfg, progress=progress, executor=ex)
