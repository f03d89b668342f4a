"""The runner maps a per-shard function over shard files and skips finished shards."""

from __future__ import annotations

import functools

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.runner import (
    DaskExecutor,
    LocalExecutor,
    ShardResult,
    map_shards,
    map_tables,
)
from pairforge.pipeline.plumbing.shards import Dataset, DatasetWriter, open_dataset


def upper(table: pa.Table, calls: list[int] | None = None) -> ShardResult:
    if calls is not None:
        calls.append(table.num_rows)
    out = table.set_column(1, S.TEXT, pc.utf8_upper(table[S.TEXT]))
    return ShardResult({"out": out}, {"rows": table.num_rows})


def make_input(tmp_path, shards: int = 3) -> DatasetWriter:
    writer = DatasetWriter(tmp_path / "in", S.SENTENCES, stage="t", params={}, fingerprint="f")
    for i in range(shards):
        writer.write(
            i,
            pa.table(
                {
                    S.ID: [f"{i}a", f"{i}b"],
                    S.TEXT: ["x y", "z w"],
                    S.SOURCE: ["s", "s"],
                    S.LINE: [1, 2],
                }
            ),
        )
    writer.finalize(shards)
    return writer


def test_map_shards_writes_every_shard_and_resumes(tmp_path):
    make_input(tmp_path)
    inputs = open_dataset(tmp_path / "in", S.SENTENCES)
    out = DatasetWriter(tmp_path / "out", S.SENTENCES, stage="t", params={}, fingerprint="g")
    calls: list[int] = []
    infos = map_shards(
        functools.partial(upper, calls=calls),
        Dataset(
            inputs.path, {**inputs.manifest, "shards": inputs.manifest["shards"][:2]}, inputs.spec
        ),
        {"out": out},
        LocalExecutor(),
        "t",
        progress=False,
    )
    assert [i.rows for i in infos["out"]] == [2, 2] and calls == [2, 2]
    # A new run over all three inputs recomputes only the missing shard.
    out = DatasetWriter(tmp_path / "out", S.SENTENCES, stage="t", params={}, fingerprint="g")
    calls.clear()
    infos = map_shards(
        functools.partial(upper, calls=calls),
        inputs,
        {"out": out},
        LocalExecutor(),
        "t",
        progress=False,
    )
    assert calls == [2] and [i.counts for i in infos["out"]] == [{"rows": 2}] * 3
    out.finalize(3)
    assert (
        open_dataset(tmp_path / "out", S.SENTENCES).read_table()[S.TEXT].to_pylist()
        == ["X Y", "Z W"] * 3
    )


def test_map_tables_and_output_mismatch(tmp_path):
    make_input(tmp_path, shards=1)
    table = open_dataset(tmp_path / "in", S.SENTENCES).read_shard(0)
    out = DatasetWriter(tmp_path / "out", S.SENTENCES, stage="t", params={}, fingerprint="g")
    map_tables(
        upper, iter([(0, table), (1, table)]), {"out": out}, LocalExecutor(), "t", progress=False
    )
    assert out.is_done(0) and out.is_done(1)
    other = DatasetWriter(tmp_path / "other", S.SENTENCES, stage="t", params={}, fingerprint="g")
    with pytest.raises(ValueError, match=r"returned outputs \['out'\], expected \['wrong'\]"):
        map_tables(
            upper, iter([(0, table)]), {"wrong": other}, LocalExecutor(), "t", progress=False
        )


def test_threaded_local_executor_gives_the_sequential_output(tmp_path):
    source = make_input(tmp_path, shards=7)
    outputs = {}
    for threads in (1, 3):
        out = DatasetWriter(
            tmp_path / f"out{threads}", S.SENTENCES, stage="t", params={}, fingerprint="f"
        )
        executor = LocalExecutor(threads=threads)
        map_shards(upper, open_dataset(source.path, S.SENTENCES), {"out": out}, executor, "t")
        executor.close()
        out.finalize(7)
        outputs[threads] = open_dataset(out.path, S.SENTENCES).read_table()
    assert outputs[3].equals(outputs[1])
    assert outputs[3][S.TEXT].to_pylist()[:2] == ["X Y", "Z W"]


def test_threaded_local_executor_bounds_in_flight_work_and_raises():
    executor = LocalExecutor(threads=2)
    pulled: list[int] = []

    def items():
        for i in range(20):
            pulled.append(i)
            yield i

    results = executor.map_unordered(lambda x: x * x, items())
    first = next(results)
    assert first in {0, 1, 4, 9}
    assert len(pulled) <= 5  # 2 * threads in flight, plus the one that found the window full
    assert sorted([first, *results]) == [i * i for i in range(20)]

    def boom(x: int) -> int:
        if x == 3:
            raise ValueError("bad shard 3")
        return x

    with pytest.raises(ValueError, match="bad shard 3"):
        list(executor.map_unordered(boom, range(6)))
    executor.close()


