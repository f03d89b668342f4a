"""The per-shard function of ``rewrite``: sentences in, LLM rewrites and rejected rows out.

Every input row ends in exactly one of two tables: ``rewrites`` (CANDIDATES, route ``llm``,
engine ``openai``) when the answer passes ``validate_rewrite``, or ``rejected`` (QUARANTINE)
with the reason: a validation reason, ``request_failed`` (retries exhausted) or
``rejected_request`` (a final 4xx). Answers are cached (the cache key holds the endpoint, model,
messages and sampling settings) as soon as they arrive, so a rerun or a resumed shard sends no
request twice; validation runs on cached answers too, so changing its limits costs nothing.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
from pairforge.pipeline import schemas as S
from pairforge.pipeline.cache import cache_key
from pairforge.pipeline.candidate_quality import candidate_id, quality_signals
from pairforge.pipeline.progress import Progress
from pairforge.pipeline.runner import ShardResult
from pairforge.stages.rewrite.llm import ChatClient, Reply, Validation, validate_rewrite

ROUTE = "llm"
ENGINE = "openai"
PREVIEW_CHARS = 500


def _request_key(client: ChatClient, text: str) -> str:
    s = client.settings
    return cache_key({**s.cache_fields(), "messages": s.messages(text)})


def rewrite_shard(
    table: pa.Table,
    *,
    client: ChatClient,
    cache,
    validation: Validation,
    progress: bool = False,
) -> ShardResult:
    """A ``sentences`` shard -> ``rewrites`` and ``rejected`` tables. Counts: ``rows``,
    ``rewritten``, ``rejected.<reason>``, ``requests`` (HTTP requests sent, retries included),
    ``retries.<kind>``, ``cache_hits``, ``tokens.prompt``/``tokens.completion`` (answers received
    now) and ``cached_tokens.prompt``/``cached_tokens.completion`` (answers from the cache)."""
    S.SENTENCES.check_table(table, "sentences shard")
    ids = table[S.ID].to_pylist()
    texts = table[S.TEXT].to_pylist()
    sources = table[S.SOURCE].to_pylist()
    lines = table[S.LINE].to_pylist()
    counts: Counter = Counter(rows=len(ids))
    unique = list(dict.fromkeys(texts))
    keys = {t: _request_key(client, t) for t in unique}
    cached = cache.get_many(keys.values()) if unique else {}
    answers: dict[str, Reply] = {}
    for t in unique:
        hit = cached.get(keys[t])
        if hit is not None:
            answers[t] = Reply(hit["text"], hit["prompt_tokens"], hit["completion_tokens"])
            counts["cache_hits"] += 1
            counts["cached_tokens.prompt"] += hit["prompt_tokens"]
            counts["cached_tokens.completion"] += hit["completion_tokens"]
    todo = [t for t in unique if t not in answers]
    bar = Progress(
        "rewrite/requests", total=len(todo), unit="sentences", enabled=progress and bool(todo)
    )

    def ask(text: str) -> tuple[str, Reply]:
        reply = client.complete(client.settings.messages(text))
        if reply.text is not None:
            cache.put_many(
                {
                    keys[text]: {
                        "text": reply.text,
                        "prompt_tokens": reply.prompt_tokens,
                        "completion_tokens": reply.completion_tokens,
                    }
                }
            )
        return text, reply

    if todo:
        with ThreadPoolExecutor(max_workers=client.settings.concurrency) as pool:
            for text, reply in pool.map(ask, todo):
                answers[text] = reply
                counts["requests"] += reply.requests
                for kind, n in reply.retries.items():
                    counts[f"retries.{kind}"] += n
                if reply.text is not None:
                    counts["tokens.prompt"] += reply.prompt_tokens
                    counts["tokens.completion"] += reply.completion_tokens
                bar.advance(done=1, rows=1)
    bar.close()

    good: dict[str, list] = {k: [] for k in ("id", "text", "source_text")}
    bad: dict[str, list] = {
        k: [] for k in ("reason", "source", "line", "text", "n_bytes", "detail")
    }
    for sid, text, source, line in zip(ids, texts, sources, lines, strict=True):
        reply = answers[text]
        if reply.text is None:
            reason, detail = reply.kind or "request_failed", reply.error
        else:
            cleaned, reason = validate_rewrite(text, reply.text, validation)
            detail = f"answer: {reply.text[:300]!r}"
        if reason is None:
            good["id"].append(sid)
            good["text"].append(cleaned)
            good["source_text"].append(text)
            continue
        counts[f"rejected.{reason}"] += 1
        bad["reason"].append(reason)
        bad["source"].append(source)
        bad["line"].append(line)
        bad["text"].append(text[:PREVIEW_CHARS])
        bad["n_bytes"].append(len(text.encode()))
        bad["detail"].append(f"id={sid}; {detail}")
    counts["rewritten"] = len(good["id"])
    settings = client.settings
    decoding = settings.decoding_label()
    identical, length_ratio, edit_ratio = quality_signals(good["source_text"], good["text"])
    n = len(good["id"])
    rewrites = pa.table(
        {
            S.ID: pa.array(good["id"], pa.string()),
            S.CANDIDATE_ID: pa.array(
                [candidate_id(i, ROUTE, settings.model, decoding, "none", 0) for i in good["id"]],
                pa.string(),
            ),
            S.TEXT: pa.array(good["text"], pa.string()),
            S.ROUTE: pa.array([ROUTE] * n, pa.string()),
            S.ENGINE: pa.array([ENGINE] * n, pa.string()),
            S.MODEL: pa.array([settings.model] * n, pa.string()),
            S.DECODING: pa.array([decoding] * n, pa.string()),
            S.NOISE: pa.array(["none"] * n, pa.string()),
            S.NOISED_TEXT: pa.array(good["source_text"], pa.string()),
            S.PIVOT: pa.nulls(n, pa.string()),
            S.IDENTICAL: pa.array(identical, pa.bool_()),
            S.LENGTH_RATIO: pa.array(length_ratio, pa.float32()),
            S.EDIT_RATIO: pa.array(edit_ratio, pa.float32()),
        }
    )
    rejected = pa.table(
        {
            S.REASON: pa.array(bad["reason"], pa.string()),
            S.SOURCE: pa.array(bad["source"], pa.string()),
            S.LINE: pa.array(bad["line"], pa.int64()),
            S.TEXT: pa.array(bad["text"], pa.string()),
            S.N_BYTES: pa.array(bad["n_bytes"], pa.int64()),
            S.DETAIL: pa.array(bad["detail"], pa.string()),
        }
    )
    return ShardResult(
        {"rewrites": rewrites, "rejected": rejected}, {k: int(v) for k, v in counts.items()}
    )
