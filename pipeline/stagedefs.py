"""What each stage reads, runs and writes, declared once: dvc.yaml and the fingerprints follow it.

For every DVC stage, a ``StageDef`` names

- ``code``: the source files (or folders of them) whose change can change the stage's output:
  its own module and every project module it imports, except ``PLUMBING`` (command-line,
  validation, locks, progress bars and error messages, which change no output byte). These are
  the stage's ``deps:`` in dvc.yaml and the code its fingerprint hashes.
- ``inputs``: the data it reads, as DVC path templates over params keys (``${embed.sentences}``);
  dvc.yaml lists them first among the ``deps:``.
- ``outputs``: the keys of its section that name what it writes (dvc.yaml's ``outs:``).
- ``params``: the exact keys of its section that change its output. dvc.yaml's ``params:`` lists
  them (``mine.band_low``), and the stage's fingerprint hashes their values: a change to one of
  them reruns the stage under DVC and clears its unfinished shards; nothing else does.
- ``free``: the keys that change no output byte (threads, caches, batch sizes that only change
  float rounding): a run may resume with other values, and DVC does not rerun for them.

Every key of a section is in exactly one of ``inputs`` (as the template of its own key),
``outputs``, ``params`` and ``free``; tests/test_dvc.py checks that, that dvc.yaml says the same
thing, and that ``code`` covers every project module the stage imports.

The ``train`` stage's params hold ``recipes.${train.objective}``: the recipe of the objective that
params.yaml names, not the other objectives' (editing ``train.recipes.bsl`` does not retrain
DebCSE). A user who switches objective in params.yaml gets that objective's recipe tracked;
``pairforge train -o <objective>`` on the command line trains outside DVC, whose lock then
still describes the params' objective (the trainer's own fingerprint covers the objective it ran).

This module imports nothing from ``stages/`` or ``train/``: it names their sources as paths.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# Project modules that change no stage's output: imported everywhere, hashed nowhere.
PLUMBING = (
    "pipeline/cli_options.py",
    "pipeline/config.py",
    "pipeline/errors.py",
    "pipeline/locks.py",
    "pipeline/progress.py",
    "pipeline/version.py",
    "pipeline/stagedefs.py",
    "pipeline/fingerprint.py",
)

# What every shard-writing stage runs to write and check its datasets and metrics.
_SHARDS = ("pipeline/runner.py", "pipeline/schemas.py", "pipeline/shards.py", "pipeline/metrics.py")
_DATASETS = ("pipeline/schemas.py", "pipeline/shards.py", "pipeline/metrics.py")
# The model layer; its CTranslate2 encoder converts models through the augment stages' files.
_MODELS = ("pipeline/models", "pipeline/modelfiles.py")
_TRAINER = (
    "train/card.py",
    "train/checkpoint.py",
    "train/data.py",
    "train/distributed.py",
    "train/export.py",
    "train/infocse_aux.py",
    "train/loop.py",
    "train/objectives",
    "train/optim.py",
    "train/training_report.py",
    "train/runtime.py",
    "pipeline/sts.py",
)


@dataclass(frozen=True)
class StageDef:
    """One stage's declaration (see the module docstring)."""

    code: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    params: tuple[str, ...]
    free: tuple[str, ...] = ()