def tagged(table: pa.Table, index: int) -> ShardResult:
    """Writes its shard index into the text; reports a fact that must stay out of the shard."""
    out = table.set_column(1, S.TEXT, pa.array([f"{index}:{t}" for t in table[S.TEXT].to_pylist()]))
    return ShardResult({"out": out}, {"rows": table.num_rows}, {"index": index, "seconds": 0.5})


@pytest.mark.parametrize("threads", [1, 2])
def test_with_index_and_facts(tmp_path, threads):
    make_input(tmp_path)
    inputs = open_dataset(tmp_path / "in", S.SENTENCES)
    out = DatasetWriter(tmp_path / "out", S.SENTENCES, stage="t", params={}, fingerprint="g")
    facts: list[dict] = []
    ex = LocalExecutor(threads)
    try:
        map_shards(tagged, inputs, {"out": out}, ex, "t", False, with_index=True, facts=facts)
    finally:
        ex.close()
    assert sorted(f["index"] for f in facts) == [0, 1, 2]
    out.finalize(3)
    result = open_dataset(tmp_path / "out", S.SENTENCES)
    assert result.read_table([S.TEXT])[S.TEXT].to_pylist() == [
        f"{i}:{t}" for i in range(3) for t in ("x y", "z w")
    ]
    # Counts go into the manifest; facts never do.
    assert [s["counts"] for s in result.manifest["shards"]] == [{"rows": 2}] * 3
    assert "seconds" not in (tmp_path / "out" / "_manifest.json").read_text()
    # map_tables passes the index and collects facts the same way.
    out2 = DatasetWriter(tmp_path / "out2", S.SENTENCES, stage="t", params={}, fingerprint="h")
    facts.clear()
    tables = ((i, inputs.read_shard(i)) for i in range(3))
    map_tables(tagged, tables, {"out": out2}, LocalExecutor(), "t", False, True, facts)
    assert sorted(f["index"] for f in facts) == [0, 1, 2]


def test_pending_is_what_some_output_has_not_finished(tmp_path):
    """A shard is skipped only when every output has it; one output missing it reruns it."""
    from pairforge.pipeline.plumbing.runner import finished, pending

    make_input(tmp_path, shards=3)
    inputs = open_dataset(tmp_path / "in", S.SENTENCES)
    a = DatasetWriter(tmp_path / "a", S.SENTENCES, stage="t", params={}, fingerprint="g")
    b = DatasetWriter(tmp_path / "b", S.SENTENCES, stage="t", params={}, fingerprint="g")
    assert pending({"a": a, "b": b}, 3) == [0, 1, 2]
    table = inputs.read_shard(0)
    a.write(0, table)
    a.write(2, table)
    b.write(2, table)
    assert pending([a, b], 3) == [0, 1] and pending([a], 3) == [1]
    assert finished([a, b], 2) and not finished({"a": a, "b": b}, 0)
    calls: list[int] = []
    map_shards(
        functools.partial(upper2, calls=calls),
        inputs,
        {"a": a, "b": b},
        LocalExecutor(),
        "t",
        False,
    )
    assert calls == [2, 2] and pending([a, b], 3) == []


def upper2(table: pa.Table, calls: list[int]) -> ShardResult:
    out = upper(table, calls).tables["out"]
    return ShardResult({"a": out, "b": out}, {"rows": table.num_rows})


def _worker_env() -> dict[str, str | None]:
    import os

    return {k: os.environ.get(k) for k in ("MALLOC_TRIM_THRESHOLD_", "OMP_NUM_THREADS", "PIN")}


@pytest.mark.slow
def test_dask_workers_keep_glibc_s_adaptive_malloc():
    """Dask sets MALLOC_TRIM_THRESHOLD_=65536 in the workers it spawns, which turns off glibc's
    adaptive mmap threshold and slows torch's forward passes (18% measured); the executor's
    workers do without it, and keep Dask's other variables (one OpenMP thread a worker)."""
    import dask
    import distributed  # noqa: F401  (loads its config into dask's)

    assert dask.config.get("distributed.nanny.pre-spawn-environ")["MALLOC_TRIM_THRESHOLD_"]
    ex = DaskExecutor(workers=2)
    try:
        found = ex.client.run(_worker_env)
    finally:
        ex.close()
    assert len(found) == 2
    for env in found.values():
        assert env["MALLOC_TRIM_THRESHOLD_"] is None and env["OMP_NUM_THREADS"] == "1"
    # One environment per worker (the GPU set-up): the same, with each worker's own variables.
    ex = DaskExecutor(worker_env=[{"PIN": "a"}, {"PIN": "b"}])
    try:
        found = ex.client.run(_worker_env)
        assert sorted(e["PIN"] for e in found.values()) == ["a", "b"]
        assert all(e["MALLOC_TRIM_THRESHOLD_"] is None for e in found.values())
    finally:
        ex.close()
    # The setting is restored once the workers are built.
    assert dask.config.get("distributed.nanny.pre-spawn-environ")["MALLOC_TRIM_THRESHOLD_"]
