"""The rewrite stage against a local OpenAI-compatible server that misbehaves on purpose."""

from __future__ import annotations

import json
import os
import threading

import pytest
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.errors import ConfigError, PairforgeError
from pairforge.pipeline.plumbing.runner import LocalExecutor
from pairforge.pipeline.plumbing.shards import open_dataset
from pairforge.stages.rewrite import llm
from pairforge.stages.rewrite.llm import (
    ChatClient,
    ChatSettings,
    RateLimiter,
    Validation,
    validate_rewrite,
)
from pairforge.stages.rewrite.stage import RewriteConfig, run

from tests.conftest import run_cli
from tests.stages.augment_helpers import make_sentences, write_params, write_sentences
from tests.stages.rewrite.openai_server import (
    PROMPT_PREFIX,
    FaultyChatServer,
    content_fault,
    good_rewrite,
)

KEY = "sk-test-SECRET-4f9a2c7e1b"
CONTENT_REASON = {
    "empty": "empty",
    "refusal": "refusal",
    "identical": "identical",
    "multiline": "multiline",
    "wrong_language": "wrong_language",
    "too_long": "too_long",
}


def settings(tmp_path, server, **kw) -> dict:
    return {
        "enabled": True,
        "input": str(tmp_path / "sentences"),
        "output": str(tmp_path / kw.pop("name", "rewrites")),
        "quarantine": str(tmp_path / "quarantine/rewrite"),
        "metrics": str(tmp_path / "metrics/rewrite.json"),
        "cache": str(tmp_path / "cache/rewrites.sqlite"),
        "base_url": server.base_url,
        "model": "test-model",
        "api_key_env": "PAIRFORGE_TEST_KEY",
        "prompt": PROMPT_PREFIX + "{text}",
        "timeout": 0.4,
        "max_retries": 8,
        "backoff_base": 0.01,
        "backoff_max": 0.05,
        "concurrency": 6,
        "requests_per_minute": 0,
        **kw,
    }


