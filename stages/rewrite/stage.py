"""rewrite: sentences -> LLM rewrites (DenoSent's alternative to back-translation), optional.

Each sentence goes to an OpenAI-compatible chat-completions endpoint (``base_url``: the OpenAI
API, vLLM, llama.cpp's server, ...) with the prompt template from params. Requests run
``concurrency`` at a time under a requests-per-minute limit, with retries and backoff on 429,
5xx, timeouts and malformed answers, and every answer is cached so that a rerun sends nothing
twice. Answers are validated (``stages.rewrite.llm.validate_rewrite``); rejected rows go to the
quarantine with their reason, so ``rows_in == rewritten + rejected`` always. The metrics count
requests, retries, tokens and their cost.

The API key comes only from the environment variable *named* by ``api_key_env``. With
``enabled: false`` (the demo) the stage writes empty, complete datasets and metrics that say so.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from typing import Literal

from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.cache import KeyValueCache, MemoryCache
from pairforge.pipeline.plumbing.config import StageConfig
from pairforge.pipeline.plumbing.errors import ConfigError, DataIntegrityError
from pairforge.pipeline.plumbing.runner import Executor, finished, pending
from pairforge.pipeline.plumbing.shards import (
    MANIFEST,
    DatasetWriter,
    open_dataset,
)
from pairforge.pipeline.plumbing.stagedefs import StageDef
from pairforge.pipeline.plumbing.stagerun import StageRun
from pairforge.pipeline.plumbing.storage import dataset_path
from pairforge.stages.options import executor, stage_command
from pairforge.stages.rewrite.llm import REASONS, ChatClient, ChatSettings, Validation
from pairforge.stages.rewrite.rewriting import rewrite_shard
from pydantic import Field, field_validator

log = logging.getLogger("pairforge")

DEFAULT_PROMPT = (
    "Rewrite the following sentence, introducing noise while preserving the underlying "
    "semantics. Answer with the rewritten sentence only, on one line.\n\nSentence: {text}"
)
RETRY_KINDS = ("429", "5xx", "timeout", "malformed", "connection", "exhausted")


class RewriteConfig(StageConfig):
    """The ``rewrite`` section of params.yaml."""

    enabled: bool = Field(False, description="false: write empty datasets, send nothing")
    input: str = Field("data/sentences", description="sentences dataset to rewrite")
    output: str = Field("data/rewrites", description="rewrites dataset folder (candidates schema)")
    quarantine: str = Field(
        "data/quarantine/rewrite", description="quarantine dataset folder for rejected rows"
    )
    metrics: str = Field("metrics/rewrite.json", description="metrics JSON path")
    cache: str | None = Field(
        ".cache/pairforge/rewrites.sqlite", description="answer cache (SQLite file); null: none"
    )
    base_url: str = Field(
        "https://api.openai.com/v1",
        description="any OpenAI-compatible endpoint, e.g. http://localhost:8000/v1",
    )
    model: str = Field("gpt-3.5-turbo", description="model name at the endpoint")
    api_key_env: str = Field(
        "OPENAI_API_KEY", description="NAME of the environment variable holding the key"
    )
    system: str | None = Field(None, description="optional system message")
    prompt: str = Field(DEFAULT_PROMPT, description="user message; {text} is the sentence")
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="sampling temperature")
    max_tokens: int = Field(128, ge=1, description="answer tokens at most")
    timeout: float = Field(60.0, gt=0, description="seconds per request")
    max_retries: int = Field(6, ge=0, description="retries of a failed request")
    backoff_base: float = Field(
        1.0, ge=0, description="first retry waits ~this many seconds, then doubles"
    )
    backoff_max: float = Field(60.0, ge=0, description="longest wait between retries, in seconds")
    concurrency: int = Field(8, ge=1, description="requests in flight at most")
    requests_per_minute: int = Field(
        500, ge=0, description="requests per minute at most; 0: no limit"
    )
    max_sentences: int | None = Field(None, ge=0, description="rewrite only the first N sentences")
    price_input_per_1m: float = Field(0.5, ge=0, description="USD per 1M prompt tokens")
    price_output_per_1m: float = Field(1.5, ge=0, description="USD per 1M completion tokens")
    language: Literal["en"] | None = Field("en", description="language check of answers; null: off")
    min_ascii_letters: float = Field(
        0.8,
        ge=0,
        le=1,
        description="language check: least share of an answer's letters that are ASCII",
    )
    min_length_ratio: float = Field(
        0.3, ge=0, description="answers shorter than this times the sentence are rejected"
    )
    max_length_ratio: float = Field(
        3.0, gt=0, description="answers longer than this times the sentence are rejected"
    )
    seed: int = Field(0, description="seed of the requests (sent to the endpoint)")

    @field_validator("prompt")
    @classmethod
    def _has_text(cls, value: str) -> str:
        if "{text}" not in value:
            raise ValueError("the prompt template must contain {text}")
        return value

    def chat(self) -> ChatSettings:
        return ChatSettings.of(self)

    def validation(self) -> Validation:
        return Validation(
            self.language, self.min_ascii_letters, self.min_length_ratio, self.max_length_ratio
        )


STAGE = StageDef(
    name="rewrite",
    module=__name__,
    config=RewriteConfig,
    inputs=("${rewrite.input}",),
    outputs=("output", "quarantine", "metrics"),
    datasets=("output", "quarantine"),
    free=("cache", "timeout", "concurrency", "requests_per_minute"),
    headlines={"rows_out": "rewritten", "dropped": "rejected_total", "cost_usd": "cost_usd"},
)


def check_key_env(name: str) -> None:
    """``api_key_env`` must name a variable; a value that looks like a key is refused without
    being echoed (it must never reach a log)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ConfigError(
            "rewrite.api_key_env must be the NAME of an environment variable (e.g. OPENAI_API_KEY), "
            "not the key itself; put the key in that variable, never in params"
        )


