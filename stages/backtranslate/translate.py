"""The per-shard function of ``backtranslate``: sentences in, positive candidates out.

For each route (``en-zh-en``: forward model en->zh, backward model zh->en):

1. variants: the sentence, plus DebCSE noised copies when the route asks for noise;
2. forward pass: every distinct variant translated once to the pivot language (pivot decoding,
   greedy by default), cached;
3. backward passes: every distinct pivot translated back once per decoding (greedy, beam,
   sampling with ``n`` candidates), cached. One forward pass serves all backward decodings;
4. one candidate row per (sentence, variant, decoding, index) with its quality signals.

Translation requests are deduplicated within the shard (a sentence or pivot that occurs twice is
translated once) and looked up in the cache before any model runs; what is left is translated in
length-sorted batches under a token budget, and each batch is committed to the cache when done.
Counts per route and pass: ``requested`` = ``dedup_saved`` + ``cache_hits`` + ``translated``.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.cache import cache_key
from pairforge.pipeline.plumbing.progress import Progress
from pairforge.pipeline.plumbing.runner import ShardResult
from pairforge.pipeline.science.candidate_quality import candidate_id, quality_signals
from pairforge.stages.backtranslate.batching import plan_batches
from pairforge.stages.backtranslate.decoding import Decoding, Lengths
from pairforge.stages.backtranslate.engines import Translator, TranslatorPool
from pairforge.stages.backtranslate.noise import NoiseSettings, noise_kind, noise_variants
from pairforge.stages.backtranslate.sampling import SAMPLER


@dataclass(frozen=True)
class RoutePlan:
    """One round trip: ``forward`` and ``backward`` model specs and how to decode each leg."""

    name: str
    forward: str
    backward: str
    pivot_decoding: Decoding
    decodings: tuple[Decoding, ...]
    noise: bool

    @property
    def model(self) -> str:
        return f"{self.forward}+{self.backward}"


@dataclass(frozen=True)
class Batching:
    max_tokens: int
    max_sentences: int


def _seed(*parts: object) -> int:
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def translate_texts(
    translator: Translator,
    texts: list[str],
    decoding: Decoding,
    lengths: Lengths,
    batching: Batching,
    cache,
    seed: int,
    label: str = "translate",
    progress: bool = False,
) -> tuple[dict[str, list[str]], Counter]:
    """``{text: [n outputs]}`` for every text, and the counts ``requested``, ``dedup_saved``,
    ``cache_hits`` and ``translated``.

    Sampled outputs depend on each text, the decoding and ``seed`` alone
    (``stages.backtranslate.sampling``), not on the batch a text lands in, so a resumed shard, a
    rerun with another batch size or a corpus that shares texts samples the same outputs.
    """
    unique = list(dict.fromkeys(texts))
    text_engine = getattr(translator, "text_engine", False)
    base = {
        "model": translator.ref.cache_name,
        **translator.settings.identity(),
        "decoding": decoding.cache_fields(),
    }
    if not text_engine:  # a rule-based translation has no token limits
        base["lengths"] = lengths.model_dump()
    if decoding.stochastic:
        base["seed"] = seed
        base["sampler"] = SAMPLER
    keys = {t: cache_key({**base, "text": t}) for t in unique}
    hits = cache.get_many(keys.values()) if unique else {}
    results = {t: hits[keys[t]] for t in unique if keys[t] in hits}
    todo = [t for t in unique if t not in results]
    counts = Counter(
        requested=len(texts),
        dedup_saved=len(texts) - len(unique),
        cache_hits=len(results),
        translated=len(todo),
    )
    if todo and text_engine:
        _translate_text_batches(translator, todo, keys, batching, cache, results, label, progress)
    elif todo:
        ids = translator.encode(todo, lengths.max_input_tokens)
        plan = plan_batches(
            [len(x) for x in ids], batching.max_tokens, batching.max_sentences, todo
        )
        # Per-pass progress only where a pass is long; shard progress covers the rest.
        bar = Progress(
            label, total=len(todo), unit="sentences", enabled=progress and len(todo) >= 5000
        )
        for batch in plan:
            batch_texts = [todo[i] for i in batch]
            batch_ids = [ids[i] for i in batch]
            longest = max(len(x) for x in batch_ids)
            outputs = translator.translate(
                batch_ids,
                decoding,
                max_new=lengths.output_limit(longest),
                min_new=lengths.min_length,
                seed=seed,
            )
            cache.put_many({keys[t]: out for t, out in zip(batch_texts, outputs, strict=True)})
            results.update(zip(batch_texts, outputs, strict=True))
            bar.advance(done=len(batch), rows=len(batch))
        bar.close()
    return results, counts


def _translate_text_batches(
    translator,
    todo: list[str],
    keys: dict,
    batching: Batching,
    cache,
    results: dict,
    label,
    progress,
) -> None:
    """A text engine's pass (Apertium): ``todo`` in order, ``max_sentences`` texts a batch,
    each batch committed to the cache when done."""
    bar = Progress(label, total=len(todo), unit="sentences", enabled=progress and len(todo) >= 5000)
    for start in range(0, len(todo), batching.max_sentences):
        batch = todo[start : start + batching.max_sentences]
        outputs = [[out] for out in translator.translate_texts(batch)]
        cache.put_many({keys[t]: out for t, out in zip(batch, outputs, strict=True)})
        results.update(zip(batch, outputs, strict=True))
        bar.advance(done=len(batch), rows=len(batch))
    bar.close()


def backtranslate_shard(
    table: pa.Table,
    *,
    routes: tuple[RoutePlan, ...],
    pool: TranslatorPool,
    cache,
    lengths: Lengths,
    batching: Batching,
    noise: NoiseSettings,
    seed: int,
    progress: bool = False,
) -> ShardResult:
    """A ``sentences`` shard -> ``candidates`` rows (output ``candidates``) and counts.

    Pure apart from the translators and the cache it is handed. Counts: ``sentences``,
    ``candidates``, ``identical``, ``empty``, ``noise.<kind>`` (variants), ``noise.collisions``,
    and per route ``<route>.candidates``, ``<route>.identical``, ``<route>.<forward|backward>.
    <requested|dedup_saved|cache_hits|translated>``.
    """
    S.SENTENCES.check_table(table, "sentences shard")
    ids = table[S.ID].to_pylist()
    texts = table[S.TEXT].to_pylist()
    counts: Counter = Counter(sentences=len(ids))
    passes = _Passes(pool, cache, lengths, batching, seed, progress)
    rows = _Rows()
    for route in routes:
        variants = _variants(ids, texts, route, noise, counts)
        pivot_of, back = _round_trip(route, variants, passes, counts)
        added = _add_candidates(rows, route, ids, texts, variants, pivot_of, back)
        counts[f"{route.name}.candidates"] += added
    out, identical = _candidates_table(rows, pool.settings.engine)
    _count_candidates(counts, routes, rows, identical)
    return ShardResult({"candidates": out}, {k: int(v) for k, v in counts.items()})


@dataclass(frozen=True)
class _Passes:
    """What every translation pass of one shard shares: the translators, the cache, the limits,
    the batching, the seed and whether to show progress."""

    pool: TranslatorPool
    cache: Any
    lengths: Lengths
    batching: Batching
    seed: int
    progress: bool

    def __call__(
        self, spec: str, texts: list[str], decoding: Decoding, label: str
    ) -> tuple[dict[str, list[str]], Counter]:
        """``translate_texts`` of ``texts`` by the translator of model ``spec``."""
        return translate_texts(
            self.pool.get(spec),
            texts,
            decoding,
            self.lengths,
            self.batching,
            self.cache,
            self.seed,
            label,
            self.progress,
        )


# The columns a candidate row is built with; engine and the quality signals are added per table.
_ROW_COLUMNS = (
    S.ID,
    S.CANDIDATE_ID,
    S.TEXT,
    S.ROUTE,
    S.DECODING,
    S.NOISE,
    S.NOISED_TEXT,
    S.PIVOT,
    S.MODEL,
)


@dataclass
class _Rows:
    """The candidate rows of a shard so far, column by column (``cols``, by schema name), and
    each row's source sentence (``sources``, what the quality signals compare a candidate to)."""

    cols: dict[str, list] = field(default_factory=lambda: {name: [] for name in _ROW_COLUMNS})
    sources: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.cols[S.ID])


