"""LLM rewriting through any OpenAI-compatible chat-completions endpoint.

- ``ChatClient``: the ``openai`` client (its own retries off) behind our retry loop: exponential
  backoff with jitter (``Retry-After`` honoured) on HTTP 429, 5xx, timeouts, connection errors
  and malformed responses (a body that is not JSON, no choices, no content). Authentication,
  permission and not-found errors stop the stage with one clear line: every row would fail.
  Other 4xx answers are final for their row (quarantined as ``rejected_request``).
- ``RateLimiter``: requests spaced to stay under a requests-per-minute limit, shared by the
  threads of one process; ``concurrency`` threads at most are in flight.
- ``validate_rewrite``: score-then-decide checks of an answer (see its docstring).

The API key is read from the environment variable whose *name* is configured, in the process
that sends requests, and is never stored, logged or written: error texts are scrubbed of it
before they reach logs, the quarantine or metrics.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any

from pairforge.pipeline.plumbing.errors import ConfigError, PairforgeError
from pairforge.pipeline.science.text import squeeze_spaces

log = logging.getLogger("pairforge")


@dataclass(frozen=True)
class ChatSettings:
    """What the chat client reads of the ``rewrite`` config, taken from it by field name (``of``).

    ``RewriteConfig`` (``stages/rewrite/stage.py``) declares these keys, their validation and their
    defaults; this view declares none. It exists so that this module depends on nothing
    above it and the client sees only what it sends (the key's variable name, never a key).
    """

    base_url: str
    model: str
    api_key_env: str
    prompt: str
    system: str | None
    temperature: float
    max_tokens: int
    timeout: float
    max_retries: int
    backoff_base: float
    backoff_max: float
    concurrency: int
    requests_per_minute: int

    @classmethod
    def of(cls, config: Any) -> ChatSettings:
        """The view of ``config`` (a ``RewriteConfig``, or anything with its field names)."""
        return cls(**{f.name: getattr(config, f.name) for f in fields(cls)})

    def messages(self, text: str) -> list[dict[str, str]]:
        user = self.prompt.replace("{text}", text)
        return ([{"role": "system", "content": self.system}] if self.system else []) + [
            {"role": "user", "content": user}
        ]

    def decoding_label(self) -> str:
        return f"chat(temperature={self.temperature},max_tokens={self.max_tokens})"

    def cache_fields(self) -> dict[str, Any]:
        return {
            "base_url": self.base_url.rstrip("/"),
            "model": self.model,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }


@dataclass
class Reply:
    """One row's outcome: ``text`` and token usage, or ``error`` (``kind``: ``request_failed``
    after the last retry, ``rejected_request`` for a final 4xx)."""

    text: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
    kind: str | None = None
    requests: int = 0
    retries: Counter = field(default_factory=Counter)


class RateLimiter:
    """At most ``per_minute`` acquisitions per minute, evenly spaced (0: unlimited)."""

    def __init__(self, per_minute: int) -> None:
        self.interval = 60.0 / per_minute if per_minute > 0 else 0.0
        self.lock = threading.Lock()
        self.next_slot = 0.0

    def acquire(self) -> None:
        if not self.interval:
            return
        with self.lock:
            now = time.monotonic()
            slot = max(now, self.next_slot)
            self.next_slot = slot + self.interval
        if slot > now:
            time.sleep(slot - now)


class _Transient(Exception):
    def __init__(self, kind: str, detail: str, retry_after: float | None = None) -> None:
        super().__init__(detail)
        self.kind = kind
        self.retry_after = retry_after


class ChatClient:
    """Sends one chat completion per call, retrying transient failures. Picklable: the openai
    client, the key and the rate limiter are made in the process that uses them."""

    def __init__(self, settings: ChatSettings, rng_seed: int = 0) -> None:
        self.settings = settings
        self.rng_seed = rng_seed
        self._client = None
        self._key: str | None = None
        self._limiter = RateLimiter(settings.requests_per_minute)
        self._lock = threading.Lock()
        self._rng = random.Random(rng_seed)

    def __getstate__(self) -> dict[str, Any]:
        return {"settings": self.settings, "rng_seed": self.rng_seed}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["settings"], state["rng_seed"])

    def _openai(self):
        if self._client is None:
            import openai

            key = os.environ.get(self.settings.api_key_env)
            if not key:
                raise ConfigError(
                    f"rewrite: environment variable {self.settings.api_key_env} (rewrite.api_key_env) "
                    "is not set; export the API key there"
                )
            self._key = key
            self._client = openai.OpenAI(
                api_key=key,
                base_url=self.settings.base_url,
                max_retries=0,
                timeout=self.settings.timeout,
            )
        return self._client

    def scrub(self, text: str) -> str:
        """``text`` with the API key (if it appears) replaced by ``***``."""
        return text.replace(self._key, "***") if self._key else text

    def _once(self, messages: list[dict[str, str]]) -> tuple[str, int, int]:
        import openai

        client = self._openai()
        try:
            response = client.chat.completions.create(
                model=self.settings.model,
                messages=messages,
                temperature=self.settings.temperature,
                max_tokens=self.settings.max_tokens,
            )
        except openai.RateLimitError as exc:
            raise _Transient("429", _status_detail(exc), _retry_after(exc)) from None
        except (
            openai.AuthenticationError,
            openai.PermissionDeniedError,
            openai.NotFoundError,
        ) as exc:
            raise PairforgeError(
                f"rewrite: {self.settings.base_url} answered {exc.status_code} for model "
                f"{self.settings.model!r}: {self.scrub(_status_detail(exc))} (check the key in "
                f"${self.settings.api_key_env}, the base_url and the model name)"
            ) from None
        except openai.APIStatusError as exc:
            if exc.status_code >= 500 or exc.status_code in (408, 409):
                raise _Transient(
                    "5xx" if exc.status_code >= 500 else str(exc.status_code),
                    _status_detail(exc),
                    _retry_after(exc),
                ) from None
            raise _Final(f"HTTP {exc.status_code}: {_status_detail(exc)}") from None
        except openai.APITimeoutError:
            raise _Transient("timeout", f"no answer within {self.settings.timeout}s") from None
        except openai.APIConnectionError as exc:
            raise _Transient("connection", f"connection error: {exc}") from None
        except (json.JSONDecodeError, openai.APIResponseValidationError, ValueError) as exc:
            raise _Transient(
                "malformed", f"malformed response: {type(exc).__name__}: {exc}"
            ) from None
        try:
            content = response.choices[0].message.content
            if not isinstance(content, str):
                raise TypeError(f"content is {type(content).__name__}")
        except (AttributeError, IndexError, TypeError) as exc:
            raise _Transient("malformed", f"malformed response: {exc}") from None
        usage = getattr(response, "usage", None)
        return (
            content,
            int(getattr(usage, "prompt_tokens", 0) or 0),
            int(getattr(usage, "completion_tokens", 0) or 0),
        )

    def complete(self, messages: list[dict[str, str]]) -> Reply:
        """One answer, after up to ``max_retries`` retries of transient failures."""
        reply = Reply()
        s = self.settings
        for attempt in range(s.max_retries + 1):
            self._limiter.acquire()
            reply.requests += 1
            try:
                reply.text, reply.prompt_tokens, reply.completion_tokens = self._once(messages)
                return reply
            except _Final as exc:
                reply.error, reply.kind = self.scrub(str(exc)), "rejected_request"
                return reply
            except _Transient as exc:
                reply.retries[exc.kind] += 1
                reply.error = self.scrub(f"{exc.kind}: {exc}")
                if attempt == s.max_retries:
                    break
                with self._lock:
                    jitter = self._rng.uniform(0.5, 1.0)
                delay = min(s.backoff_max, s.backoff_base * 2**attempt) * jitter
                if exc.retry_after is not None:
                    delay = max(delay, min(exc.retry_after, s.backoff_max))
                time.sleep(delay)
        reply.kind = "request_failed"
        reply.retries["exhausted"] += 1
        reply.error = f"gave up after {reply.requests} requests; last: {reply.error}"
        return reply


class _Final(Exception):
    pass


def _status_detail(exc) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        message = body.get("message") or (body.get("error") or {}).get("message")
        if message:
            return str(message)[:300]
    return str(getattr(exc, "message", exc))[:300]


def _retry_after(exc) -> float | None:
    response = getattr(exc, "response", None)
    value = response.headers.get("retry-after") if response is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


# --- validation -------------------------------------------------------------------------------

_REFUSAL = re.compile(
    r"^\W*(i'?m sorry|i am sorry|sorry[,.!]|i apologi[sz]e|i can(?:'|no)?t\b|i cannot|i am unable|"
    r"i'?m unable|i won'?t|as an ai\b|as a language model|i'?m not able|i am not able)",
    re.IGNORECASE,
)
_QUOTES = {'"': '"', "'": "'", "\u201c": "\u201d", "\u2018": "\u2019", "`": "`"}
ENGLISH_STOPWORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "and",
        "or",
        "but",
        "of",
        "to",
        "in",
        "on",
        "at",
        "for",
        "with",
        "by",
        "from",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "it",
        "its",
        "this",
        "that",
        "these",
        "those",
        "as",
        "not",
        "no",
        "he",
        "she",
        "they",
        "we",
        "you",
        "i",
        "his",
        "her",
        "their",
        "our",
        "your",
        "has",
        "have",
        "had",
        "do",
        "does",
        "did",
        "will",
        "would",
        "can",
        "could",
        "should",
        "may",
        "might",
        "there",
        "here",
        "what",
        "which",
        "who",
        "when",
        "where",
        "how",
        "all",
        "some",
    ]
)
# Function words of the languages an English rewrite most often comes back in (French, German,
# Spanish, Italian, Portuguese, Dutch), leaving out those that are also common English words
# ("die", "den", "per", "van", "also", "a", "in", ...): a hit is evidence of another language.
FOREIGN_FUNCTION_WORDS = frozenset(
    """
    le la les des du au aux est et une dans pour qui que pas sur avec ces cette sont nous vous
    ils elle très mais ou où leur été être aussi dont chez
    der das und ist nicht ein eine einen einem mit auf für sich dem von zu auch ich wir sie wird
    werden sind nach bei sehr oder aber noch heute
    el los las es y por para una del muy pero como está
    il gli della che non è sono molto questo
    não uma com
    het een niet zijn ook maar dat voor
    """.split()  # noqa: SIM905 - one line per language reads better than 92 quoted words
)
REASONS = (
    "empty",
    "too_long",
    "multiline",
    "refusal",
    "identical",
    "wrong_language",
    "bad_length",
    "request_failed",
    "rejected_request",
)


@dataclass(frozen=True)
class Validation:
    """Limits of ``validate_rewrite``; ``language`` ``en`` or null (no language check)."""

    language: str | None = "en"
    min_ascii_letters: float = 0.8
    min_length_ratio: float = 0.3
    max_length_ratio: float = 3.0


def clean_answer(text: str) -> str:
    """Strip whitespace and one pair of quotes around the whole answer."""
    out = text.strip()
    if len(out) >= 2 and out[0] in _QUOTES and out[-1] == _QUOTES[out[0]]:
        out = out[1:-1].strip()
    return out


def _ascii_letter_share(text: str) -> float:
    letters = [c for c in text if c.isalpha()]
    return sum(c.isascii() for c in letters) / len(letters) if letters else 1.0


def _comparable(text: str) -> str:
    return squeeze_spaces(text).casefold().rstrip(".!?;: ")


def validate_rewrite(source: str, answer: str, v: Validation) -> tuple[str, str | None]:
    """``(cleaned answer, reason or None)``. Reasons, tested in this order:

    - ``empty``: nothing left after cleaning;
    - ``too_long``: more than ``max_length_ratio`` times the source's characters (a runaway or
      padded answer; tested before everything that reads the answer's words);
    - ``multiline``: more than one non-empty line (an explanation, a list of options);
    - ``refusal``: starts like a refusal ("I'm sorry", "I can't", "As an AI", ...);
    - ``identical``: the source again (case, whitespace and final punctuation ignored);
    - ``wrong_language`` (``language: en``, for a source that is mostly ASCII letters): fewer
      than ``min_ascii_letters`` of the letters are ASCII (another script), or at least two
      function words of French, German, Spanish, Italian, Portuguese or Dutch and more of them
      than English ones. Evidence of another language, never the absence of English function
      words (headline-like English has none). A cheap heuristic, not language identification;
    - ``bad_length``: fewer than ``min_length_ratio`` times the source's characters.
    """
    out = clean_answer(answer)
    if not out:
        return out, "empty"
    if len(out) > v.max_length_ratio * max(len(source), 1):
        return out, "too_long"
    if len([line for line in out.splitlines() if line.strip()]) > 1:
        return out, "multiline"
    if _REFUSAL.match(out):
        return out, "refusal"
    if _comparable(out) == _comparable(source):
        return out, "identical"
    if v.language == "en" and _ascii_letter_share(source) >= v.min_ascii_letters:
        words = re.findall(r"[^\W\d_]+", out.casefold())
        foreign = sum(w in FOREIGN_FUNCTION_WORDS for w in words)
        english = sum(w in ENGLISH_STOPWORDS for w in words)
        if _ascii_letter_share(out) < v.min_ascii_letters or (foreign >= 2 and foreign > english):
            return out, "wrong_language"
    if len(out) < v.min_length_ratio * max(len(source), 1):
        return out, "bad_length"
    return out, None
