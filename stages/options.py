"""Each stage's command, generated from its config, with the options every stage shares and
the error handling that keeps failures to one line.

A stage declares its settings once, in its pydantic config: :func:`stage_command` turns the
config's fields into the command's options (name, type, help from the field's description,
default: the params.yaml key), so the command itself is its docstring and a few lines of body.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import inspect
import logging
import sys
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pairforge.pipeline.plumbing.config import (
    DVC_FILE,
    MODEL_SPEC,
    PARAMS_FILE,
    params_source,
    section_config,
    stage_outputs,
    writer_of,
)
from pairforge.pipeline.plumbing.errors import ConfigError, IncompleteDatasetError, PairforgeError
from pairforge.pipeline.science.models import spec_problem
from pairforge.pipeline.science.models.apertium import APERTIUM_PREFIX
from pairforge.stages.params import profile_params
from pydantic import BaseModel

if TYPE_CHECKING:
    from pairforge.pipeline.plumbing.runner import Executor
    from pairforge.pipeline.plumbing.stagedefs import StageDef

# Plumbing: no stage's output depends on this module, so it is no stage's code (its edits rerun
# nothing): pipeline/plumbing/stagedefs.py.
CHANGES_NO_OUTPUT = True

ParamsOpt = Annotated[
    str | None,
    typer.Option(
        "--params",
        help="params file to read the stage's section from [default: params.yaml here; without "
        "one, the config's defaults]",
        show_default=False,
    ),
]
ProfileOpt = Annotated[
    str | None,
    typer.Option(
        "--profile",
        help="a profile's settings instead of a params file (demo, paper, apertium)",
        show_default=False,
    ),
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
    from pairforge.pipeline.plumbing.runner import (
        make_executor,  # pyarrow: not for --help or a config error
    )

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


def _writer_hint(
    exc: IncompleteDatasetError, params_path: str | None, profile: str | None = None
) -> str:
    """``; the 'x' stage writes it: ...`` for a missing input dataset that a DVC stage of the
    dvc.yaml beside the params file (or in the current folder, with ``--profile``) writes; empty
    when none does (or it was interrupted, which the error already says how to finish)."""
    if exc.path is None or (Path(exc.path) / "_progress").exists():
        return ""
    try:
        # A profile's preset holds what differs from the defaults; the outputs need them all.
        params = profile_params(profile) if profile else params_source(params_path, None)[0]
    except ConfigError:
        return ""
    folder = Path(params_path).parent if params_path else Path(".")
    writer = writer_of(exc.path, stage_outputs(params, folder / DVC_FILE))
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
            hint = _writer_hint(exc, kwargs.get("params"), kwargs.get("profile"))
            typer.echo(f"error: {exc}{hint}", err=True)
            raise typer.Exit(getattr(exc, "exit_code", 1)) from None
        except PairforgeError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(getattr(exc, "exit_code", 1)) from None
        except OSError as exc:
            if not disk_full(exc):
                raise
            typer.echo(f"error: {disk_full_message(exc)}", err=True)
            raise typer.Exit(1) from None
        finally:
            # Writers a failed command left open (the process may go on, as under CliRunner).
            from pairforge.pipeline.plumbing.locks import release_all

            release_all()

    return wrapper


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the device is full (errno ENOSPC, or Arrow's message for it)."""
    return getattr(exc, "errno", None) == errno.ENOSPC or "No space left on device" in str(exc)


def disk_full_message(exc: OSError) -> str:
    """One line naming the dataset and the file a full disk stopped. Writes go to temporary
    names first, so nothing half-written is ever read, and the finished shards are kept."""
    file = str(exc.filename or "")
    # A dataset's files sit in its data/ or _progress/ folder, or in its _work/ (a stage's
    # scratch datasets), whose owner is the dataset to name.
    parents = list(Path(file).parents) if file else []
    inner = next((p for p in reversed(parents) if p.name == "_work"), None) or next(
        (p for p in parents if p.name in ("data", "_progress")), None
    )
    where = f" writing {file}" if file else ""
    of = f" (dataset {str(inner.parent)!r})" if file and inner is not None else ""
    return (
        f"no space left on the device{where}{of}; free some space and run the command again: "
        "finished shards are kept and nothing half-written is read"
    )


