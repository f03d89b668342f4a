"""A local HTTP server that speaks the OpenAI chat-completions protocol, with injected faults.

``FaultyChatServer`` answers ``POST /v1/chat/completions`` the way an OpenAI-compatible endpoint
does (JSON body with ``choices[0].message.content`` and ``usage``). It can misbehave on purpose:

- transient faults, drawn per request from a seeded RNG at ``transient_rate``: HTTP 429 (with
  ``Retry-After: 0``), HTTP 500, a timeout (the answer comes after ``slow_seconds``), or a 200 whose
  body is not JSON;
- content faults, fixed per input sentence at ``content_rate``: an empty answer, a refusal, the
  input unchanged, two lines, or text in another script.

A good answer is a deterministic rewrite of the input. The server counts requests, remembers the
Authorization headers it saw, the arrival time of every request and the most requests in flight
at once, so tests can check retries, rate limits, concurrency and that the key was sent.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TRANSIENT = ("429", "500", "timeout", "malformed")
CONTENT = ("empty", "refusal", "identical", "multiline", "wrong_language", "too_long")
# A runaway answer of 1 MB, in another script: it must be quarantined as too long, not as the
# wrong language (the length is tested first, before anything reads its words).
RUNAWAY = "这是一个完全不同的句子，而且不是英语。" * 18_500
PROMPT_PREFIX = "Rewrite: "


def good_rewrite(text: str) -> str:
    """What the server answers when it behaves: a rewrite that passes validation."""
    body = text[0].lower() + text[1:] if text[:1].isupper() and text[1:2].islower() else text
    return f"In other words, {body}"


def content_fault(text: str, rate: float) -> str | None:
    """The content fault this input always gets, or None (fixed per text, not per request)."""
    h = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    if (h % 10_000) / 10_000 >= rate:
        return None
    return CONTENT[(h >> 20) % len(CONTENT)]


def faulty_answer(text: str, fault: str) -> str:
    return {
        "empty": "   ",
        "refusal": "I'm sorry, but I can't help with rewriting this sentence.",
        "identical": text,
        "multiline": f"Here is a rewrite:\n{good_rewrite(text)}",
        "wrong_language": "这是一个完全不同的句子，而且不是英语。",
        "too_long": RUNAWAY,
    }[fault]


class FaultyChatServer:
    def __init__(
        self,
        transient_rate: float = 0.0,
        content_rate: float = 0.0,
        seed: int = 0,
        slow_seconds: float = 1.0,
        delay: float = 0.0,
        faults: tuple[str, ...] = TRANSIENT,
    ) -> None:
        self.transient_rate = transient_rate
        self.content_rate = content_rate
        self.slow_seconds = slow_seconds
        self.delay = delay
        self.faults = faults
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.requests = 0
        self.by_outcome: dict[str, int] = {}
        self.auth_headers: set[str] = set()
        self.arrivals: list[float] = []
        self.in_flight = 0
        self.max_in_flight = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:
                server._handle(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.handle_error = lambda *a: None  # clients that timed out close their sockets
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> FaultyChatServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def reset_counts(self) -> None:
        with self.lock:
            self.requests = 0
            self.by_outcome = {}
            self.arrivals = []
            self.max_in_flight = 0

    def _count(self, outcome: str) -> None:
        self.by_outcome[outcome] = self.by_outcome.get(outcome, 0) + 1

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        length = int(req.headers.get("Content-Length", 0))
        body = json.loads(req.rfile.read(length) or b"{}")
        with self.lock:
            self.requests += 1
            self.arrivals.append(time.monotonic())
            self.auth_headers.add(req.headers.get("Authorization", ""))
            self.in_flight += 1
            req.pairforge_in_flight = True
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            draw = self.rng.random()
            kind = self.faults[self.rng.randrange(len(self.faults))]
        try:
            if self.delay:
                time.sleep(self.delay)
            if req.path.rstrip("/") != "/v1/chat/completions":
                self._send(req, 404, {"error": {"message": "not found"}})
                return
            if draw < self.transient_rate:
                self._transient(req, kind)
                return
            prompt = body["messages"][-1]["content"]
            text = prompt[len(PROMPT_PREFIX) :] if prompt.startswith(PROMPT_PREFIX) else prompt
            fault = content_fault(text, self.content_rate)
            answer = faulty_answer(text, fault) if fault else good_rewrite(text)
            with self.lock:
                self._count(fault or "ok")
            self._send(
                req,
                200,
                {
                    "id": "chatcmpl-test",
                    "object": "chat.completion",
                    "created": 0,
                    "model": body.get("model", "test"),
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": answer},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {
                        "prompt_tokens": len(prompt.split()) + 7,
                        "completion_tokens": len(answer.split()),
                        "total_tokens": len(prompt.split()) + 7 + len(answer.split()),
                    },
                },
            )
        finally:
            self._answered(req)  # when the handler failed before answering

    def _answered(self, req: BaseHTTPRequestHandler) -> None:
        """A request stops counting as in flight when its answer starts, not when its handler
        returns: the client may read the answer and send its next request before this thread
        runs again (seen under load: 4 counted in flight with 3 workers), which is not a fourth
        request in flight on the client's side. A request that was never counted (a test that
        answers through `_send` from its own handler) leaves the count alone."""
        with self.lock:
            if getattr(req, "pairforge_in_flight", False):
                req.pairforge_in_flight = False
                self.in_flight -= 1

    def _transient(self, req: BaseHTTPRequestHandler, kind: str) -> None:
        with self.lock:
            self._count(kind)
        if kind == "429":
            self._send(
                req,
                429,
                {"error": {"message": "rate limited", "type": "rate_limit"}},
                {"Retry-After": "0"},
            )
        elif kind == "500":
            self._send(req, 500, {"error": {"message": "internal error"}})
        elif kind == "timeout":
            time.sleep(self.slow_seconds)
            with contextlib.suppress(OSError):  # the client has given up and closed
                self._send(req, 200, {"choices": []})
        else:
            raw = b'{"id": "chatcmpl-broken", "choices": [{"message": '
            self._answered(req)
            req.send_response(200)
            req.send_header("Content-Type", "application/json")
            req.send_header("Content-Length", str(len(raw)))
            req.end_headers()
            req.wfile.write(raw)

    def _send(
        self, req: BaseHTTPRequestHandler, status: int, obj: dict, headers: dict | None = None
    ) -> None:
        raw = json.dumps(obj).encode()
        self._answered(req)
        req.send_response(status)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(raw)))
        for k, v in (headers or {}).items():
            req.send_header(k, v)
        req.end_headers()
        req.wfile.write(raw)
