"""backtranslate: sentences -> positive candidates by round-trip translation (DenoSent, DebCSE, BSL).

For every route in params (``en-zh-en`` for DenoSent and DebCSE, ``en-de-en`` and ``en-fr-en``
for BSL) each sentence goes to the pivot language and back with Opus-MT (any Marian model by hub
id or local folder), on the transformers or the CTranslate2 engine. DebCSE's noise (insert
frequent words, mask words) makes several distinct inputs per sentence; every backward decoding
(greedy, beam, sampling with n candidates) reuses the one forward pass. The work per sentence
shard is ``stages.backtranslate.translate.backtranslate_shard``; this module reads params, resolves
and converts models, maps that function over the sentence shards (resumable at shard
granularity; a persistent cache makes finished batches of a killed shard free on resume),
writes the ``candidates`` dataset and metrics.
"""

from __future__ import annotations

import functools
import json
import logging
from typing import Literal

from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.cache import KeyValueCache, MemoryCache
from pairforge.pipeline.plumbing.config import ModelSpec, StageConfig
from pairforge.pipeline.plumbing.errors import ConfigError
from pairforge.pipeline.plumbing.runner import Executor
from pairforge.pipeline.plumbing.stagedefs import StageDef
from pairforge.pipeline.plumbing.stagerun import StageRun
from pairforge.pipeline.plumbing.storage import dataset_path
from pairforge.pipeline.science.models.apertium import is_apertium_spec
from pairforge.pipeline.science.models.files import (
    ModelRef,
    convert_ctranslate2,
    resolve_translation_model,
)
from pairforge.stages.backtranslate.decoding import GREEDY, Decoding, Lengths
from pairforge.stages.backtranslate.engines import TranslatorPool, engine_settings
from pairforge.stages.backtranslate.noise import KINDS, NoiseSettings, frequent_words
from pairforge.stages.backtranslate.summary import plot_edit_ratio, summarize
from pairforge.stages.backtranslate.translate import Batching, RoutePlan, backtranslate_shard
from pairforge.stages.options import executor, stage_command
from pydantic import BaseModel, ConfigDict, Field, model_validator

log = logging.getLogger("pairforge")


class RouteConfig(BaseModel):
    """One round trip: source -> pivot with ``forward``, pivot -> source with ``backward``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_.]+(-[A-Za-z0-9_.]+)+$", description="e.g. en-zh-en")
    forward: ModelSpec = Field(
        description="model spec (hub id, local folder, package:) source->pivot"
    )
    backward: ModelSpec = Field(description="model spec pivot->source")
    forward_revision: str | None = Field(None, description="hub revision (branch, tag, commit)")
    backward_revision: str | None = None
    pivot_decoding: Decoding = Field(GREEDY, description="decoding of the forward leg (n = 1)")
    decodings: list[Decoding] = Field(
        default_factory=lambda: [GREEDY], min_length=1, description="backward decodings"
    )
    noise: bool = Field(False, description="add DebCSE noised copies (section `noise`) as inputs")

    @model_validator(mode="after")
    def _pivot_single(self) -> RouteConfig:
        if self.pivot_decoding.n != 1:
            raise ValueError("pivot_decoding must return one pivot per input (n = 1)")
        labels = [d.label() for d in self.decodings]
        if len(set(labels)) != len(labels):
            raise ValueError(f"route {self.name}: two decodings have the same label {labels}")
        return self


class NoiseConfig(BaseModel):
    """DebCSE's discrete noise for routes with ``noise: true``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    copies: int = Field(2, ge=0, description="noised copies per sentence besides the clean one")
    kinds: list[Literal["insert", "mask"]] = Field(
        default_factory=lambda: list(KINDS), min_length=1
    )
    min_words: int = Field(1, ge=1)
    max_words: int = Field(2, ge=1)
    vocabulary: list[str] = Field(
        default_factory=list, description="words to insert; empty: the corpus's top_words"
    )
    top_words: int = Field(100, ge=1, description="size of the frequent-word list when computed")
    mask_token: str = Field(
        "<unk>",
        description="replaces a masked word; empty: the word is deleted (for apertium, which "
        "copies an unknown token into its output)",
    )

    @model_validator(mode="after")
    def _order(self) -> NoiseConfig:
        if self.min_words > self.max_words:
            raise ValueError(
                f"min_words ({self.min_words}) must not exceed max_words ({self.max_words})"
            )
        return self