def test_faults_every_row_ends_rewritten_or_quarantined_and_rerun_sends_nothing(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("PAIRFORGE_TEST_KEY", KEY)
    texts = make_sentences(90, seed=11)
    write_sentences(tmp_path / "sentences", texts, rows_per_shard=30)
    with FaultyChatServer(transient_rate=0.3, content_rate=0.3, seed=1, slow_seconds=0.8) as server:
        cfg = RewriteConfig.model_validate(settings(tmp_path, server))
        metrics = run(cfg, LocalExecutor(), progress=False)
        assert server.auth_headers == {f"Bearer {KEY}"}
        first_requests = server.requests
        good = open_dataset(tmp_path / "rewrites", S.CANDIDATES).read_table().to_pylist()
        bad = open_dataset(tmp_path / "quarantine/rewrite", S.QUARANTINE).read_table().to_pylist()
        assert len(good) + len(bad) == len(texts) == metrics["rows_in"]
        by_text = {r[S.NOISED_TEXT]: r for r in good}
        quarantined = {r[S.TEXT]: r for r in bad}
        for text in texts:  # each row's fate is exactly what the server did to it
            fault = content_fault(text, 0.3)
            if fault is None:
                row = by_text[text]
                assert row[S.TEXT] == good_rewrite(text)
                assert (row[S.ROUTE], row[S.ENGINE], row[S.MODEL]) == (
                    "llm",
                    "openai",
                    "test-model",
                )
                assert not row[S.IDENTICAL] and row[S.PIVOT] is None
            else:
                assert quarantined[text][S.REASON] == CONTENT_REASON[fault]
                assert quarantined[text][S.DETAIL].startswith("id=")
        assert metrics["rejected"]["request_failed"] == 0  # 8 retries outlast a 30% fault rate
        transient = sum(
            v for k, v in server.by_outcome.items() if k in ("429", "500", "timeout", "malformed")
        )
        assert (
            transient > 0
            and sum(metrics["retries"][k] for k in ("429", "5xx", "timeout", "malformed"))
            == transient
        )
        assert metrics["requests_sent"] == first_requests
        assert metrics["tokens"]["prompt"] > 0 and metrics["cost_usd"] > 0

        server.reset_counts()
        again = run(
            RewriteConfig.model_validate(settings(tmp_path, server, name="again")),
            LocalExecutor(),
            progress=False,
        )
        assert server.requests == 0 and again["requests_sent"] == 0
        assert again["cache_hits"] == len(set(texts)) and again["cost_saved_by_cache_usd"] > 0
        assert (
            open_dataset(tmp_path / "again", S.CANDIDATES)
            .read_table()
            .equals(open_dataset(tmp_path / "rewrites", S.CANDIDATES).read_table())
        )


def test_retries_exhausted_are_quarantined_and_retried_on_the_next_run(tmp_path, monkeypatch):
    monkeypatch.setenv("PAIRFORGE_TEST_KEY", KEY)
    texts = make_sentences(20, seed=12)
    write_sentences(tmp_path / "sentences", texts, rows_per_shard=20)
    with FaultyChatServer(transient_rate=1.0, faults=("500", "429")) as server:
        metrics = run(
            RewriteConfig.model_validate(settings(tmp_path, server, max_retries=1)),
            LocalExecutor(),
            progress=False,
        )
        assert metrics["rejected"]["request_failed"] == 20 and metrics["rewritten"] == 0
        assert server.requests == 40 and metrics["retries"]["exhausted"] == 20
        bad = open_dataset(tmp_path / "quarantine/rewrite", S.QUARANTINE).read_table().to_pylist()
        assert all("gave up after 2 requests" in r[S.DETAIL] for r in bad)
        server.transient_rate = 0.0
        server.reset_counts()
        # Failures are not cached: a new run asks again, and now succeeds.
        metrics = run(
            RewriteConfig.model_validate(settings(tmp_path, server, name="second")),
            LocalExecutor(),
            progress=False,
        )
        assert server.requests == 20 and metrics["rewritten"] == 20


def test_concurrency_and_rate_limits_hold(tmp_path, monkeypatch):
    monkeypatch.setenv("PAIRFORGE_TEST_KEY", KEY)
    write_sentences(tmp_path / "sentences", make_sentences(12, seed=13), rows_per_shard=12)
    with FaultyChatServer(delay=0.15) as server:
        # A timeout far above the delay: under load a 0.4 s timeout abandoned requests the server
        # was still answering, and their retries showed 4 in flight on its side (seen at load 4).
        run(
            RewriteConfig.model_validate(settings(tmp_path, server, concurrency=3, timeout=10.0)),
            LocalExecutor(),
            progress=False,
        )
        assert 1 < server.max_in_flight <= 3
    write_sentences(tmp_path / "more", make_sentences(8, seed=14), rows_per_shard=8)
    clock = StoppedClock()
    monkeypatch.setattr(llm, "time", clock)
    with FaultyChatServer() as server:
        cfg = settings(
            tmp_path, server, name="limited", concurrency=4, requests_per_minute=600, timeout=10.0
        )
        cfg["input"] = str(tmp_path / "more")
        metrics = run(RewriteConfig.model_validate(cfg), LocalExecutor(), progress=False)
        assert len(server.arrivals) == 8 and metrics["requests_sent"] == 8
    # 600/min: one request per 0.1 s. Sent at one instant of the limiter's clock, the 8 requests
    # wait 0 to 7 intervals, each its own; no retry's backoff is among the waits.
    assert sorted(clock.waits) == pytest.approx([0.1 * i for i in range(1, 8)])


class StoppedClock:
    """The rate limiter's clock (``llm.time``) stopped at one instant: ``sleep`` records the wait
    it is asked for and returns at once. The waits the limiter computes are then exact, whatever
    the machine's load does to the threads' timing."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.waits: list[float] = []
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.waits.append(seconds)


def test_rate_limiter_spaces_acquisitions_across_threads(monkeypatch):
    clock = StoppedClock()
    monkeypatch.setattr(llm, "time", clock)
    limiter, taken, lock, start = RateLimiter(1200), [], threading.Lock(), threading.Barrier(3)

    def take(thread: int) -> None:
        start.wait()
        for _ in range(4):
            limiter.acquire()
            with lock:
                taken.append(thread)

    threads = [threading.Thread(target=take, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(taken) == 12 and sorted(taken) == [0] * 4 + [1] * 4 + [2] * 4
    # 1200/min: 0.05 s apart. Twelve acquisitions at one instant: the first goes at once, the
    # others wait 1 to 11 intervals, each its own slot whichever thread asked.
    assert sorted(clock.waits) == pytest.approx([0.05 * i for i in range(1, 12)])
    # Once the clock is past the last slot, the next acquisition goes at once and the one after
    # waits a whole interval: an idle limiter banks no burst.
    clock.now += 1.0
    limiter.acquire()
    limiter.acquire()
    assert len(clock.waits) == 12 and clock.waits[-1] == pytest.approx(0.05)


def test_disabled_writes_empty_complete_datasets(tmp_path):
    cfg = RewriteConfig(
        output=str(tmp_path / "r"), quarantine=str(tmp_path / "q"), metrics=str(tmp_path / "m.json")
    )
    metrics = run(cfg, LocalExecutor(), progress=False)
    assert metrics["enabled"] is False and metrics["rows_in"] == 0 and metrics["requests_sent"] == 0
    assert open_dataset(tmp_path / "r", S.CANDIDATES).num_rows == 0
    assert open_dataset(tmp_path / "q", S.QUARANTINE).num_rows == 0


def test_bad_key_setup_fails_in_one_line_without_echoing(tmp_path, monkeypatch):
    write_sentences(tmp_path / "sentences", make_sentences(3, seed=15), rows_per_shard=3)
    with FaultyChatServer() as server:
        base = settings(tmp_path, server)
        with pytest.raises(ConfigError, match="NAME of an environment variable") as exc:
            run(
                RewriteConfig.model_validate({**base, "api_key_env": KEY}),
                LocalExecutor(),
                progress=False,
            )
        assert KEY not in str(exc.value)
        monkeypatch.delenv("PAIRFORGE_TEST_KEY", raising=False)
        with pytest.raises(ConfigError, match="PAIRFORGE_TEST_KEY .* is not set"):
            run(RewriteConfig.model_validate(base), LocalExecutor(), progress=False)


def test_authentication_failure_stops_with_a_clear_error(monkeypatch):
    monkeypatch.setenv("PAIRFORGE_TEST_KEY", KEY)
    with FaultyChatServer() as server:
        server.httpd.RequestHandlerClass.do_POST = lambda self: server._send(
            self, 401, {"error": {"message": f"bad key {KEY}"}}
        )
        client = ChatClient(
            ChatSettings(
                server.base_url,
                "m",
                "PAIRFORGE_TEST_KEY",
                "{text}",
                None,
                1.0,
                16,
                1.0,
                3,
                0.01,
                0.05,
                1,
                0,
            )
        )
        with pytest.raises(PairforgeError, match="answered 401") as exc:
            client.complete([{"role": "user", "content": "hi"}])
        assert KEY not in str(exc.value) and server.requests == 0  # handler replaced: no counting
        assert server.in_flight == 0


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ("  ", "empty"),
        ('"The sea is calm today, they said."', None),
        ("Option 1: The sea is calm.\nOption 2: Calm sea.", "multiline"),
        ("I'm sorry, but I cannot do that.", "refusal"),
        ("As an AI language model, here it is: calm sea", "refusal"),
        ("the sea is calm today", "identical"),
        ("Le mer est calme aujourd'hui, vraiment très calme", "wrong_language"),
        ("海は今日穏やかです。", "wrong_language"),
        ("Calm.", "bad_length"),
    ],
)
def test_validation_reasons(answer, reason):
    cleaned, found = validate_rewrite("The sea is calm today.", answer, Validation())
    assert found == reason
    if reason is None:
        assert cleaned == "The sea is calm today, they said."


def test_the_key_never_reaches_a_file_or_log(tmp_path, monkeypatch):
    """The CLI in a subprocess, key in the environment: no file it writes, and neither its stdout
    nor its stderr, contains the key."""
    project = tmp_path / "project"
    project.mkdir()
    write_sentences(project / "sentences", make_sentences(25, seed=16), rows_per_shard=10)
    with FaultyChatServer(transient_rate=0.3, content_rate=0.3, seed=2, slow_seconds=0.8) as server:
        params = settings(project, server)
        params = {
            k: (
                os.path.relpath(v, project)
                if isinstance(v, str) and v.startswith(str(project))
                else v
            )
            for k, v in params.items()
        }
        write_params(project / "params.yaml", {"rewrite": params})
        monkeypatch.setenv("PAIRFORGE_TEST_KEY", KEY)
        result = run_cli(["rewrite"], cwd=project)
        assert result.returncode == 0, result.stderr
        assert server.auth_headers == {f"Bearer {KEY}"}
    assert "rewrite:" in result.stderr and KEY not in result.stdout + result.stderr
    written = [p for p in project.rglob("*") if p.is_file()]
    assert len(written) > 5
    for path in written:
        assert KEY.encode() not in path.read_bytes(), path
    metrics = json.loads((project / "metrics/rewrite.json").read_text())
    assert metrics["rows_in"] == 25 == metrics["rewritten"] + metrics["rejected_total"]


def test_rewrite_reads_and_writes_its_datasets_in_a_bucket(tmp_path, monkeypatch, bucket):
    """The sentences, the rewrites and the quarantine at s3:// URLs (a local S3 server,
    tests/s3.py): every row ends rewritten or quarantined there, as on disk."""
    monkeypatch.setenv("PAIRFORGE_TEST_KEY", KEY)
    texts = make_sentences(30, seed=5)
    write_sentences(f"{bucket}/sentences", texts, rows_per_shard=10)
    with FaultyChatServer(content_rate=0.2, seed=2) as server:
        values = settings(tmp_path, server)
        values.update(input=f"{bucket}/sentences", output=f"{bucket}/rewrites",
                      quarantine=f"{bucket}/quarantine/rewrite")  # fmt: skip
        metrics = run(RewriteConfig.model_validate(values), LocalExecutor(), progress=False)
    good = open_dataset(f"{bucket}/rewrites", S.CANDIDATES).read_table()
    bad = open_dataset(f"{bucket}/quarantine/rewrite", S.QUARANTINE).read_table()
    assert good.num_rows + bad.num_rows == len(texts) == metrics["rows_in"]
    assert good.num_rows > 0 and bad.num_rows > 0
    assert set(good[S.TEXT].to_pylist()) == {
        good_rewrite(t) for t in texts if content_fault(t, 0.2) is None
    }