def _variants(
    ids: list[str], texts: list[str], route: RoutePlan, noise: NoiseSettings, counts: Counter
) -> list[list[tuple[str, str]]]:
    """Per sentence, its ``[(noise label, noised text), ...]`` on ``route``: the sentence alone
    (label ``none``) unless the route asks for noise. Adds ``noise.collisions`` (noised routes)
    and ``noise.<kind>`` per variant to ``counts``."""
    variants: list[list[tuple[str, str]]] = []
    for sid, text in zip(ids, texts, strict=True):
        if route.noise:
            found, collisions = noise_variants(sid, text, _route_noise(noise, route.name))
            counts["noise.collisions"] += collisions
        else:
            found = [("none", text)]
        variants.append(found)
        for label, _ in found:
            counts[f"noise.{noise_kind(label)}"] += 1
    return variants


def _round_trip(
    route: RoutePlan, variants: list[list[tuple[str, str]]], passes: _Passes, counts: Counter
) -> tuple[dict[str, str], list[dict[str, list[str]]]]:
    """``(pivot_of, back)``: the pivot of every distinct noised text (one forward pass), and per
    backward decoding of the route, in order, ``{pivot: [candidates]}`` (one backward pass each,
    all over the same pivots). Adds ``<route>.<forward|backward>.*`` to ``counts``."""
    noised = [nt for found in variants for _, nt in found]
    pivots, c = passes(
        route.forward, noised, route.pivot_decoding, f"backtranslate/{route.name}/forward"
    )
    _add(counts, f"{route.name}.forward", c)
    pivot_of = {nt: outs[0] for nt, outs in pivots.items()}
    back: list[dict[str, list[str]]] = []
    for decoding in route.decodings:
        outs, c = passes(
            route.backward,
            list(pivot_of.values()),
            decoding,
            f"backtranslate/{route.name}/backward",
        )
        _add(counts, f"{route.name}.backward", c)
        back.append(outs)
    return pivot_of, back