def run(cfg: RewriteConfig, executor: Executor | None = None, progress: bool = True) -> dict:
    """Run the whole stage; returns the metrics it also writes to ``cfg.metrics``."""
    check_key_env(cfg.api_key_env)
    this_run: dict[str, int] = {}  # counts of the shards this run computed (log only)
    with StageRun(STAGE, cfg, executor, progress) as run:
        if not cfg.enabled:
            run.depend("input", None)
            rewrites = run.output("output", S.CANDIDATES)
            quarantine = run.output("quarantine", S.QUARANTINE)
            extra = {"counts": {}, "enabled": False}
            rewrites.finalize(0, extra=extra)
            quarantine.finalize(0, extra=extra)
        else:
            sentences = run.input("input", S.SENTENCES)
            rewrites = run.output("output", S.CANDIDATES)
            quarantine = run.output("quarantine", S.QUARANTINE)
            if not (rewrites.complete and quarantine.complete):
                fn = functools.partial(
                    rewrite_shard,
                    client=ChatClient(cfg.chat(), rng_seed=cfg.seed),
                    cache=KeyValueCache(cfg.cache, "rewrites") if cfg.cache else MemoryCache(),
                    validation=cfg.validation(),
                    progress=progress,
                )
                outputs = {"rewrites": rewrites, "rejected": quarantine}
                todo = pending(outputs, len(sentences))
                run.map(fn, _tables(cfg, sentences, outputs), outputs)
                this_run = run.totals(rewrites, todo)
                extra = {
                    "counts": run.totals(rewrites),
                    "enabled": True,
                    "base_url": cfg.base_url,
                    "model": cfg.model,
                }
                rewrites.finalize(len(sentences), extra=extra)
                quarantine.finalize(len(sentences), extra=extra)
        manifest = json.loads((dataset_path(cfg.output) / MANIFEST).read_text())
        metrics = run.finish(_metrics(cfg, manifest))
        seconds = run.seconds
    if cfg.enabled:
        # The metrics describe the datasets (what they cost, whenever made); the log says what
        # this run did: a rerun over finished datasets sends nothing.
        log.info(
            "rewrite: %d sentences -> %d rewrites, %d quarantined (%s); this run: %d requests "
            "sent, %d cache hits, %.1fs; the datasets: %d requests, %d+%d tokens, $%.4f",
            metrics["rows_in"],
            metrics["rewritten"],
            metrics["rejected_total"],
            ", ".join(f"{k} {v}" for k, v in metrics["rejected"].items() if v) or "none",
            this_run.get("requests", 0),
            this_run.get("cache_hits", 0),
            seconds,
            metrics["requests_sent"],
            metrics["tokens"]["prompt"],
            metrics["tokens"]["completion"],
            metrics["cost_usd"],
        )
    else:
        log.info(
            "rewrite: disabled (rewrite.enabled: false); wrote empty %s and %s",
            cfg.output,
            cfg.quarantine,
        )
    return metrics


