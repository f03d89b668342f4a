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
from dataclasses import dataclass

import pyarrow as pa
from pairforge.pipeline import schemas as S
from pairforge.pipeline.cache import cache_key
from pairforge.pipeline.candidate_quality import candidate_id, quality_signals
from pairforge.pipeline.progress import Progress
from pairforge.pipeline.runner import ShardResult
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
    base = {
        "model": translator.ref.cache_name,
        **translator.settings.identity(),
        "decoding": decoding.cache_fields(),
        "lengths": lengths.model_dump(),
    }
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
    if todo:
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
    cols: dict[str, list] = {
        name: []
        for name in (S.ID, S.CANDIDATE_ID, S.TEXT, S.ROUTE, S.DECODING, S.NOISE, S.NOISED_TEXT)
    }
    cols[S.PIVOT] = []
    cols[S.MODEL] = []
    sources: list[str] = []
    for route in routes:
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
        noised = [nt for found in variants for _, nt in found]
        pivots, c = translate_texts(
            pool.get(route.forward),
            noised,
            route.pivot_decoding,
            lengths,
            batching,
            cache,
            seed,
            f"backtranslate/{route.name}/forward",
            progress,
        )
        _add(counts, f"{route.name}.forward", c)
        pivot_of = {nt: outs[0] for nt, outs in pivots.items()}
        prefix = (
            "" if route.pivot_decoding.strategy == "greedy" else route.pivot_decoding.label() + ">"
        )
        back: list[dict[str, list[str]]] = []
        for decoding in route.decodings:
            outs, c = translate_texts(
                pool.get(route.backward),
                list(pivot_of.values()),
                decoding,
                lengths,
                batching,
                cache,
                seed,
                f"backtranslate/{route.name}/backward",
                progress,
            )
            _add(counts, f"{route.name}.backward", c)
            back.append(outs)
        n_before = len(cols[S.ID])
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
                            candidate_id(
                                sid, route.name, route.model, dec_label, noise_label, index
                            )
                        )
                        cols[S.TEXT].append(candidate)
                        cols[S.ROUTE].append(route.name)
                        cols[S.MODEL].append(route.model)
                        cols[S.DECODING].append(dec_label)
                        cols[S.NOISE].append(noise_label)
                        cols[S.NOISED_TEXT].append(noised_text)
                        cols[S.PIVOT].append(pivot)
                        sources.append(text)
        counts[f"{route.name}.candidates"] += len(cols[S.ID]) - n_before
    identical, length_ratio, edit_ratio = quality_signals(sources, cols[S.TEXT])
    n = len(cols[S.ID])
    engine = pool.settings.engine
    out = pa.table(
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
    counts["candidates"] = n
    counts["identical"] = int(identical.sum())
    counts["empty"] = sum(1 for t in cols[S.TEXT] if not t.strip())
    for route in routes:
        mask = [r == route.name for r in cols[S.ROUTE]]
        counts[f"{route.name}.identical"] = int(identical[mask].sum()) if n else 0
    return ShardResult({"candidates": out}, {k: int(v) for k, v in counts.items()})


def _route_noise(noise: NoiseSettings, route: str) -> NoiseSettings:
    # Each route draws its own noise, so two noised routes give different inputs.
    return NoiseSettings(**{**noise.__dict__, "seed": _seed(noise.seed, route)})


def _add(counts: Counter, prefix: str, part: Counter) -> None:
    for key, value in part.items():
        counts[f"{prefix}.{key}"] += value