def _default_routes() -> list[RouteConfig]:
    return [
        RouteConfig(
            name="en-zh-en",
            forward="Helsinki-NLP/opus-mt-en-zh",
            backward="Helsinki-NLP/opus-mt-zh-en",
            noise=True,
        )
    ]


class BacktranslateConfig(StageConfig):
    """The ``backtranslate`` section of params.yaml."""

    input: str = Field("data/sentences", description="sentences dataset to translate")
    output: str = Field("data/candidates", description="candidates dataset folder")
    metrics: str = Field("metrics/backtranslate.json", description="metrics JSON path")
    plot: str = Field("plots/backtranslate_edit_ratio.png", description="edit-ratio histogram PNG")
    cache: str | None = Field(
        ".cache/pairforge/translations.sqlite",
        description="persistent translation cache (SQLite); null: none",
    )
    models_dir: str = Field(
        ".cache/pairforge/ctranslate2", description="folder of CTranslate2 conversions"
    )
    engine: Literal["ctranslate2", "transformers", "apertium"] = Field(
        "ctranslate2",
        description="ctranslate2 or transformers (Marian models), or apertium (rule-based, "
        "offline; routes name apertium:<mode> specs, greedy decoding only)",
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto, cpu or cuda")
    compute_type: str = Field(
        "auto",
        description="auto: int8 (CPU) / int8_float16 (GPU) for ctranslate2; ctranslate2: int8, int8_float32, float32 (CPU), float16, int8_float16, bfloat16 (GPU); transformers: float32, bfloat16, float16",
    )
    threads: int = Field(0, ge=0, description="CPU threads; 0: every core this process may use")
    cpu_isa: Literal["auto", "GENERIC", "AVX", "AVX2", "AVX512", "NEON"] = Field(
        "auto",
        description="CTranslate2's CPU kernels: auto (the best this CPU has) or one ISA, "
        "for the same float32 outputs on every machine that has it",
    )
    max_batch_tokens: int = Field(4096, ge=1, description="padded source tokens per batch")
    max_batch_sentences: int = Field(
        64, ge=1, description="sentences per batch at most (apertium: sentences per batch)"
    )
    max_input_tokens: int = Field(
        256, ge=2, description="sources are truncated to this many tokens"
    )
    max_length: int = Field(256, ge=1, description="output tokens at most")
    max_length_ratio: float | None = Field(2.0, gt=0, description="output <= ratio x source + 8")
    min_length: int = Field(0, ge=0, description="output tokens at least (0: free)")
    seed: int = Field(0, description="seed of noise and sampling")
    routes: list[RouteConfig] = Field(default_factory=_default_routes, min_length=1)
    noise: NoiseConfig = Field(default_factory=NoiseConfig)

    @model_validator(mode="after")
    def _check(self) -> BacktranslateConfig:
        names = [r.name for r in self.routes]
        if len(set(names)) != len(names):
            raise ValueError(f"route names must be unique, got {names}")
        Lengths(**self._length_fields())  # min_length <= max_length
        self._check_engine_specs()
        return self

    def _check_engine_specs(self) -> None:
        """Apertium modes go with the apertium engine, Marian models with the others."""
        for r in self.routes:
            for leg, spec in (("forward", r.forward), ("backward", r.backward)):
                if self.engine == "apertium" and not is_apertium_spec(spec):
                    raise ValueError(
                        f"routes {r.name}.{leg}: engine apertium translates with apertium:<mode> "
                        f"specs (e.g. apertium:eng-spa), got {spec!r}"
                    )
                if self.engine != "apertium" and is_apertium_spec(spec):
                    raise ValueError(
                        f"routes {r.name}.{leg}: {spec!r} is an Apertium mode: set engine: apertium"
                    )
            if self.engine != "apertium":
                continue
            if r.forward_revision or r.backward_revision:
                raise ValueError(f"routes {r.name}: a revision applies to hub ids, not Apertium")
            strategies = {d.strategy for d in (r.pivot_decoding, *r.decodings)}
            if strategies != {"greedy"}:
                raise ValueError(
                    f"routes {r.name}: Apertium gives one translation per input: "
                    "pivot_decoding and decodings must be greedy"
                )

    def _length_fields(self) -> dict:
        return {
            "max_input_tokens": self.max_input_tokens,
            "max_length": self.max_length,
            "max_length_ratio": self.max_length_ratio,
            "min_length": self.min_length,
        }

    def lengths(self) -> Lengths:
        return Lengths(**self._length_fields())


STAGE = StageDef(
    name="backtranslate",
    module=__name__,
    config=BacktranslateConfig,
    # The routes name the translation models, which the standin stage writes in the demo.
    inputs=("${backtranslate.input}", "${standin.output}"),
    outputs=("output", "metrics", "plot"),
    free=("cache", "models_dir", "threads"),
    datasets=("output",),
    outs={
        "${backtranslate.metrics}": {"cache": False},
        "${backtranslate.output}": {"persist": True},
    },
    plots={
        "${backtranslate.plot}": {"cache": False},
    },
    headlines={"rows_out": "candidates_out", "identical_rate": "identical_rate"},
)


def _model_key(spec: str, revision: str | None) -> str:
    return f"{spec}@{revision}" if revision else spec


def resolve_models(cfg: BacktranslateConfig) -> dict[str, ModelRef]:
    """Every model the routes name, resolved to files (ConfigError when one is missing)."""
    refs: dict[str, ModelRef] = {}
    for route in cfg.routes:
        for spec, revision in (
            (route.forward, route.forward_revision),
            (route.backward, route.backward_revision),
        ):
            key = _model_key(spec, revision)
            if key not in refs:
                refs[key] = resolve_translation_model(spec, revision)
    return refs


def route_plans(cfg: BacktranslateConfig) -> tuple[RoutePlan, ...]:
    return tuple(
        RoutePlan(
            name=r.name,
            forward=_model_key(r.forward, r.forward_revision),
            backward=_model_key(r.backward, r.backward_revision),
            pivot_decoding=r.pivot_decoding,
            decodings=tuple(r.decodings),
            noise=r.noise,
        )
        for r in cfg.routes
    )


def _noise_vocabulary(cfg: BacktranslateConfig, sentences) -> list[str]:
    if cfg.noise.copies == 0 or not any(r.noise for r in cfg.routes):
        return []
    if "insert" not in cfg.noise.kinds:
        return []
    if cfg.noise.vocabulary:
        return list(cfg.noise.vocabulary)
    texts = (t for table in sentences.iter_shards([S.TEXT]) for t in table[S.TEXT].to_pylist())
    return frequent_words(texts, cfg.noise.top_words)


def run(cfg: BacktranslateConfig, executor: Executor | None = None, progress: bool = True) -> dict:
    """Run the whole stage; returns the metrics it also writes to ``cfg.metrics``."""
    with StageRun(STAGE, cfg, executor, progress) as run:
        sentences = run.input("input", S.SENTENCES)
        try:
            settings = engine_settings(
                cfg.engine, cfg.device, cfg.compute_type, cfg.threads, cfg.models_dir, cfg.cpu_isa
            )
        except ConfigError as exc:
            raise ConfigError(f"{STAGE.name}.{exc}") from None
        refs = resolve_models(cfg)
        conversions = {"performed": 0, "reused": 0}
        if settings.engine == "ctranslate2":
            for ref in refs.values():
                _, converted = convert_ctranslate2(ref, settings.compute_type, settings.models_dir)
                conversions["performed" if converted else "reused"] += 1
        vocabulary = _noise_vocabulary(cfg, sentences)
        writer = run.output(
            "output",
            S.CANDIDATES,
            extra={
                "models": {k: r.revision for k, r in refs.items()},
                "engine": settings.identity(),
                "noise_vocabulary": vocabulary,
            },
        )
        if not writer.complete:
            fn = functools.partial(
                backtranslate_shard,
                routes=route_plans(cfg),
                pool=TranslatorPool(refs, settings),
                cache=KeyValueCache(cfg.cache, "translations") if cfg.cache else MemoryCache(),
                lengths=cfg.lengths(),
                batching=Batching(cfg.max_batch_tokens, cfg.max_batch_sentences),
                noise=NoiseSettings.of(cfg.noise, vocabulary, cfg.seed),
                seed=cfg.seed,
                progress=progress,
            )
            run.map(fn, sentences, {"candidates": writer})
            counts = run.totals(writer)
            writer.finalize(
                len(sentences), extra=_manifest_extra(cfg, refs, settings, vocabulary, counts)
            )
        manifest = json.loads((dataset_path(cfg.output) / "_manifest.json").read_text())
        routes = [r.name for r in cfg.routes]
        metrics = run.finish(summarize(cfg.output, routes, manifest, conversions))
        plot_edit_ratio(cfg.output, routes, cfg.plot)
        t = metrics["translations"]
        log.info(
            "backtranslate: %d sentences -> %d candidates (%d identical) on %s/%s in %.1fs; "
            "translations: %d performed, %d cache hits, %d saved by dedup%s",
            metrics["sentences_in"],
            metrics["candidates_out"],
            metrics["identical"],
            settings.engine,
            settings.compute_type,
            run.seconds,
            t["performed"],
            t["cache_hits"],
            t["dedup_saved"],
            "; STAND-IN models (not translations)" if metrics["standin"] else "",
        )
        return metrics


def _manifest_extra(cfg, refs: dict[str, ModelRef], settings, vocabulary, counts) -> dict:
    standins = {k: r.standin for k, r in refs.items() if r.standin}
    extra = {
        "counts": counts,
        "engine": {
            "engine": settings.engine,
            "compute_type": settings.compute_type,
            "device": settings.device,
            # What CTranslate2's CPU kernels were pinned to (auto: this CPU's best).
            "cpu_isa": settings.cpu_isa if settings.pins_cpu_isa else "auto",
        },
        "models": {
            k: {
                "spec": r.spec,
                "revision": r.revision,
                "local": r.local,
                "standin": bool(r.standin),
            }
            for k, r in refs.items()
        },
        "noise_vocabulary": vocabulary,
        "standin": None,
    }
    if standins:
        extra["standin"] = {
            "note": next(iter(standins.values()))["note"],
            "models": sorted(standins),
        }
    return extra


# --- the command ------------------------------------------------------------------------------


@stage_command(STAGE)
def command(cfg: BacktranslateConfig, workers: int, scheduler: str | None, progress: bool) -> None:
    """Translate sentences to a pivot language and back to make positive candidates.

    Every option defaults to the key of the same name in the `backtranslate` section of
    params.yaml; routes, decodings and noise are set there. Finished shards are kept when a run
    is interrupted, and the translation cache makes a rerun translate nothing twice.
    """
    if cfg.engine == "transformers" and cfg.compute_type.startswith("int8"):
        raise ConfigError("backtranslate.compute_type: int8 types need engine ctranslate2")
    with executor(workers, scheduler) as ex:
        run(cfg, ex, progress=progress)