def _add_candidates(
    rows: _Rows,
    route: RoutePlan,
    ids: list[str],
    texts: list[str],
    variants: list[list[tuple[str, str]]],
    pivot_of: dict[str, str],
    back: list[dict[str, list[str]]],
) -> int:
    """Append to ``rows`` one row per (sentence, variant, backward decoding, candidate index),
    in that order, and return how many. A row's decoding label is prefixed with the pivot
    decoding's label and ``>`` when the forward leg is not greedy."""
    prefix = "" if route.pivot_decoding.strategy == "greedy" else route.pivot_decoding.label() + ">"
    cols = rows.cols
    n_before = len(rows)
    for sid, text, found in zip(ids, texts, variants, strict=True):
        for noise_label, noised_text in found:
            pivot = pivot_of[noised_text]
            for decoding, outs in zip(route.decodings, back, strict=True):
                for index, (dec_label, candidate) in enumerate(
                    zip(decoding.candidate_labels(), outs[pivot], strict=True)
                ):
                    dec_label = prefix + dec_label
                    cols[S.ID].append(sid)
                    cols[S.CANDIDATE_ID].append(
                        candidate_id(sid, route.name, route.model, dec_label, noise_label, index)
                    )
                    cols[S.TEXT].append(candidate)
                    cols[S.ROUTE].append(route.name)
                    cols[S.MODEL].append(route.model)
                    cols[S.DECODING].append(dec_label)
                    cols[S.NOISE].append(noise_label)
                    cols[S.NOISED_TEXT].append(noised_text)
                    cols[S.PIVOT].append(pivot)
                    rows.sources.append(text)
    return len(rows) - n_before


def _candidates_table(rows: _Rows, engine: str) -> tuple[pa.Table, np.ndarray]:
    """``(table, identical)``: ``rows`` as a CANDIDATES table with its quality signals scored
    against each row's source, and the ``identical`` flags (bool, one per row)."""
    cols = rows.cols
    identical, length_ratio, edit_ratio = quality_signals(rows.sources, cols[S.TEXT])
    n = len(rows)
    table = pa.table(
        {
            S.ID: pa.array(cols[S.ID], pa.string()),
            S.CANDIDATE_ID: pa.array(cols[S.CANDIDATE_ID], pa.string()),
            S.TEXT: pa.array(cols[S.TEXT], pa.string()),
            S.ROUTE: pa.array(cols[S.ROUTE], pa.string()),
            S.ENGINE: pa.array([engine] * n, pa.string()),
            S.MODEL: pa.array(cols[S.MODEL], pa.string()),
            S.DECODING: pa.array(cols[S.DECODING], pa.string()),
            S.NOISE: pa.array(cols[S.NOISE], pa.string()),
            S.NOISED_TEXT: pa.array(cols[S.NOISED_TEXT], pa.string()),
            S.PIVOT: pa.array(cols[S.PIVOT], pa.string()),
            S.IDENTICAL: pa.array(identical, pa.bool_()),
            S.LENGTH_RATIO: pa.array(length_ratio, pa.float32()),
            S.EDIT_RATIO: pa.array(edit_ratio, pa.float32()),
        }
    )
    return table, identical


def _count_candidates(
    counts: Counter, routes: tuple[RoutePlan, ...], rows: _Rows, identical: np.ndarray
) -> None:
    """Set ``candidates``, ``identical``, ``empty`` (blank text) and ``<route>.identical``."""
    cols = rows.cols
    n = len(rows)
    counts["candidates"] = n
    counts["identical"] = int(identical.sum())
    counts["empty"] = sum(1 for t in cols[S.TEXT] if not t.strip())
    for route in routes:
        mask = [r == route.name for r in cols[S.ROUTE]]
        counts[f"{route.name}.identical"] = int(identical[mask].sum()) if n else 0


def _route_noise(noise: NoiseSettings, route: str) -> NoiseSettings:
    # Each route draws its own noise, so two noised routes give different inputs.
    return NoiseSettings(**{**noise.__dict__, "seed": _seed(noise.seed, route)})


def _add(counts: Counter, prefix: str, part: Counter) -> None:
    for key, value in part.items():
        counts[f"{prefix}.{key}"] += value
