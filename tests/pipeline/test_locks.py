"""One writer per dataset: a second writer (another process) is refused with one line naming the
holder; a lock left by a dead process is taken over with a warning; the first writer finishes
clean. Two runs of a stage on the same input give byte-identical dataset folders."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from pairforge.pipeline.plumbing import locks
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.errors import DatasetLockedError
from pairforge.pipeline.plumbing.shards import DatasetWriter, open_dataset, run_info_path
from pairforge.stages.verify import verify_dataset

from tests.conftest import ROOT, run_cli
from tests.stages.ingest.test_resume import make_project


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path, caplog):
    folder = tmp_path / "ds"
    lock = locks.lock_path(folder)
    assert lock == tmp_path / ".ds.lock"
    dead = _dead_pid()
    stale = {"pid": dead, "host": socket.gethostname(), "since": "2026-01-01T00:00:00Z"}
    lock.write_text(json.dumps({**stale, "command": "pairforge ingest"}))
    with caplog.at_level(logging.WARNING, logger="pairforge"):
        writer = DatasetWriter(folder, S.SENTENCES, stage="t", params={}, fingerprint="f")
    assert f"taking over a stale lock (pid {dead} on {socket.gethostname()}" in caplog.text
    assert "that process is gone" in caplog.text
    assert json.loads(lock.read_text())["pid"] == os.getpid()
    writer.finalize(0)
    assert not lock.exists() and locks.held() == []


def test_writer_lock_is_reentrant_in_a_process_and_released(tmp_path):
    folder = tmp_path / "model"
    with locks.writer_lock(folder) as path:
        with locks.writer_lock(folder):
            assert path.exists()
        assert path.exists()  # still held by the outer block
    assert not path.exists()


def _hold_lock_in_child(folder) -> subprocess.Popen:
    code = (
        "import sys, time; from pairforge.pipeline.plumbing import locks; "
        f"locks.acquire({str(folder)!r}); print('locked', flush=True); time.sleep(600)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_live_holder_refuses_this_process_and_a_killed_one_does_not(tmp_path, caplog):
    folder = tmp_path / "ds"
    proc = _hold_lock_in_child(folder)
    try:
        with pytest.raises(DatasetLockedError) as exc:
            DatasetWriter(folder, S.SENTENCES, stage="t", params={}, fingerprint="f")
        message = str(exc.value)
        assert "\n" not in message
        assert f"another writer holds it (pid {proc.pid} on {socket.gethostname()}, since " in (
            message
        )
        assert f"lock file {locks.lock_path(folder)}" in message
        assert not folder.exists()  # refused before touching anything
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # The kernel dropped the killed holder's flock; its file stays, stale.
    with caplog.at_level(logging.WARNING, logger="pairforge"):
        writer = DatasetWriter(folder, S.SENTENCES, stage="t", params={}, fingerprint="f")
    assert f"stale lock (pid {proc.pid}" in caplog.text
    writer.close()
    assert not locks.lock_path(folder).exists()


def _stopped_when_locked(proc: subprocess.Popen, lock, timeout: float = 240) -> bool:
    """SIGSTOP ``proc`` as soon as it holds ``lock``; False if it ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if lock.exists() and lock.stat().st_size:
            try:
                holder = json.loads(lock.read_text())
            except json.JSONDecodeError:
                holder = {}
            if holder.get("pid") == proc.pid:
                proc.send_signal(signal.SIGSTOP)
                return True
        time.sleep(0.002)
    return False


