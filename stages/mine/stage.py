"""mine: each sentence's DebCSE negative candidate pool, from a FAISS index over its embeddings.

One inner-product index over the L2-normalised sentence vectors (so scores are cosines): exact
(``IndexFlatIP``) up to ``flat_max`` sentences, IVF or HNSW beyond (``index``), on the GPU when
faiss-gpu sees one. For every anchor sentence: its ``k`` nearest neighbours, searched in batches
of ``query_batch`` queries (temporary memory stays bounded), then the pool rules of
``pipeline.science.pools``: not itself, not an exact or near duplicate (rapidfuzz ratio), not one of
its own augmentations (its back-translations in the candidates dataset and its LLM rewrites in the
rewrites dataset), cosine inside the band ``[band_low, band_high]``.
Anchors left with fewer than ``min_pool`` candidates get the ``fallback`` (widen the band, or
random sentences at or below ``band_high``), recorded on their row.

Output ``data/pools`` (``pools`` schema), shard ``i`` for the anchors of sentence shard ``i``;
a killed run resumes at the first unfinished anchor shard, with the index reloaded from
``<output>/_work`` when it was approximate (a trained IVF or HNSW index is costly to rebuild).
Metrics: the index (kind, build time, recall@k of an approximate index against exact search on a
seeded sample), pool sizes, short pools and fallbacks, exclusions by reason, and what each source
of own augmentations held (``augmentations``: the candidates; ``rewrites``).

Here: the config and the run (inputs, index, shards, manifest). Beside it: ``shard.py`` (the pure
per-shard function), ``searcher.py`` (the index built or reloaded, and searched), ``sharing.py``
(the index as the Dask workers read it) and ``metrics.py`` (what the run reports).
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np
import pyarrow as pa
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.config import StageConfig
from pairforge.pipeline.plumbing.errors import ConfigError, PairforgeError
from pairforge.pipeline.plumbing.runner import (
    Executor,
    LocalExecutor,
    ShardResult,
    pending,
)
from pairforge.pipeline.plumbing.shards import (
    Dataset,
    DatasetWriter,
    open_dataset,
    work_folder,
)
from pairforge.pipeline.plumbing.stagedefs import StageDef
from pairforge.pipeline.plumbing.stagerun import StageRun
from pairforge.pipeline.plumbing.storage import RemotePath, dataset_path, is_url, remove_tree
from pairforge.pipeline.science.mining_inputs import (
    VECTOR_FILE,
    ArrowTexts,
    MappedVectors,
    merge_augmentations,
    no_release,
    open_embeddings,
    own_augmentations,
    spill_vectors,
)
from pairforge.stages.mine.metrics import SearchFacts, band_coverage, log_summary, stage_metrics
from pairforge.stages.mine.shard import anchor_table, mine_shard
from pairforge.stages.mine.sharing import (
    SEARCH_FILE,
    fetch_index,
    share_index,
    write_search_index,
)
from pairforge.stages.options import executor, stage_command
from pydantic import Field, model_validator

if TYPE_CHECKING:
    # FAISS loads with the searcher: only when the stage runs, not with its config.
    from pairforge.stages.mine.searcher import Searcher

log = logging.getLogger("pairforge")

GPU_MAX_K = 2048  # faiss's GPU k-selection limit


class MineConfig(StageConfig):
    """The ``mine`` section of params.yaml."""

    sentences: str = Field("data/sentences", description="sentences dataset folder")
    embeddings: str = Field("data/embeddings/sentences", description="sentence embeddings folder")
    candidates: str | None = Field(
        "data/candidates",
        description="candidates dataset: the anchors' own augmentations, never their negatives",
    )
    rewrites: str | None = Field(
        "data/rewrites",
        description="the anchors' LLM rewrites (rewrite stage): own augmentations too; null: none",
    )
    output: str = Field("data/pools", description="pools dataset folder")
    metrics: str = Field("metrics/mine.json", description="metrics JSON path")
    k: int = Field(64, ge=1, description="neighbours retrieved per anchor first (itself excluded)")
    pool_cap: int | None = Field(
        1024,
        ge=1,
        description="k doubles while an anchor's band lasts, up to this many neighbours; "
        "null: k only",
    )
    band_low: float = Field(
        0.25, ge=-1.0, le=1.0, description="lowest cosine of a negative candidate"
    )
    band_high: float = Field(
        0.75, ge=-1.0, le=1.0, description="highest cosine of a negative candidate"
    )
    near_duplicate_threshold: float | None = Field(
        90.0,
        ge=0.0,
        le=100.0,
        description="rapidfuzz ratio (0-100) from which a neighbour is a near duplicate; null: off",
    )
    min_pool: int = Field(
        2, ge=1, description="pool size below which the fallback applies (sample.m)"
    )
    fallback: Literal["none", "widen", "random"] = Field(
        "random", description="short pools: none, widen or random"
    )
    widen_step: float = Field(0.05, gt=0.0, description="band widening per step")
    widen_limits: tuple[float, float] = (-1.0, 0.9)
    index: Literal["auto", "flat", "ivf", "hnsw"] = Field(
        "auto", description="auto, flat, ivf or hnsw"
    )
    flat_max: int = Field(50_000, ge=1, description="auto: exact search up to this many sentences")
    nlist: int | None = Field(None, ge=1, description="IVF cells (default 4 sqrt(n))")
    nprobe: int | None = Field(None, ge=1, description="IVF cells scanned per query")
    ivf_codec: Literal["flat", "sq8", "sq6", "sq4"] = Field(
        "sq8",
        description="IVF storage: full vectors, or 8-, 6-, 4-bit scalars (rescored exactly)",
    )
    train_size: int | None = Field(None, ge=1, description="IVF k-means sample (default 40 nlist)")
    train_iterations: int = Field(10, ge=1, description="IVF k-means rounds")
    hnsw_m: int = Field(32, ge=4, description="HNSW links per node")
    ef_construction: int = Field(200, ge=8, description="HNSW build beam width")
    ef_search: int = Field(128, ge=8, description="HNSW search beam width")
    use_gpu: Literal["auto", "yes", "no"] = Field("auto", description="auto, yes or no")
    search_engine: Literal["auto", "faiss", "torch"] = Field(
        "auto",
        description="faiss, or torch's exact search (auto: torch on a GPU faiss cannot use)",
    )
    query_batch: int = Field(8192, ge=1, description="queries per FAISS search call")
    anchor_batch: int = Field(
        16384, ge=1, description="anchors whose neighbours are held at once (bounds memory)"
    )
    recall_sample: int = Field(
        1000, ge=0, description="anchors for the recall and band-coverage checks; 0: skip"
    )
    seed: int = Field(0, description="seed of IVF training, recall sample, random fills")
    threads: int = Field(-1, description="rapidfuzz and FAISS threads; -1: all cores")

    @model_validator(mode="after")
    def _band_order(self) -> MineConfig:
        if self.pool_cap is not None and self.pool_cap < self.k:
            raise ValueError(
                f"pool_cap ({self.pool_cap}) must be at least k ({self.k}), or null for k only"
            )
        if self.band_low > self.band_high:
            raise ValueError(
                f"band_low ({self.band_low}) must not exceed band_high ({self.band_high})"
            )
        lo, hi = self.widen_limits
        if self.fallback == "widen" and not (
            -1.0 <= lo <= self.band_low and self.band_high <= hi <= 1.0
        ):
            raise ValueError(
                f"widen_limits {list(self.widen_limits)} must contain the band "
                f"[{self.band_low}, {self.band_high}] within [-1, 1]"
            )
        return self


STAGE = StageDef(
    name="mine",
    module=__name__,
    config=MineConfig,
    inputs=(
        "${mine.sentences}",
        "${mine.embeddings}",
        "${mine.candidates}",
        "${mine.rewrites}",
    ),
    outputs=("output", "metrics"),
    datasets=("output",),
    free=("query_batch", "anchor_batch", "threads"),
    headlines={"rows_out": "anchors", "pool_p50": "pool_size.p50"},
)


# --- the stage --------------------------------------------------------------------------------


def _open_augmentations(path: str | None) -> Dataset | None:
    """An own-augmentations dataset (``candidates`` schema, checked here), None when disabled or
    absent."""
    return open_dataset(path, S.CANDIDATES) if path and dataset_path(path).exists() else None


def _threads(n: int) -> None:
    if n > 0:
        import faiss

        faiss.omp_set_num_threads(n)


# The search state of the run a worker process last served, by the run's key: the index mapped
# from disk and the corpus read once per process, not once per task.
_STATE: dict[str, dict[str, Any]] = {}
_STATE_LOCK = threading.Lock()


class MineShard:
    """The query side of ``mine``: one shard's anchor table (``id``, ``row``,
    ``augmentations``) -> its ``pools`` rows and counts, and its seconds (``facts``).

    Picklable for Dask: what travels is the config, the run's key and the path of the index the
    driver built and wrote once (``<output>/_work/search.faiss``); each worker process reads it
    with ``faiss.IO_FLAG_MMAP`` (the index's vectors and lists stay in the page cache, shared by
    the workers of a machine) and the corpus (ids, texts; the vectors when the index does not
    hold them) from the shared filesystem, once. When the output is in a store the index and the
    vectors are copied there and each worker fetches them once (:func:`share_index`), so the
    workers need no filesystem shared with the driver. In-process, the driver's searcher is used.
    """

    def __init__(
        self, cfg: MineConfig, key: str, index_path: str, state: dict[str, Any] | None = None
    ):
        self.cfg, self.key, self.index_path = cfg, key, index_path
        if state is not None:
            with _STATE_LOCK:
                _STATE.clear()  # one run's state per process: memory stays bounded
                _STATE[key] = state

    def __getstate__(self) -> dict[str, Any]:
        return {"cfg": self.cfg.model_dump(), "key": self.key, "index_path": self.index_path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.cfg = MineConfig(**state["cfg"])
        self.key, self.index_path = state["key"], state["index_path"]

    def _state(self) -> dict[str, Any]:
        with _STATE_LOCK:
            state = _STATE.get(self.key)
            if state is None:
                _STATE.clear()
                path = self.index_path
                if is_url(path):  # a worker that shares no filesystem with the driver
                    path = fetch_index(path, self.key)
                state = _STATE[self.key] = _worker_state(self.cfg, path)
            return state

    def __call__(self, anchors: pa.Table, i: int) -> ShardResult:
        state = self._state()
        cfg = self.cfg
        t0 = time.monotonic()
        parts, counts = [], {}
        # A shard in anchor batches: neighbours and rule masks of one batch at a time. Random
        # fills are seeded per anchor, so the batch size does not change the pools.
        for lo in range(0, anchors.num_rows, cfg.anchor_batch):
            part, part_counts = mine_shard(
                anchors.slice(lo, cfg.anchor_batch),
                state["searcher"],
                state["texts"],
                state["ids"],
                band=(cfg.band_low, cfg.band_high),
                near_duplicate_threshold=cfg.near_duplicate_threshold,
                min_pool=cfg.min_pool,
                fallback=cfg.fallback,
                widen_step=cfg.widen_step,
                widen_limits=cfg.widen_limits,
                seed=cfg.seed,
                workers=cfg.threads,
                pool_cap=cfg.pool_cap,
            )
            parts.append(part)
            for key, value in part_counts.items():
                counts[key] = counts.get(key, 0) + value
        out = pa.concat_tables(parts) if parts else S.POOLS.schema.empty_table()
        return ShardResult({"pools": out}, counts, {"seconds": time.monotonic() - t0})


def _worker_state(cfg: MineConfig, index_path: str) -> dict[str, Any]:
    """A Dask worker's searcher and corpus: the driver's index read from ``index_path``
    (memory-mapped), the sentences' ids and texts, and the vectors (the flat index's own, else
    the driver's spilled ``_work/vectors.f32``, mapped)."""
    import faiss
    from pairforge.stages.mine.searcher import Searcher, _ivf

    _threads(cfg.threads)
    table = open_dataset(cfg.sentences, S.SENTENCES).read_table([S.ID, S.TEXT])
    ids = table[S.ID].combine_chunks()
    index = faiss.read_index(index_path, faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
    if isinstance(index, faiss.IndexFlat) and index.ntotal == len(ids):
        # The exact index stores the vectors as they are: search them in place (mapped).
        view = faiss.rev_swig_ptr(index.get_xb(), index.ntotal * index.d)
        vectors = view.reshape(index.ntotal, index.d)
        release, take = no_release, None
    else:
        # The driver's spilled vectors, beside the index (the page cache is shared).
        mapped = MappedVectors(Path(index_path).with_name(VECTOR_FILE), len(ids), index.d)
        vectors, release, take = mapped.array, mapped.release, mapped.take
    k = min(cfg.k + 1, len(vectors))
    rescore = _ivf(index) is not None and cfg.ivf_codec != "flat"
    searcher = Searcher(index, vectors, k, cfg.query_batch, rescore, release, take)
    return {"searcher": searcher, "texts": ArrowTexts(table[S.TEXT]), "ids": ids}


def run(cfg: MineConfig, progress: bool = True, executor: Executor | None = None) -> dict[str, Any]:
    """Mine every anchor's pool, the queries on ``executor`` (default: in this process, one
    shard after another); returns the metrics written to ``cfg.metrics``. The index is built
    (or reloaded) once, here; on Dask it is written to ``<output>/_work`` for the workers to
    map (see ``MineShard``). The pools are the same bytes whichever executor computes them."""
    with StageRun(STAGE, cfg, executor, progress) as run:
        _threads(cfg.threads)
        corpus = _open_corpus(run)
        writer = run.output("output", S.POOLS, fingerprint=corpus.fingerprint)
        shards = len(corpus.sentences)
        todo = pending([writer], shards)
        facts = SearchFacts()
        # Also with every shard done but no manifest (a kill in the finishing step): the facts
        # the manifest records come from the index and the augmentations, as in an uninterrupted
        # run.
        if not writer.complete:
            facts = _search(run, corpus, writer, todo)
        manifest = _finalize(cfg, writer, shards, facts)
        metrics = stage_metrics(cfg, manifest, facts, computed=len(todo), shards=shards)
        run.finish(metrics, timed=True)
        log_summary(cfg, metrics)
        return metrics


class _Corpus(NamedTuple):
    """The run's inputs, opened and checked: the datasets, the corpus's ids and texts (row ``i``
    of the sentences dataset) and the fingerprint of the pools they make."""

    sentences: Dataset
    embeddings: Dataset
    ids: pa.Array
    texts: ArrowTexts
    fingerprint: str


def _open_corpus(run: StageRun) -> _Corpus:
    """Open the sentences, embeddings and own-augmentations datasets (each checked against its
    schema), read the corpus and fingerprint the run; PairforgeError on fewer than 2 sentences."""
    cfg = run.cfg
    sentences = run.input("sentences", S.SENTENCES)
    embeddings = open_embeddings(cfg.embeddings)
    candidates = _open_augmentations(cfg.candidates)
    rewrites = _open_augmentations(cfg.rewrites)
    table = sentences.read_table([S.ID, S.TEXT])
    if table.num_rows < 2:
        raise PairforgeError(
            f"mine: {cfg.sentences} holds {table.num_rows} sentences; need at least 2"
        )
    # The rewrites count by their content, and only when there are some: an empty or absent
    # rewrites dataset (the demo's, rewrite disabled) leaves the pools and their fingerprint as
    # they were without one, so a rewritten empty dataset does not recompute every pool.
    run.depend("embeddings", embeddings)
    run.depend("candidates", candidates)
    if rewrites is not None and rewrites.num_rows:
        run.depend("rewrites", rewrites)
    fp = run.fingerprint()
    return _Corpus(
        sentences, embeddings, table[S.ID].combine_chunks(), ArrowTexts(table[S.TEXT]), fp
    )


def _search(run: StageRun, corpus: _Corpus, writer: DatasetWriter, todo: list[int]) -> SearchFacts:
    """Open the index and its searcher, sample the band coverage, gather the anchors' own
    augmentations, and mine the pending shards ``todo`` into ``writer`` (none: the searcher is
    still opened, for the facts the manifest records)."""
    cfg = run.cfg
    index, searcher, index_facts = _open_searcher(cfg, corpus.embeddings, corpus.ids)
    facts = SearchFacts(index=index_facts)
    if cfg.recall_sample:
        facts.coverage_sample = band_coverage(searcher, cfg)
    ids = corpus.ids
    cand_rows, cand_texts, facts.augmentations = own_augmentations(
        cfg.candidates, ids, "candidates"
    )
    rw_rows, rw_texts, facts.rewrites = own_augmentations(cfg.rewrites, ids, "rewrites")
    augs = merge_augmentations([(cand_rows, cand_texts), (rw_rows, rw_texts)])
    if todo:
        facts.search_seconds = _mine_shards(run, corpus, writer, todo, index, searcher, augs)
    return facts


def _open_searcher(
    cfg: MineConfig, embeddings: Dataset, ids: pa.Array
) -> tuple[Any, Searcher, dict[str, Any]]:
    """The index over the corpus's vectors, built (or reloaded from ``<output>/_work``), and its
    searcher, with the index's facts (kind, build seconds, recall@k against exact search).
    ConfigError when the GPU index cannot return the neighbours ``pool_cap`` needs."""
    from pairforge.stages.mine.searcher import Searcher, flat_view, open_index

    # The corpus's vectors go to <output>/_work, mapped: every pass over them releases its pages
    # as it goes (stages/mine/index.py), so a million sentences do not hold 1.43 GiB resident.
    mapped = spill_vectors(embeddings, ids, work_folder(cfg.output))
    vectors = mapped.array
    index, facts = open_index(vectors, work_folder(cfg.output), cfg, mapped.release, mapped.take)
    log.info(
        "mine: %s index over %d x %d vectors (%.1fs)",
        facts["kind"],
        *vectors.shape,
        facts["build_seconds"],
    )
    k = min(cfg.k + 1, len(vectors))  # + 1: the anchor usually finds itself first
    widest = (cfg.pool_cap or cfg.k) + 1
    if facts["gpu"] and facts["engine"] == "faiss" and widest > GPU_MAX_K:
        raise ConfigError(
            f"mine.pool_cap: {cfg.pool_cap} needs {widest} neighbours per search, but faiss "
            f"on GPU returns at most {GPU_MAX_K}; set pool_cap to {GPU_MAX_K - 1} or less, "
            "or use_gpu: no"
        )
    facts.update(_recall(cfg, mapped, index, facts["kind"]))
    flat = flat_view(index, vectors)  # a flat index holds the vectors: search them there
    mapped_rows = flat is vectors
    release = mapped.release if mapped_rows else no_release
    rescore = facts["kind"] == "ivf" and cfg.ivf_codec != "flat"
    take = mapped.take if mapped_rows else None  # positioned reads: no mapped pages resident
    searcher = Searcher(index, flat, k, cfg.query_batch, rescore, release, take)
    return index, searcher, facts


def _recall(cfg: MineConfig, mapped: MappedVectors, index, kind: str) -> dict[str, Any]:
    """The index's recall facts: an approximate index's recall@k against exact search on a
    seeded sample of ``recall_sample`` anchors (none when 0), an exact one's 1.0."""
    from pairforge.stages.mine.index import measure_recall

    if kind != "flat" and cfg.recall_sample:
        rk = min(cfg.k, len(mapped))
        recall = measure_recall(
            mapped.array,
            index,
            k=rk,
            sample_size=cfg.recall_sample,
            seed=cfg.seed,
            norm_tol=None,
            release=mapped.release,
            take=mapped.take,
        )
        facts = {
            "recall_at_k": round(recall, 4),
            "recall_k": rk,
            "recall_sample": min(cfg.recall_sample, len(mapped)),
        }
        log.info(
            "mine: recall@%d of the %s index vs exact search: %.4f", rk, kind, facts["recall_at_k"]
        )
        return facts
    if kind == "flat":
        return {"recall_at_k": 1.0, "exact": True}
    return {}


def _mine_shards(
    run: StageRun,
    corpus: _Corpus,
    writer: DatasetWriter,
    todo: list[int],
    index,
    searcher: Searcher,
    augs: tuple[np.ndarray, pa.Array],
) -> float:
    """Mine the anchor shards ``todo`` (their own augmentations ``augs``: rows, texts) into
    ``writer`` on the run's executor; returns the seconds their searches took, summed over
    shards. Off this process the index goes to ``<output>/_work`` for the workers to map."""
    cfg = run.cfg
    in_process = isinstance(run.executor, LocalExecutor)
    key = f"{corpus.fingerprint}:{cfg.threads}:{cfg.query_batch}"
    # Absolute: a worker of a --scheduler cluster may run in another folder.
    index_path = (work_folder(cfg.output) / SEARCH_FILE).resolve()
    if not in_process:
        write_search_index(index, index_path)
    state = {"searcher": searcher, "texts": corpus.texts, "ids": corpus.ids} if in_process else None
    where = str(index_path) if in_process else share_index(cfg, index_path, index)
    fn = MineShard(cfg, key, where, state)
    shard_rows = [s["rows"] for s in corpus.sentences.manifest["shards"]]
    bounds = np.concatenate([[0], np.cumsum(shard_rows)])
    # The anchor tables (ids, rows, own augmentations) are small: the driver cuts them.
    anchors = (
        (i, anchor_table(corpus.ids, int(bounds[i]), int(bounds[i + 1]), *augs)) for i in todo
    )
    try:
        shard_facts = run.map(fn, anchors, {"pools": writer}, with_index=True)
    finally:
        with _STATE_LOCK:
            _STATE.pop(key, None)
    return sum(f["seconds"] for f in shard_facts)


def _finalize(
    cfg: MineConfig, writer: DatasetWriter, shards: int, facts: SearchFacts
) -> dict[str, Any]:
    """Finish the pools dataset: its manifest records how the pools were made (the index, the own
    augmentations, the coverage sample); the saved index in ``<output>/_work`` goes. Returns the
    manifest."""
    # Only what describes the index goes in the manifest; timings vary, they go to the metrics.
    stable = {
        k: v for k, v in facts.index.items() if k not in ("build_seconds", "loaded_from_work")
    }
    # The facts of how the pools were made go in the manifest, and the metrics read them from
    # there: a rerun that finds the pools finished writes the same metrics.
    made = {
        "augmentations": facts.augmentations,
        "rewrites": facts.rewrites,
        "band_sample": {k: np.asarray(v).tolist() for k, v in facts.coverage_sample.items()},
    }
    manifest = writer.finalize(shards, extra={"index": stable, **made} if stable else made)
    shutil.rmtree(work_folder(cfg.output), ignore_errors=True)  # the saved index: done with it
    if isinstance(dataset_path(cfg.output), RemotePath):
        remove_tree(dataset_path(cfg.output) / "_work")  # its copies for the workers
    return manifest


@stage_command(STAGE)
def command(cfg: MineConfig, workers: int, scheduler: str | None, progress: bool) -> None:
    """Mine each sentence's negative candidate pool: kNN in a FAISS index, then the cosine band.

    Every option defaults to the key of the same name in the `mine` section of params.yaml.
    """
    with executor(workers, scheduler) as ex:
        run(cfg, progress=progress, executor=ex)