# --- a stage's command, generated from its config ---------------------------------------------

# The options a stage body may take besides its config: name -> (annotation, default).
SHARED_OPTIONS: dict[str, tuple[Any, Any]] = {
    "params": (ParamsOpt, None),
    "profile": (ProfileOpt, None),
    "workers": (WorkersOpt, 0),
    "scheduler": (SchedulerOpt, None),
    "progress": (ProgressOpt, True),
}
_SCALARS = (bool, int, float, str)


def option_type(annotation: Any) -> tuple[type, tuple[str, ...], bool] | None:
    """How a config field's type reads on the command line: ``(scalar, choices, repeated)``;
    None for a field set in params.yaml only (a nested model, a mapping, a fixed-size tuple).
    A ``Literal`` is a ``str`` with its choices; ``X | None`` is ``X``; ``list[X]`` is a
    repeated option."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        if len(members) == 1:
            return option_type(members[0])
        literals = [option_type(m) for m in members]
        if all(t is not None and t[1] and not t[2] for t in literals):
            return str, tuple(c for t in literals for c in t[1]), False  # type: ignore[union-attr]
        raise TypeError(f"no command-line option for the union {annotation!r}")
    if origin is typing.Literal:
        return str, tuple(str(a) for a in args), False
    if origin is list:
        inner = option_type(args[0]) if args else None
        if inner is None or inner[2]:
            return None
        return inner[0], inner[1], True
    if origin in (tuple, dict) or (
        isinstance(annotation, type) and issubclass(annotation, BaseModel)
    ):
        return None
    if annotation in _SCALARS:
        return annotation, (), False
    raise TypeError(f"no command-line option for the type {annotation!r}")


def option_help(description: str | None, choices: tuple[str, ...] = ()) -> str | None:
    """A field's description as its option's help; a ``Literal``'s choices follow it (in the
    help, not the metavar column, which would squeeze the option names at 80 columns)."""
    if not choices:
        return description
    listed = f"[{'|'.join(choices)}]"
    return f"{description} {listed}" if description else listed


def config_options(
    model: type[BaseModel], names: dict[str, tuple[str, ...]] | None = None
) -> dict[str, tuple[Any, Any]]:
    """One option per field of ``model`` that the command line can set, in field order:
    name -> (``Annotated`` typer option, default None: the params.yaml key). The option is
    ``--field-name`` (a bool: ``--field-name/--no-field-name``) unless ``names`` gives its
    declarations; its help is the field's description (:func:`option_help`). A ``Literal`` is
    a plain string on the command line: a value outside its choices is the config's one-line
    error (exit 2), not a usage error."""
    names = names or {}
    unknown = set(names) - set(model.model_fields)
    if unknown:
        raise TypeError(f"{model.__name__}: option names for fields it lacks: {sorted(unknown)}")
    options: dict[str, tuple[Any, Any]] = {}
    for name, field in model.model_fields.items():
        kind = option_type(field.annotation)
        if kind is None:
            continue
        scalar, choices, repeated = kind
        dashed = name.replace("_", "-")
        flag = f"--{dashed}/--no-{dashed}" if scalar is bool else f"--{dashed}"
        decls = names.get(name, (flag,))
        info = typer.Option(
            *decls,
            help=option_help(field.description, choices),
            show_default=False,
        )
        annotation = list[scalar] if repeated else scalar  # type: ignore[valid-type]
        options[name] = (Annotated[annotation | None, info], None)
    return options


def stage_command(
    declaration: StageDef, names: dict[str, tuple[str, ...]] | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Make ``body(cfg, ...)`` the declared stage's command: one option per field of its config
    (:func:`config_options`), each defaulting to the stage's section of ``--params`` (or
    ``--profile``; outside a project, the config's own default); then
    ``--params`` and every other parameter of ``body``: one named in :data:`SHARED_OPTIONS`
    (``workers``, ``scheduler``, ``progress``, ``params``, ``profile``), one declared with its own
    ``Annotated`` typer option (a stage's extra), or ``given``, the fields set on the command
    line. The body receives the validated config; errors are one line (:func:`cli_errors`).
    The body's docstring is the command's help."""

    stage, model = declaration.name, declaration.config

    def decorate(body: Callable[..., Any]) -> Callable[..., Any]:
        fields = config_options(model, names)
        hints = typing.get_type_hints(body, include_extras=True)
        body_params = list(inspect.signature(body).parameters.values())[1:]
        extras: dict[str, tuple[Any, Any]] = {
            "params": SHARED_OPTIONS["params"],
            "profile": SHARED_OPTIONS["profile"],
        }
        for p in body_params:
            if p.name == "given":
                continue
            if p.name in fields:
                raise TypeError(f"{stage}: {p.name!r} is a config field and a body parameter")
            if p.default is not inspect.Parameter.empty:
                extras[p.name] = (hints[p.name], p.default)
            elif p.name in SHARED_OPTIONS:
                extras[p.name] = SHARED_OPTIONS[p.name]
            else:
                raise TypeError(f"{stage}: body parameter {p.name!r} is no shared option")
        wanted = {p.name for p in body_params}

        @functools.wraps(body)
        def command(**kwargs: Any) -> Any:
            overrides = {}
            for name in fields:
                value = kwargs.pop(name)
                # An option not given is None (a repeated one may be empty): the params key.
                if value is not None and not (isinstance(value, (list, tuple)) and not value):
                    overrides[name] = value
            path = kwargs["params"]
            params, source = params_source(path, kwargs["profile"])  # read once
            if path is None and source != PARAMS_FILE:  # said once: not a project's params
                where = "its config's defaults" if source == "defaults" else source
                logging.getLogger("pairforge").info(
                    "%s: no params.yaml read; running on %s", stage, where
                )
            here = Path(path).parent if path is not None else Path()
            cfg = section_config(stage, model, params, source, overrides)
            check_model_specs(stage, cfg, params, here / DVC_FILE, planned=False)
            if "given" in wanted:
                kwargs["given"] = frozenset(overrides)
            return body(cfg, **{k: v for k, v in kwargs.items() if k in wanted})

        parameters = [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=ann, default=d)
            for name, (ann, d) in {**fields, **extras}.items()
        ]
        command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in parameters}
        del command.__wrapped__  # typer reads the generated signature, not the body's
        return cli_errors(command)

    return decorate