def test_two_concurrent_ingest_runs(tmp_path):
    """The second `pairforge ingest` on the same outputs exits 2 with one line naming the first;
    the first then finishes clean: complete datasets, no `_progress/`, no lock left."""
    make_project(tmp_path)
    first = subprocess.Popen(
        [sys.executable, "-m", "pairforge.stages.cli", "ingest", "--no-progress"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "DVC_NO_ANALYTICS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lock = tmp_path / "data" / ".sentences.lock"
    try:
        assert _stopped_when_locked(first, lock), "the first run ended before it was caught"
        second = run_cli(["ingest", "--no-progress"], cwd=tmp_path)
    finally:
        first.send_signal(signal.SIGCONT)
    assert second.returncode == 2, second.stderr
    errors = [line for line in second.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in second.stderr
    assert errors[0].startswith("error: dataset 'data/sentences': another writer holds it (pid ")
    assert f"(pid {first.pid} on {socket.gethostname()}, since " in errors[0]
    assert "`pairforge ingest --no-progress`" in errors[0]
    _, stderr = first.communicate(timeout=600)
    assert first.returncode == 0, stderr
    for name in ("data/sentences", "data/quarantine/ingest"):
        assert not (tmp_path / name / "_progress").exists()
        assert verify_dataset(tmp_path / name).ok
    assert not list(tmp_path.rglob(".*.lock"))
    assert open_dataset(tmp_path / "data/sentences", S.SENTENCES).num_rows > 50_000


@pytest.mark.slow
def test_two_runs_give_byte_identical_folders(tmp_path):
    """Nothing run-specific in a dataset folder: a second run from scratch (another process,
    later clock) writes the same bytes; the run facts differ only in the sidecar."""

    def snapshot(root):
        out = {}
        for name in ("data/sentences", "data/quarantine/ingest"):
            folder = root / name
            out[name] = {
                str(p.relative_to(folder)): p.read_bytes()
                for p in sorted(folder.rglob("*"))
                if p.is_file()
            }
        return out

    make_project(tmp_path)
    assert run_cli(["ingest", "--no-progress"], cwd=tmp_path).returncode == 0
    first = snapshot(tmp_path)
    run1 = json.loads(run_info_path(tmp_path / "data/sentences").read_text())
    for name in ("data/sentences", "data/quarantine/ingest"):
        (tmp_path / name / "_manifest.json").unlink()  # force a full rewrite
    time.sleep(1.1)
    assert run_cli(["ingest", "--no-progress"], cwd=tmp_path).returncode == 0
    assert snapshot(tmp_path) == first
    assert set(first["data/sentences"]) >= {"_manifest.json", "data/part-00000.parquet"}
    run2 = json.loads(run_info_path(tmp_path / "data/sentences").read_text())
    assert run2["created_at"] != run1["created_at"] and run2["pid"] != run1["pid"]


@pytest.mark.parametrize(
    ("stage", "key"),
    [
        ("standin", "output"),
        ("pretrain", "output"),
        ("train", "output"),
        ("rewrite", "quarantine"),
        ("embed", "candidates_output"),
        ("mine", "output"),
    ],
)
def test_every_output_has_one_writer_from_the_start(tmp_path, stage, key):
    """Stages take the locks of all their outputs (datasets or model folders) before any work
    (after their config checks): a run holding the second output of a stage refuses a second
    run at once. (backtranslate checks its model folders first; ingest is tested above.)"""
    import yaml

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    section = params[stage]
    output = tmp_path / section[key]
    if stage == "train":
        output = output / section["objective"]
    holder = _hold_lock_in_child(output)
    try:
        result = run_cli([stage], cwd=tmp_path)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"another writer holds it (pid {holder.pid} " in errors[0]
    assert not output.exists()


def test_export_output_has_one_writer(tmp_path):
    from tests.pipeline.test_integrity import write

    write(tmp_path / "pairs", S.PAIRS)
    output = tmp_path / "export"
    holder = _hold_lock_in_child(output)
    try:
        result = run_cli(["export", "--input", "pairs", "--output", "export"], cwd=tmp_path)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert result.returncode == 2, result.stderr
    assert f"error: export output 'export': another writer holds it (pid {holder.pid} " in (
        result.stderr
    )
    assert not output.exists()
    result = run_cli(["export", "--input", "pairs", "--output", "export"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (output / "README.md").exists() and not locks.lock_path(output).exists()