def _tables(cfg: RewriteConfig, sentences, outputs: dict[str, DatasetWriter]):
    """``(index, table)`` of the sentence shards not finished yet, cut at ``max_sentences``."""
    offset = 0
    for index, shard in enumerate(sentences.manifest["shards"]):
        rows = shard["rows"]
        if not finished(outputs, index):
            table = sentences.read_shard(index)
            if cfg.max_sentences is not None:
                table = table.slice(0, max(0, min(rows, cfg.max_sentences - offset)))
            yield index, table
        offset += rows


def _metrics(cfg: RewriteConfig, manifest: dict) -> dict:
    counts = manifest.get("counts", {})
    rejected = {r: int(counts.get(f"rejected.{r}", 0)) for r in REASONS}
    tokens = {
        "prompt": int(counts.get("tokens.prompt", 0)),
        "completion": int(counts.get("tokens.completion", 0)),
    }
    cached = {
        "prompt": int(counts.get("cached_tokens.prompt", 0)),
        "completion": int(counts.get("cached_tokens.completion", 0)),
    }

    def cost(t: dict) -> float:
        return round(
            t["prompt"] / 1e6 * cfg.price_input_per_1m
            + t["completion"] / 1e6 * cfg.price_output_per_1m,
            6,
        )

    metrics = {
        "enabled": bool(manifest.get("enabled", cfg.enabled)),
        "rows_in": int(counts.get("rows", 0)),
        "rewritten": int(counts.get("rewritten", 0)),
        "rejected": rejected,
        "rejected_total": sum(rejected.values()),
        "requests_sent": int(counts.get("requests", 0)),
        "cache_hits": int(counts.get("cache_hits", 0)),
        "retries": {k: int(counts.get(f"retries.{k}", 0)) for k in RETRY_KINDS},
        "tokens": tokens,
        "cost_usd": cost(tokens),
        "cached_tokens": cached,
        "cost_saved_by_cache_usd": cost(cached),
        "model": cfg.model,
    }
    written_good = open_dataset(cfg.output, S.CANDIDATES).num_rows
    written_bad = open_dataset(cfg.quarantine, S.QUARANTINE).num_rows
    if (
        metrics["rows_in"] != metrics["rewritten"] + metrics["rejected_total"]
        or written_good != metrics["rewritten"]
        or written_bad != metrics["rejected_total"]
    ):
        raise DataIntegrityError(
            f"rewrite accounting mismatch: {metrics['rows_in']} rows in, {metrics['rewritten']} "
            f"rewritten ({written_good} written), {metrics['rejected_total']} rejected ({written_bad} written)"
        )
    return metrics


@stage_command(STAGE, names={"enabled": ("--enabled/--disabled",)})
def command(cfg: RewriteConfig, workers: int, scheduler: str | None, progress: bool) -> None:
    """Rewrite sentences with an LLM through an OpenAI-compatible endpoint (optional stage).

    Every option defaults to the key of the same name in the `rewrite` section of params.yaml.
    The API key is read from the environment variable named by --api-key-env, nowhere else.
    Rejected answers go to the quarantine with their reason; a rerun sends no request twice.
    """
    with executor(workers, scheduler) as ex:
        run(cfg, ex, progress=progress)
