"""Options every stage command shares, and the error handling that keeps failures to one line."""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pairforge.pipeline.errors import ConfigError, IncompleteDatasetError, PairforgeError

if TYPE_CHECKING:
    from pairforge.pipeline.runner import Executor

ParamsOpt = Annotated[
    str, typer.Option("--params", help="params.yaml to read the stage's section from.")
]
WorkersOpt = Annotated[
    int,
    typer.Option(
        "--workers",
        "-w",
        help="0: run in this process; N: a Dask LocalCluster of N worker processes.",
    ),
]
SchedulerOpt = Annotated[
    str | None,
    typer.Option(
        "--scheduler",
        help="Address of an existing Dask scheduler (e.g. tcp://host:8786); overrides --workers.",
    ),
]
ProgressOpt = Annotated[
    bool,
    typer.Option(
        "--progress/--no-progress",
        help="Show progress (a live line on a terminal, log lines otherwise).",
    ),
]


@contextlib.contextmanager
def executor(workers: int, scheduler: str | None) -> Iterator[Executor]:
    from pairforge.pipeline.runner import make_executor  # pyarrow: not for --help or a config error

    ex = make_executor(workers, scheduler)
    try:
        yield ex
    finally:
        ex.close()


def setup_logging() -> None:
    logger = logging.getLogger("pairforge")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def _writer_hint(exc: IncompleteDatasetError, params_path: str | None) -> str:
    """``; the 'x' stage writes it: ...`` for a missing input dataset that a DVC stage of the
    dvc.yaml beside the params file writes; empty when none does (or it was interrupted, which
    the error already says how to finish)."""
    from pairforge.pipeline.config import (
        DVC_FILE,
        PARAMS_FILE,
        load_params,
        stage_outputs,
        writer_of,
    )

    if exc.path is None or (Path(exc.path) / "_progress").exists():
        return ""
    params_path = params_path or PARAMS_FILE
    try:
        params = load_params(params_path)
    except ConfigError:
        return ""
    writer = writer_of(exc.path, stage_outputs(params, Path(params_path).parent / DVC_FILE))
    if writer is None:
        return ""
    return f"; the {writer!r} stage writes it: run `pairforge {writer}` (or `dvc repro {writer}`)"


def cli_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn pairforge errors into one line on stderr: exit 2 for config, a corrupt shard or an
    output another writer holds (an error's ``exit_code``), 1 for other data errors."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        setup_logging()
        try:
            return fn(*args, **kwargs)
        except ConfigError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        except IncompleteDatasetError as exc:
            typer.echo(f"error: {exc}{_writer_hint(exc, kwargs.get('params'))}", err=True)
            raise typer.Exit(getattr(exc, "exit_code", 1)) from None
        except PairforgeError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(getattr(exc, "exit_code", 1)) from None
        finally:
            # Writers a failed command left open (the process may go on, as under CliRunner).
            from pairforge.pipeline.locks import release_all

            release_all()

    return wrapper