STAGES: dict[str, StageDef] = {
    "ingest": StageDef(
        code=("stages/ingest/stage.py", "pipeline/readers.py", "pipeline/text.py", *_SHARDS),
        inputs=("${ingest.root}",),
        outputs=("output", "quarantine", "metrics"),
        params=(
            "inputs",
            "format",
            "field",
            "min_words",
            "max_words",
            "max_chars",
            "max_line_bytes",
            "invalid_utf8",
            "rows_per_shard",
            "chunk_rows",
        ),
    ),
    "standin": StageDef(
        code=(
            "stages/standin/stage.py",
            "stages/standin/marian.py",
            "stages/standin/synonyms.py",
            *_MODELS,
            "pipeline/schemas.py",
            "pipeline/shards.py",
        ),
        inputs=("${standin.input}",),
        outputs=("output",),
        params=(
            "enabled",
            "pairs",
            "vocab_size",
            "synonyms",
            "substitute_rate",
            "sharpness",
            "seed",
        ),
    ),
    "backtranslate": StageDef(
        code=(
            "stages/backtranslate/stage.py",
            "stages/backtranslate/translate.py",
            "stages/backtranslate/engines.py",
            "stages/backtranslate/apertium.py",
            "stages/backtranslate/sampling.py",
            "stages/backtranslate/summary.py",
            "stages/backtranslate/decoding.py",
            "stages/backtranslate/batching.py",
            "pipeline/cache.py",
            "stages/backtranslate/noise.py",
            "pipeline/candidate_quality.py",
            "pipeline/text.py",
            *_MODELS,
            *_SHARDS,
        ),
        # The routes name the translation models, which the standin stage writes in the demo.
        inputs=("${backtranslate.input}", "${standin.output}"),
        outputs=("output", "metrics", "plot"),
        params=(
            "engine",
            "device",
            "compute_type",
            "cpu_isa",
            "max_batch_tokens",
            "max_batch_sentences",
            "max_input_tokens",
            "max_length",
            "max_length_ratio",
            "min_length",
            "seed",
            "routes",
            "noise",
        ),
        free=("cache", "models_dir", "threads"),
    ),
    "rewrite": StageDef(
        code=(
            "stages/rewrite/stage.py",
            "stages/rewrite/rewriting.py",
            "stages/rewrite/llm.py",
            "pipeline/cache.py",
            "pipeline/candidate_quality.py",
            "pipeline/text.py",
            *_SHARDS,
        ),
        inputs=("${rewrite.input}",),
        outputs=("output", "quarantine", "metrics"),
        params=(
            "enabled",
            "base_url",
            "model",
            "api_key_env",
            "system",
            "prompt",
            "temperature",
            "max_tokens",
            "max_retries",
            "backoff_base",
            "backoff_max",
            "max_sentences",
            "price_input_per_1m",
            "price_output_per_1m",
            "language",
            "min_ascii_letters",
            "min_length_ratio",
            "max_length_ratio",
            "seed",
        ),
        free=("cache", "timeout", "concurrency", "requests_per_minute"),
    ),
    "pretrain": StageDef(
        code=(
            "stages/pretrain/stage.py",
            "stages/pretrain/infocse.py",
            "train/infocse_aux.py",
            *_MODELS,
            *_DATASETS,
        ),
        inputs=("${pretrain.input}",),
        outputs=("output", "metrics", "plot_data", "figure"),
        params=(
            "model",
            "lower_layers",
            "head_layers",
            "mask_rate",
            "aux_weight",
            "train_backbone",
            "max_length",
            "batch_size",
            "steps",
            "epochs",
            "learning_rate",
            "weight_decay",
            "warmup_ratio",
            "seed",
            "checkpoint_every",
        ),
        free=("device",),
    ),
    "embed": StageDef(
        code=(
            "stages/embed/stage.py",
            "pipeline/mining_inputs.py",
            *_MODELS,
            *_SHARDS,
        ),
        inputs=("${embed.sentences}", "${embed.candidates}", "${embed.rewrites}"),
        outputs=("output", "candidates_output", "rewrites_output", "metrics"),
        # compute_type matters only to the ctranslate2 engine (the stage says so to fingerprint).
        params=(
            "model",
            "pooling",
            "prompt",
            "max_length",
            "dtype",
            "engine",
            "compute_type",
            "vector_dtype",
        ),
        # Device, batch size (and tokens) and threads change the vectors by float rounding only.
        free=("batch_size", "max_batch_tokens", "models_dir", "device", "threads"),
    ),
    "mine": StageDef(
        code=(
            "stages/mine/stage.py",
            "stages/mine/index.py",
            "stages/mine/ondisk.py",
            "pipeline/pools.py",
            "pipeline/text.py",
            "stages/mine/searcher.py",
            "stages/mine/torch_search.py",
            "pipeline/mining_inputs.py",
            *_SHARDS,
        ),
        inputs=(
            "${mine.sentences}",
            "${mine.embeddings}",
            "${mine.candidates}",
            "${mine.rewrites}",
        ),
        outputs=("output", "metrics"),
        params=(
            "k",
            "pool_cap",
            "band_low",
            "band_high",
            "near_duplicate_threshold",
            "min_pool",
            "fallback",
            "widen_step",
            "widen_limits",
            "index",
            "flat_max",
            "nlist",
            "nprobe",
            "ivf_codec",
            "train_size",
            "train_iterations",
            "hnsw_m",
            "ef_construction",
            "ef_search",
            "use_gpu",
            "search_engine",
            "recall_sample",
            "seed",
        ),
        free=("query_batch", "anchor_batch", "threads"),
    ),
    "sample": StageDef(
        code=(
            "stages/sample/stage.py",
            "stages/sample/edits.py",
            "stages/sample/edit_kernels.py",
            "stages/sample/ipw.py",
            "stages/sample/pairs.py",
            "stages/sample/selection.py",
            "pipeline/pools.py",
            "pipeline/text.py",
            "stages/sample/sampling.py",
            "pipeline/dataset_card.py",
            "stages/export/layouts.py",
            "pipeline/mining_inputs.py",
            *_SHARDS,
        ),
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
        params=(
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
            "edit_kind",
            "edit_normalized",
            "edit_metric",
            "identical",
            "short",
            "positive_route",
            "view1_route",
            "view2_route",
            "seed",
            "anchor_batch",
            "corpus_name",
            "corpus_license",
            "corpus_source",
        ),
        # The numba and rapidfuzz backends give equal distances.
        free=("edit_backend", "threads"),
    ),
    "report": StageDef(
        code=(
            "stages/report/stage.py",
            "stages/report/diagnostics.py",
            "stages/report/positives.py",
            "pipeline/mining_inputs.py",
            *_MODELS,
            *_DATASETS,
        ),
        inputs=(
            "${report.pairs}",
            "${report.sentences}",
            "${report.embeddings}",
            "${report.candidates}",
        ),
        outputs=("reports", "plots", "metrics"),
        params=(
            "nli",
            "nli_split",
            "nli_pairs",
            "simcse_pairs",
            "random_pairs",
            "max_pairs",
            "bins",
            "read_anchors",
            "compare_candidates",
            "route_pairs",
            "seed",
        ),
        free=("device", "batch_size", "threads"),
    ),
    "train": StageDef(
        code=(
            "stages/train/stage.py",
            *_TRAINER,
            "train/objective_options.py",
            # Copied into every exported model as its sentence-transformers pooling module.
            "train/st_pooling.py",
            *_MODELS,
            *_DATASETS,
        ),
        inputs=(
            "${train.input}",
            # InfoCSE's auxiliary network (train.recipes.infocse.options.aux_path). DVC has no
            # per-objective deps, so every objective's run waits for it; it changes rarely.
            "${pretrain.output}",
            # The demo evaluation set: its dev split selects the checkpoint without the STS data.
            "${train.demo_dir}",
        ),
        outputs=("output", "metrics", "plots", "reports"),
        params=(
            "model",
            "objective",
            "seed",
            "batch_size",
            "lr",
            "weight_decay",
            "schedule",
            "warmup_steps",
            "warmup_ratio",
            "max_steps",
            "epochs",
            "max_length",
            "max_grad_norm",
            "precision",
            "device",
            "deterministic",
            "buffer_size",
            "save_every",
            "keep_checkpoints",
            "eval_every",
            "eval_tasks",
            "eval_max_pairs",
            "eval_batch_size",
            "sts_dir",
            "eval_fallback",
            "log_every",
            "threads",
            "recipes.${train.objective}",
        ),
    ),
    "evaluate": StageDef(
        code=("stages/evaluate/stage.py", *_TRAINER, *_MODELS, *_DATASETS),
        inputs=("${train.output}/${train.objective}", "${evaluate.demo_data}"),
        outputs=("metrics", "report", "plot"),
        params=(
            "data",
            "models",
            "baseline",
            "baseline_poolings",
            "baseline_prompt",
            "tasks",
            "sts_missing",
            "max_pairs",
            "seed",
            "max_length",
        ),
        free=("batch_size", "device", "threads"),
    ),
}

