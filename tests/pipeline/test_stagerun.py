"""A stage's run owns its datasets' life: the writer locks from its start, verified inputs,
writers fingerprinted by the params and inputs, the shard mapping that skips finished shards,
the totals, a dataset left unfinished refused, and the metrics with their headline."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from pairforge.pipeline.plumbing import locks
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.config import StageConfig
from pairforge.pipeline.plumbing.errors import DataIntegrityError, DatasetLockedError
from pairforge.pipeline.plumbing.runner import ShardResult
from pairforge.pipeline.plumbing.shards import DatasetWriter, open_dataset
from pairforge.pipeline.plumbing.stagedefs import StageDef
from pairforge.pipeline.plumbing.stagerun import StageRun


class Upper(StageConfig):
    input: str = "in"
    output: str = "out"
    model_dir: str = "model"
    metrics: str = "metrics/upper.json"
    shout: bool = True
    threads: int = 1


UPPER = StageDef(
    name="upper",
    # Its code (what the fingerprint hashes): a project module, as a stage's must be.
    module="pairforge.pipeline.plumbing.stagerun",
    config=Upper,
    inputs=("${upper.input}",),
    outputs=("output", "model_dir", "metrics"),
    free=("threads",),
    datasets=("output",),
    models=("model_dir",),
    headlines={"rows_out": "rows"},
)

CALLS: list[int] = []


def _upper(table: pa.Table, index: int) -> ShardResult:
    CALLS.append(index)
    text = pa.array([t.upper() for t in table[S.TEXT].to_pylist()], pa.string())
    out = table.set_column(table.schema.get_field_index(S.TEXT), S.TEXT, text)
    return ShardResult({"out": out}, {"rows": out.num_rows, "shouted": out.num_rows})


def _sentences(folder: Path, texts: list[list[str]]) -> None:
    writer = DatasetWriter(folder, S.SENTENCES, stage="t", params={}, fingerprint=repr(texts))
    for i, shard in enumerate(texts):
        rows = [f"{i}-{j}" for j in range(len(shard))]
        table = pa.table(
            {S.ID: rows, S.TEXT: shard, S.SOURCE: ["t"] * len(shard), S.LINE: range(len(shard))},
            schema=S.SENTENCES.schema,
        )
        writer.write(i, table)
    writer.finalize(len(texts))


def _held_here(folder: Path) -> list[str]:
    """The lock files this process holds under ``folder`` (other tests' may be held too)."""
    return [path for path in locks.held() if path.startswith(str(folder.resolve()))]


def _run(cfg: Upper) -> dict:
    with StageRun(UPPER, cfg, progress=False) as run:
        source = run.input("input", S.SENTENCES)
        writer = run.output("output", S.SENTENCES)
        if not writer.complete:
            run.map(_upper, source, {"out": writer}, with_index=True)
            writer.finalize(len(source), extra={"counts": run.totals(writer)})
        return run.finish({"rows": open_dataset(cfg.output, S.SENTENCES).num_rows}, timed=True)


def test_a_run_writes_resumes_and_reruns_on_new_inputs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _sentences(Path("in"), [["a b", "c"], ["d"]])
    CALLS.clear()
    metrics = _run(Upper())
    assert sorted(CALLS) == [0, 1]
    assert open_dataset("out", S.SENTENCES).read_table([S.TEXT])[S.TEXT].to_pylist() == [
        "A B",
        "C",
        "D",
    ]
    manifest = json.loads(Path("out/_manifest.json").read_text())
    assert manifest["counts"] == {"rows": 3, "shouted": 3}
    assert manifest["params"]["shout"] is True
    saved = json.loads(Path("metrics/upper.json").read_text())
    assert saved["rows"] == 3 and saved == metrics and list(saved)[-1] == "seconds"
    assert json.loads(Path("metrics/headline/upper.json").read_text())["rows_out"] == 3

    first = manifest["fingerprint"]
    CALLS.clear()
    _run(Upper(threads=4))  # a free key: the same fingerprint, nothing computed again
    assert CALLS == []
    assert json.loads(Path("out/_manifest.json").read_text())["fingerprint"] == first

    _run(Upper(shout=False))  # an exact param: a new fingerprint, every shard again
    assert sorted(CALLS) == [0, 1]
    second = json.loads(Path("out/_manifest.json").read_text())["fingerprint"]
    assert second != first

    CALLS.clear()
    _sentences(Path("in"), [["a b", "c"], ["e"]])  # another input: computed again
    _run(Upper(shout=False))
    assert sorted(CALLS) == [0, 1]
    assert json.loads(Path("out/_manifest.json").read_text())["fingerprint"] != second


def test_a_killed_run_resumes_only_its_unfinished_shards(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _sentences(Path("in"), [["a"], ["b"], ["c"]])

    def dies_on_2(table: pa.Table, index: int) -> ShardResult:
        if index == 2:
            raise RuntimeError("killed")
        return _upper(table, index)

    CALLS.clear()
    # The error itself comes out, not an unfinished-dataset one.
    with (
        pytest.raises(RuntimeError, match="killed"),
        StageRun(UPPER, Upper(), progress=False) as run,
    ):
        source = run.input("input", S.SENTENCES)
        writer = run.output("output", S.SENTENCES)
        run.map(dies_on_2, source, {"out": writer}, with_index=True)
    assert sorted(CALLS) == [0, 1] and _held_here(tmp_path) == []
    CALLS.clear()
    _run(Upper())
    assert CALLS == [2]
    assert json.loads(Path("out/_manifest.json").read_text())["counts"]["rows"] == 3


def test_the_run_holds_its_folders_locked_from_its_start_to_its_end(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with StageRun(UPPER, Upper(), progress=False) as run:
        held = _held_here(tmp_path)
        assert held == sorted(str(locks.lock_path(p).resolve()) for p in ("out", "model")), (
            "locked before any input is read"
        )
        assert run.folders == {"out": "dataset", "model": "upper output"}
    assert _held_here(tmp_path) == []

    # Another process's lock is refused with the folder's label.
    import subprocess
    import sys

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; from pairforge.pipeline.plumbing.locks import acquire; "
            "acquire('model'); print('held', flush=True); time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        refused = pytest.raises(DatasetLockedError, match=r"^upper output 'model': another writer")
        with refused, StageRun(UPPER, Upper(), progress=False):
            pass
        assert _held_here(tmp_path) == []  # the lock taken before the refusal is released
    finally:
        holder.kill()
        holder.wait()


def test_a_run_that_ends_with_a_dataset_unfinished_is_an_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _sentences(Path("in"), [["a"]])
    unfinished = pytest.raises(
        DataIntegrityError, match=r"upper: dataset 'out' was left unfinished"
    )
    with unfinished, StageRun(UPPER, Upper(), progress=False) as run:
        source = run.input("input", S.SENTENCES)
        writer = run.output("output", S.SENTENCES)
        run.map(_upper, source, {"out": writer}, with_index=True)  # no finalize
    # A scratch dataset is the stage's own work: it may stay unfinished.
    with StageRun(UPPER, Upper(), progress=False) as run:
        run.output("work", S.SENTENCES, path="out/_work/w", scratch=True)


def test_totals_sum_the_finished_shards_or_the_ones_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _sentences(Path("in"), [["a", "b"], ["c"], ["d", "e", "f"]])
    with StageRun(UPPER, Upper(), progress=False) as run:
        source = run.input("input", S.SENTENCES)
        writer = run.output("output", S.SENTENCES)
        run.map(_upper, source, {"out": writer}, with_index=True)
        assert run.totals(writer) == {"rows": 6, "shouted": 6}
        assert run.totals(writer, [0, 2]) == {"rows": 5, "shouted": 5}
        writer.finalize(len(source))
