"""One run of a declared stage: the plumbing every stage shares, owned in one place.

A stage's ``run`` keeps its science (what a shard function computes, what its summary says)
and hands the life of its datasets to a ``StageRun``::

    with StageRun(STAGE, cfg, executor, progress) as run:
        sentences = run.input("input", S.SENTENCES)       # opened and verified
        writer = run.output("output", S.CANDIDATES)       # fingerprinted by cfg and inputs
        if not writer.complete:
            run.map(shard_fn, sentences, {"candidates": writer})   # pending shards only
            writer.finalize(len(sentences), extra={"counts": run.totals(writer)})
        return run.finish(summary(...))                   # the metrics and their headline

The run holds the writer locks of the declaration's ``datasets`` and ``models`` (every folder it
writes) from ``__enter__`` to ``__exit__``, before any input is read or model loaded, so a
second writer is refused at once. Its fingerprint covers the stage's exact params, every input
opened through it (or named with ``depend``: a file list, an upstream fingerprint) and what the
stage adds as ``extra`` (resolved model revisions, an engine's identity). Work that is not one
shard function over one input (mine's index, ingest's dedup, embed's three datasets, the
trainer) runs between these calls in the stage's own code: the run supplies the writers,
mapping, totals and metrics around it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
from pairforge.pipeline.plumbing.errors import DataIntegrityError
from pairforge.pipeline.plumbing.fingerprint import fingerprint
from pairforge.pipeline.plumbing.locks import writer_lock
from pairforge.pipeline.plumbing.metrics import write_metrics
from pairforge.pipeline.plumbing.runner import (
    Executor,
    LocalExecutor,
    ShardFn,
    map_shards,
    map_tables,
)
from pairforge.pipeline.plumbing.schemas import SchemaSpec
from pairforge.pipeline.plumbing.shards import MANIFEST, Dataset, DatasetWriter, open_dataset
from pairforge.pipeline.plumbing.stagedefs import StageDef


class StageRun:
    """One run of ``stage`` with its validated ``cfg`` (see the module docstring).

    ``executor``: where shard functions run (default: in this process, one shard after
    another); ``progress``: progress bars on stderr; ``folders``: the folders to hold locked,
    each with the label a refused writer reads (default: the declaration's ``datasets`` and
    ``models``, read from ``cfg``; None values skipped);
    ``params``: what the manifests record as the params (default: ``cfg.model_dump()``)."""

    def __init__(
        self,
        stage: StageDef,
        cfg: Any,
        executor: Executor | None = None,
        progress: bool = True,
        folders: Mapping[str | Path, str] | None = None,
        params: dict[str, Any] | None = None,
    ) -> None:
        self.stage, self.cfg, self.progress = stage, cfg, progress
        self.params = cfg.model_dump() if params is None else params
        self.inputs: dict[str, Any] = {}  # what the fingerprint covers, by name
        self._executor = executor
        self._locks = contextlib.ExitStack()
        self._writers: list[DatasetWriter] = []
        self._started = time.monotonic()
        if folders is None:
            folders = {getattr(cfg, key): "dataset" for key in stage.datasets}
            folders.update({getattr(cfg, key): f"{stage.name} output" for key in stage.models})
        self.folders = {path: label for path, label in folders.items() if path is not None}

    def __enter__(self) -> StageRun:
        try:
            for path, label in self.folders.items():
                self._locks.enter_context(writer_lock(path, f"{label} {str(path)!r}"))
        except BaseException:
            self._locks.close()  # a refused lock: release the ones taken before it
            raise
        self._started = time.monotonic()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        try:
            if exc_type is None:
                self._check_finished()
        finally:
            for writer in self._writers:  # their own locks, left held by a failed run
                writer.close()
            self._locks.close()

    def _check_finished(self) -> None:
        """Every dataset the run opened a writer for has its manifest: a stage that ends
        without finalizing one is a bug, said here rather than found by its readers."""
        for writer in self._writers:
            if not writer.scratch and not (writer.path / MANIFEST).exists():
                raise DataIntegrityError(
                    f"{self.stage.name}: dataset {writer.name!r} was left unfinished (no "
                    "manifest) by a run that ended without an error"
                )

    @property
    def executor(self) -> Executor:
        if self._executor is None:
            self._executor = LocalExecutor()
        return self._executor

    @property
    def seconds(self) -> float:
        """Seconds since the run began."""
        return round(time.monotonic() - self._started, 3)

    # --- inputs --------------------------------------------------------------------------------

    def input(self, key: str, spec: SchemaSpec, path: str | Path | None = None) -> Dataset:
        """Open the dataset at ``cfg.<key>`` (or ``path``), checked against ``spec`` and its
        manifest (shards are verified as they are read); the fingerprint covers it as ``key``."""
        dataset = open_dataset(path if path is not None else getattr(self.cfg, key), spec)
        self.inputs[key] = dataset
        return dataset

    def depend(self, key: str, value: Any) -> None:
        """Make the fingerprint cover ``value`` as input ``key``: a ``Dataset`` (by its token),
        or what stands for an input that is no dataset (a file list with sizes and mtimes, an
        upstream fingerprint; None for an input not used)."""
        self.inputs[key] = value

    def fingerprint(self, extra: Mapping[str, Any] | None = None) -> str:
        """The run's fingerprint: the exact params, the inputs so far, ``extra`` and the code."""
        return fingerprint(self.stage, self.cfg.model_dump(), self.inputs, extra)

    # --- outputs -------------------------------------------------------------------------------

    def output(
        self,
        key: str,
        spec: SchemaSpec,
        *,
        path: str | Path | None = None,
        extra: Mapping[str, Any] | None = None,
        fingerprint: str | None = None,
        **options: Any,
    ) -> DatasetWriter:
        """The writer of the dataset at ``cfg.<key>`` (or ``path``, for a stage's scratch or a
        dataset named by a template), fingerprinted by :meth:`fingerprint` (``extra``) unless
        one is given: a run resumes its finished shards only over the same params, inputs and
        code. ``options``: the writer's (``rows_per_shard``, ``scratch``, ``name``...)."""
        folder = path if path is not None else getattr(self.cfg, key)
        options.setdefault("name", str(folder))
        writer = DatasetWriter(
            folder,
            spec,
            stage=self.stage,
            params=self.params,
            fingerprint=fingerprint or self.fingerprint(extra),
            **options,
        )
        self._writers.append(writer)
        return writer

    def map(
        self,
        fn: ShardFn,
        source: Dataset | Iterable[tuple[int, pa.Table]],
        outputs: dict[str, DatasetWriter],
        label: str | None = None,
        with_index: bool = False,
    ) -> list[dict[str, Any]]:
        """Run ``fn`` on the run's executor, with progress, over every shard of ``source`` that
        some output has not finished: a dataset (``map_shards``), or the ``(index, table)`` pairs
        a reader yields for the unfinished indexes only (``map_tables``: reading overlaps
        computing). Returns the facts of the shards computed now."""
        facts: list[dict[str, Any]] = []
        mapper = map_shards if isinstance(source, Dataset) else map_tables
        mapper(
            fn,
            source,
            outputs,
            self.executor,
            label or self.stage.name,
            self.progress,
            with_index=with_index,
            facts=facts,
        )
        return facts

    @staticmethod
    def totals(writer: DatasetWriter, shards: Iterable[int] | None = None) -> dict[str, int]:
        """The counts of the writer's finished shards summed (of ``shards`` only, if given)."""
        wanted = None if shards is None else set(shards)
        out: dict[str, int] = {}
        for i, info in enumerate(writer.finished_shards()):
            if wanted is not None and i not in wanted:
                continue
            for key, value in info.counts.items():
                out[key] = out.get(key, 0) + value
        return out

    # --- the end -------------------------------------------------------------------------------

    def finish(self, metrics: dict[str, Any], timed: bool = False) -> dict[str, Any]:
        """Write ``metrics`` to ``cfg.metrics`` with the declaration's headlines beside it
        (``seconds`` added last when ``timed``); returns them."""
        if timed:
            metrics["seconds"] = self.seconds
        write_metrics(self.cfg.metrics, metrics, self.stage.headlines)
        return metrics