_TEMPLATE = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")


def stage_def(stage: str) -> StageDef:
    try:
        return STAGES[stage]
    except KeyError:
        known = ", ".join(STAGES)
        raise KeyError(f"no stage {stage!r} in pipeline/stagedefs.py; stages: {known}") from None


def resolve_key(stage: str, key: str, section: Mapping[str, Any]) -> list[str]:
    """``key`` as a path into ``section``: ``${<stage>.x}`` is replaced by ``section[x]``."""

    def value(match: re.Match) -> str:
        ref_section, _, ref = match.group(1).partition(".")
        if ref_section != stage or ref not in section:
            raise KeyError(f"{stage}.{key}: cannot resolve ${{{match.group(1)}}}")
        return str(section[ref])

    return _TEMPLATE.sub(value, key).split(".")


def exact_params(stage: str, section: Mapping[str, Any]) -> dict[str, Any]:
    """The values of the stage's exact param keys in ``section`` (its params.yaml section, or its
    config's ``model_dump()``), by key as dvc.yaml names it (``recipes.debcse`` for train's
    ``recipes.${train.objective}``); an absent nested key (a recipe not written) is None."""
    out: dict[str, Any] = {}
    for key in stage_def(stage).params:
        path = resolve_key(stage, key, section)
        if path[0] not in section:
            raise KeyError(f"{stage}.{path[0]}: declared in pipeline/stagedefs.py, not in config")
        node: Any = section
        for part in path:
            node = node.get(part) if isinstance(node, Mapping) else None
        out[".".join(path)] = node
    return out


def code_files(stage: str) -> list[Path]:
    """The source files of the stage's declared code (folders expanded to their ``*.py``)."""
    files: list[Path] = []
    for entry in stage_def(stage).code:
        path = ROOT / entry
        files.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return files


def code_hash(stage: str) -> str:
    """sha256 over the stage's declared code (path and bytes of each file), 12 hex digits.
    A stage not declared here (a test's) hashes ``pipeline/``. Not cached: see
    ``pipeline.version.source_hash`` for the per-process cached value."""
    if stage in STAGES:
        files = sorted(set(code_files(stage)))
    else:
        files = sorted((ROOT / "pipeline").rglob("*.py"))
    digest = hashlib.sha256()
    for file in files:
        digest.update(str(file.relative_to(ROOT)).encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()[:12]
