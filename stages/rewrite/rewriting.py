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
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.cache import cache_key
from pairforge.pipeline.plumbing.progress import Progress
from pairforge.pipeline.plumbing.runner import ShardResult
from pairforge.pipeline.science.candidate_quality import candidate_id, quality_signals
from pairforge.stages.rewrite.llm import (
    ChatClient,
    ChatSettings,
    Reply,
    Validation,
    validate_rewrite,
)

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
    counts: Counter = Counter(rows=table.num_rows)
    unique = list(dict.fromkeys(table[S.TEXT].to_pylist()))
    keys = {t: _request_key(client, t) for t in unique}
    answers = _cached_answers(unique, keys, cache, counts)
    todo = [t for t in unique if t not in answers]
    answers.update(_ask_all(todo, keys, client, cache, counts, progress))
    good, bad = _sort_rows(table, answers, validation, counts)
    counts["rewritten"] = len(good["id"])
    return ShardResult(
        {"rewrites": _rewrites_table(good, client.settings), "rejected": _rejected_table(bad)},
        {k: int(v) for k, v in counts.items()},
    )


def _cached_answers(
    unique: list[str], keys: dict[str, str], cache, counts: Counter
) -> dict[str, Reply]:
    """``{text: reply}`` for the texts whose answer is in ``cache`` (under ``keys[text]``).
    Adds ``cache_hits`` and ``cached_tokens.<prompt|completion>`` to ``counts``."""
    cached = cache.get_many(keys.values()) if unique else {}
    answers: dict[str, Reply] = {}
    for t in unique:
        hit = cached.get(keys[t])
        if hit is not None:
            answers[t] = Reply(hit["text"], hit["prompt_tokens"], hit["completion_tokens"])
            counts["cache_hits"] += 1
            counts["cached_tokens.prompt"] += hit["prompt_tokens"]
            counts["cached_tokens.completion"] += hit["completion_tokens"]
    return answers


def _ask_all(
    todo: list[str],
    keys: dict[str, str],
    client: ChatClient,
    cache,
    counts: Counter,
    progress: bool,
) -> dict[str, Reply]:
    """``{text: reply}`` for every text of ``todo``, asked ``client.settings.concurrency`` at a
    time. Each answer is put in ``cache`` as soon as it arrives (a failed request is not), so
    an interrupted shard sends it no more. Adds ``requests``, ``retries.<kind>`` and
    ``tokens.<prompt|completion>`` to ``counts``, in ``todo`` order."""
    answers: dict[str, Reply] = {}
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
    return answers


def _verdict(text: str, reply: Reply, validation: Validation) -> tuple[str, str | None, str | None]:
    """``(cleaned answer, reason or None, detail)`` of one row: a failed request's kind
    (``request_failed`` when it has none) and error, or ``validate_rewrite``'s verdict and the
    answer's first 300 characters. The cleaned answer is empty for a failed request."""
    if reply.text is None:
        return "", reply.kind or "request_failed", reply.error
    cleaned, reason = validate_rewrite(text, reply.text, validation)
    return cleaned, reason, f"answer: {reply.text[:300]!r}"


def _sort_rows(
    table: pa.Table, answers: dict[str, Reply], validation: Validation, counts: Counter
) -> tuple[dict[str, list], dict[str, list]]:
    """``(good, bad)`` columns, in row order: ``good`` (``id``, ``text`` the cleaned rewrite,
    ``source_text``) for rows whose answer passes, ``bad`` (QUARANTINE's columns, lower case:
    ``reason``, ``source``, ``line``, ``text`` cut to PREVIEW_CHARS, ``n_bytes``, ``detail``)
    for the rest. Adds ``rejected.<reason>`` to ``counts``."""
    good: dict[str, list] = {k: [] for k in ("id", "text", "source_text")}
    bad: dict[str, list] = {
        k: [] for k in ("reason", "source", "line", "text", "n_bytes", "detail")
    }
    columns = (table[c].to_pylist() for c in (S.ID, S.TEXT, S.SOURCE, S.LINE))
    for sid, text, source, line in zip(*columns, strict=True):
        cleaned, reason, detail = _verdict(text, answers[text], validation)
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
    return good, bad


def _rewrites_table(good: dict[str, list], settings: ChatSettings) -> pa.Table:
    """The passing rows as a CANDIDATES table: route ``llm``, engine ``openai``, the chat
    settings' model and decoding label, no noise, no pivot, quality signals scored against
    the source sentence."""
    decoding = settings.decoding_label()
    identical, length_ratio, edit_ratio = quality_signals(good["source_text"], good["text"])
    n = len(good["id"])
    return pa.table(
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


def _rejected_table(bad: dict[str, list]) -> pa.Table:
    """The rejected rows as a QUARANTINE table."""
    return pa.table(
        {
            S.REASON: pa.array(bad["reason"], pa.string()),
            S.SOURCE: pa.array(bad["source"], pa.string()),
            S.LINE: pa.array(bad["line"], pa.int64()),
            S.TEXT: pa.array(bad["text"], pa.string()),
            S.N_BYTES: pa.array(bad["n_bytes"], pa.int64()),
            S.DETAIL: pa.array(bad["detail"], pa.string()),
        }
    )