# --- model specs: each one checked before a stage loads anything ------------------------------


def model_specs(value: Any, key: str) -> Iterator[tuple[str, str]]:
    """``(key, spec)`` for every :data:`ModelSpec` field set in a validated config, nested
    models, lists and mappings included (``backtranslate.routes.0.forward``)."""
    if isinstance(value, BaseModel):
        for name, field in type(value).model_fields.items():
            item = getattr(value, name)
            if any(m is MODEL_SPEC for m in field.metadata):
                if isinstance(item, str):
                    yield f"{key}.{name}", item
            else:
                yield from model_specs(item, f"{key}.{name}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from model_specs(item, f"{key}.{i}")
    elif isinstance(value, dict):
        for name, item in value.items():
            yield from model_specs(item, f"{key}.{name}")


def check_model_specs(
    section: str,
    cfg: BaseModel,
    params: dict[str, Any],
    dvc_file: str | Path = DVC_FILE,
    planned: bool = False,
) -> None:
    """Raise a one-line ConfigError naming the key of the first model spec in ``cfg`` that
    cannot load (:func:`pipeline.science.models.spec_problem`). A missing folder that another DVC
    stage
    of ``dvc_file`` writes is fine when ``planned`` (the pipeline makes it first: ``profile
    check``); otherwise the message names that stage to run."""
    outputs: dict[str, str] | None = None
    for key, spec in model_specs(cfg, section):
        problem = spec_problem(spec)
        if problem is None:
            continue
        if outputs is None:
            outputs = stage_outputs(params, dvc_file)
        writer = writer_of(spec, outputs)
        if writer is not None and writer != section:
            if planned:
                continue
            raise ConfigError(
                f"{key}: {spec!r} does not exist yet; the {writer!r} stage writes it: "
                f"run `pairforge {writer}` (or `dvc repro {section}`) first"
            )
        if spec.startswith(APERTIUM_PREFIX):
            raise ConfigError(f"{key}: {spec!r}: {problem}")
        raise ConfigError(
            f"{key}: {spec!r}: {problem}; "
            "set it to a model folder, a hub id (name or org/name) or package:<module>"
        )
