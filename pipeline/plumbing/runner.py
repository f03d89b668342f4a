"""Map a per-shard stage function over the shards of a dataset, in-process or on Dask.

A shard function takes one Arrow table and returns a ``ShardResult``: one table per named
output plus per-shard counts. ``map_shards`` writes each output table as shard ``i`` of its
dataset (atomically, with a finished-marker) and skips the shards a killed run already
finished. The function must be picklable (a module-level function or a ``functools.partial``
of one) so that Dask workers can run it; the output folders must be visible to the workers
(always true for a LocalCluster; a shared filesystem for a remote cluster).

Every per-shard stage (ingest's read+clean, backtranslate, rewrite, embed, mine's queries,
sample) runs through ``map_shards`` or ``map_tables`` (called by its ``StageRun``,
``pipeline/plumbing/stagerun.py``) with this one contract: Arrow in, a ``ShardResult`` (tables
and counts) out, resume by ``pending``. Ingest's dedup step is the one
shard loop of its own: it regroups every chunk's kept rows into shards of ``rows_per_shard``
after a global pass, so an output shard is not a function of one input shard.

Executors are chosen at the edge (``make_executor``); no stage imports Dask.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa
from pairforge.pipeline.plumbing.errors import ConfigError
from pairforge.pipeline.plumbing.progress import Progress
from pairforge.pipeline.plumbing.schemas import SchemaSpec
from pairforge.pipeline.plumbing.shards import (
    Dataset,
    DatasetWriter,
    ShardInfo,
    ShardSource,
    write_shard,
)
from pairforge.pipeline.plumbing.storage import dataset_path

log = logging.getLogger("pairforge")


@dataclass
class ShardResult:
    """What a shard function returns: output tables by name, counts to aggregate (written into
    the shard's manifest entry), and ``facts`` about this computation (timings, which backend
    ran) that go back to the driver only: never into the shards, so they may differ by run."""

    tables: dict[str, pa.Table]
    counts: dict[str, int] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)


ShardFn = Callable[..., ShardResult]  # (table) or, with ``with_index``, (table, shard index)


class Executor(Protocol):
    name: str

    def map_unordered(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Any]:
        """Results of ``fn`` over ``items`` as they complete. ``items`` may be a lazy iterator;
        it is consumed only as fast as the executor has room, so memory stays bounded."""
        ...

    def close(self) -> None: ...


class LocalExecutor:
    """Runs tasks in this process: one after another, or on ``threads`` threads.

    Threads pay off for shard functions that spend their time in Arrow, Parquet and numpy
    kernels (which release the GIL): compression, hashing and string kernels of one shard run
    while the next shard is read. At most ``2 * threads`` tasks are in flight, so memory stays
    bounded; results come in completion order, as from Dask.
    """

    def __init__(self, threads: int = 1) -> None:
        self.threads = max(1, threads)
        self.name = "in-process" + (f" ({self.threads} threads)" if self.threads > 1 else "")
        self._pool = None

    def map_unordered(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Any]:
        if self.threads == 1:
            for item in items:
                yield fn(item)
            return
        from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="pairforge")
        pending: set = set()
        items = iter(items)
        exhausted = False
        while True:
            while not exhausted and len(pending) < 2 * self.threads:
                item = next(items, _END)
                if item is _END:
                    exhausted = True
                else:
                    pending.add(self._pool.submit(fn, item))
            if not pending:
                return
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                yield future.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _no_trim():
    """Dask's config while this executor builds its workers' nannies (each reads it as it is
    built): ``MALLOC_TRIM_THRESHOLD_`` dropped from the variables set before a worker spawns."""
    import dask

    return dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None})


class DaskExecutor:
    """Runs tasks on a Dask cluster: a new LocalCluster of ``workers`` processes on loopback,
    or an existing scheduler at ``scheduler`` (for example ``tcp://10.0.0.5:8786``).

    ``worker_env``: one environment per worker (``workers`` of them), for example
    ``CUDA_VISIBLE_DEVICES`` so that each worker process sees its own GPU.

    The workers this executor starts do not get Dask's ``MALLOC_TRIM_THRESHOLD_=65536``
    (``distributed.nanny.pre-spawn-environ``): it turns off glibc's adaptive mmap threshold, so
    every large temporary of a torch forward pass is mapped and unmapped again, which slows
    encoding. A threshold set in this process's environment still reaches them; workers of an
    existing ``scheduler`` keep the environment they were started with."""

    def __init__(
        self,
        workers: int = 0,
        scheduler: str | None = None,
        worker_env: list[dict[str, str]] | None = None,
    ) -> None:
        from dask.distributed import Client, LocalCluster

        self.cluster = None
        if scheduler:
            self.client = Client(scheduler)
            self.name = f"dask scheduler {scheduler}"
        elif worker_env:
            from dask.distributed import Nanny, Scheduler, SpecCluster

            # LocalCluster gives every worker the same environment: one spec per worker here.
            options = {"nthreads": 1, "host": "127.0.0.1", "silence_logs": logging.WARNING}
            with _no_trim():
                self.cluster = SpecCluster(
                    scheduler={
                        "cls": Scheduler,
                        "options": {"host": "127.0.0.1", "dashboard_address": None},
                    },
                    workers={
                        i: {"cls": Nanny, "options": {**options, "env": dict(env)}}
                        for i, env in enumerate(worker_env)
                    },
                    silence_logs=logging.WARNING,
                )
            self.client = Client(self.cluster)
            self.name = f"dask cluster ({len(worker_env)} workers, one environment each)"
        else:
            with _no_trim():
                self.cluster = LocalCluster(
                    n_workers=workers,
                    threads_per_worker=1,
                    processes=True,
                    host="127.0.0.1",
                    dashboard_address=None,
                    silence_logs=logging.WARNING,
                )
            self.client = Client(self.cluster)
            self.name = f"dask LocalCluster ({workers} workers)"

    def map_unordered(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Any]:
        from dask.distributed import as_completed

        window = 2 * max(len(self.client.scheduler_info().get("workers", {})), 1) + 1
        items = iter(items)
        pending = as_completed()
        for item in items:
            pending.add(self.client.submit(fn, item, pure=False))
            if pending.count() >= window:
                break
        for future in pending:
            result = future.result()
            future.release()
            nxt = next(items, _END)
            if nxt is not _END:
                pending.add(self.client.submit(fn, nxt, pure=False))
            yield result

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()


def make_executor(workers: int = 0, scheduler: str | None = None, threads: int = 1) -> Executor:
    """``workers=0`` and no scheduler runs in-process (on ``threads`` threads); otherwise Dask."""
    if workers < 0:
        raise ConfigError(f"--workers must be >= 0, got {workers}")
    if scheduler or workers > 0:
        return DaskExecutor(workers=workers, scheduler=scheduler)
    return LocalExecutor(threads)


_END = object()


def finished(outputs: Mapping[str, DatasetWriter] | Iterable[DatasetWriter], index: int) -> bool:
    """Whether every output has finished shard ``index`` (a run never computes it again)."""
    writers = outputs.values() if isinstance(outputs, Mapping) else outputs
    return all(w.is_done(index) for w in writers)


def pending(outputs: Mapping[str, DatasetWriter] | Iterable[DatasetWriter], n: int) -> list[int]:
    """The indexes in ``range(n)`` that some output has not finished: what a run (or a resumed
    one) still computes, in order."""
    writers = list(outputs.values() if isinstance(outputs, Mapping) else outputs)
    return [i for i in range(n) if not finished(writers, i)]


@dataclass(frozen=True)
class _Job:
    index: int
    input: ShardSource | pa.Table  # a shard of a dataset (verified when read), or a table
    outputs: dict[str, tuple[str, SchemaSpec, str, dict]]  # name -> (folder, spec, label, options)
    with_index: bool = False  # the shard function takes the shard index (to seed by shard)


def _run_job(fn: ShardFn, job: _Job) -> tuple[int, int, dict[str, ShardInfo], dict[str, Any]]:
    table = job.input if isinstance(job.input, pa.Table) else job.input.read()
    result = fn(table, job.index) if job.with_index else fn(table)
    if set(result.tables) != set(job.outputs):
        raise ValueError(
            f"shard function returned outputs {sorted(result.tables)}, "
            f"expected {sorted(job.outputs)}"
        )
    infos = {}
    for name, (folder, spec, label, options) in job.outputs.items():
        infos[name] = write_shard(
            dataset_path(folder),
            job.index,
            result.tables[name],
            spec,
            label,
            result.counts,
            **options,
        )
    return job.index, table.num_rows, infos, result.facts


def map_shards(
    fn: ShardFn,
    inputs: Dataset,
    outputs: dict[str, DatasetWriter],
    executor: Executor,
    label: str,
    progress: bool = True,
    with_index: bool = False,
    facts: list[dict[str, Any]] | None = None,
) -> dict[str, list[ShardInfo]]:
    """Run ``fn`` over every shard of ``inputs`` not yet finished (each shard is verified
    against the input's manifest when read); return the shard infos per output, in input order
    (finished shards from an earlier run included).

    ``with_index``: ``fn(table, index)`` gets the shard's index too (for per-shard seeds).
    ``facts``: a list that receives each shard computed now's ``ShardResult.facts`` (in
    completion order)."""
    inputs = inputs.sources()
    specs = {name: (str(w.path), w.spec, w.name, w.write_options) for name, w in outputs.items()}
    todo = [_Job(i, inputs[i], specs, with_index) for i in pending(outputs, len(inputs))]
    bar = Progress(label, total=len(inputs), skipped=len(inputs) - len(todo), enabled=progress)
    if todo:
        log.info(
            "%s: %d of %d shards to compute on %s", label, len(todo), len(inputs), executor.name
        )
    for _, rows, _, shard_facts in executor.map_unordered(functools.partial(_run_job, fn), todo):
        if facts is not None:
            facts.append(shard_facts)
        bar.advance(done=1, rows=rows)
    bar.close()
    return {name: [w.done_info(i) for i in range(len(inputs))] for name, w in outputs.items()}


def map_tables(
    fn: ShardFn,
    tables: Iterable[tuple[int, pa.Table]],
    outputs: dict[str, DatasetWriter],
    executor: Executor,
    label: str,
    progress: bool = True,
    with_index: bool = False,
    facts: list[dict[str, Any]] | None = None,
) -> None:
    """Like ``map_shards`` for tables produced on the fly (by a reader): the caller yields
    ``(index, table)`` only for indexes not finished yet, and the executor consumes them as it
    has room, so reading overlaps with computing and memory stays bounded. ``with_index`` and
    ``facts`` as for ``map_shards``."""
    specs = {name: (str(w.path), w.spec, w.name, w.write_options) for name, w in outputs.items()}
    jobs = (_Job(index, table, specs, with_index) for index, table in tables)
    bar = Progress(label, unit="chunks", enabled=progress)
    log.info("%s: computing on %s", label, executor.name)
    for _, rows, _, shard_facts in executor.map_unordered(functools.partial(_run_job, fn), jobs):
        if facts is not None:
            facts.append(shard_facts)
        bar.advance(done=1, rows=rows)
    bar.close()
