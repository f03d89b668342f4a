"""train: the pairs dataset -> one trained sentence encoder per objective (``models/<objective>``).

One objective per run (``objective``), trained from the base ``model`` on the columns it reads
from the pairs dataset (``input``, written by ``sample``):
SimCSE ``text``; ``simcse_hn`` (SimCSE with mined hard negatives) ``text``, ``negative_texts``;
``simcse_bt`` (SimCSE with a back-translation as the positive) ``text``, ``positive_text``;
DebCSE ``text``, ``positive_texts``, ``negative_texts``; DenoSent ``text``, ``positive_text``;
BSL ``view1_text``, ``view2_text``; ``combined`` (DebCSE + DenoSent's denoising term) DebCSE's.
A dataset without an objective's columns stops the stage before training with one line naming
them.

One objective per run keeps DVC's outputs exact (``models/${train.objective}``); train several
with ``pairforge train -o simcse``, ``-o debcse``, ... or ``dvc exp run -S train.objective=bsl``:
each objective has its own folder and fingerprint, so runs never overwrite each other.

Hyperparameters: the section's top-level keys are shared defaults; ``recipes.<objective>``
overrides them for one objective (the papers' settings, METHODS.md section 3) and holds the
objective's own ``options`` (constructor arguments: temperature, loss weights, ...). A key given
on the command line beats both. Each run has a fingerprint (its resolved settings, the data, the
model, the code): a finished ``models/<objective>/model`` with the same fingerprint is kept as
is, so editing another objective's recipe retrains nothing.

Resumable: a killed run continues from its newest checkpoint (every ``save_every`` steps) and ends
with the same weights as an uninterrupted one. Multi-GPU on one node:
``torchrun --nproc_per_node N -m pairforge.stages.cli train`` (``batch_size`` is the global
batch).

Outputs: ``models/<objective>/model`` (a sentence-transformers folder, see train/export.py),
``models/<objective>/history.json``, ``metrics/train.json``, training curves as DVC plot data
(``plots/train/<objective>.csv``, ``<objective>_dev.csv``) and PNG
(``reports/train_<objective>.png``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pairforge.pipeline.plumbing.config import PARAMS_FILE, ModelSpec, StageConfig
from pairforge.pipeline.plumbing.fingerprint import fingerprint as run_fingerprint
from pairforge.pipeline.plumbing.stagedefs import StageDef
from pairforge.pipeline.plumbing.stagerun import StageRun
from pairforge.stages.options import stage_command
from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator
from pydantic.fields import FieldInfo


class _RecipeKey:
    """Marks a ``train`` key that ``recipes.<objective>`` may override (see ``RecipeConfig``)."""

    def __repr__(self) -> str:
        return "RECIPE"


RECIPE = _RecipeKey()


class TrainConfig(StageConfig):
    """The ``train`` section of params.yaml."""

    input: str = Field("data/pairs", description="the pairs dataset (written by `sample`)")
    output: str = Field("models", description="models/<objective> per objective")
    model: ModelSpec = Field(
        "bert-base-uncased", description="base encoder: hub id, folder or package:<pkg>"
    )
    objective: str = Field(
        "simcse",
        description="the objective to train (a registered name: simcse, debcse, denosent, bsl, ...)",
    )
    seed: int = Field(42, description="random seed (data order, dropout, initialisation)")
    batch_size: Annotated[int, RECIPE] = Field(
        64, ge=1, description="global batch size (all processes)"
    )
    lr: Annotated[float, RECIPE] = Field(3e-5, gt=0, description="peak learning rate")
    weight_decay: Annotated[float, RECIPE] = Field(0.0, ge=0, description="AdamW weight decay")
    schedule: Annotated[Literal["linear", "constant"], RECIPE] = Field(
        "linear", description="learning rate after the warm-up: linear decay to 0 or constant"
    )
    warmup_steps: Annotated[int, RECIPE] = Field(
        0, ge=0, description="steps of linear warm-up; 0: warmup_ratio of the steps"
    )
    warmup_ratio: Annotated[float, RECIPE] = Field(
        0.0, ge=0, le=1, description="share of the steps warmed up when warmup_steps is 0"
    )
    max_steps: Annotated[int | None, RECIPE] = Field(
        None, ge=1, description="optimiser steps (beats epochs); null: epochs x rows / batch_size"
    )
    epochs: Annotated[float, RECIPE] = Field(
        1.0, gt=0, description="passes over the data when max_steps is unset"
    )
    max_length: Annotated[int, RECIPE] = Field(32, ge=4, description="tokens per sentence")
    max_grad_norm: Annotated[float, RECIPE] = Field(1.0, ge=0, description="0: no clipping")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto", description="auto, fp32, bf16 or fp16 (GPU autocast)"
    )
    device: str = Field("auto", description="auto, cpu, cuda, cuda:N")
    deterministic: bool = Field(
        True, description="deterministic kernels (reproducible, sometimes slower)"
    )
    buffer_size: int = Field(10_000, ge=1, description="shuffle buffer rows")
    save_every: int = Field(250, ge=1, description="checkpoint every N steps")
    keep_checkpoints: int = Field(1, ge=1, description="resumable checkpoints kept, newest first")
    eval_every: Annotated[int, RECIPE] = Field(
        125, ge=0, description="0: no dev evaluation (the last step is kept)"
    )
    eval_tasks: Annotated[list[str], RECIPE] = Field(
        ["stsb_dev", "sickr_dev"],
        min_length=1,
        description="dev tasks that select the checkpoint (stsb_dev, sickr_dev, demo_dev)",
    )
    eval_max_pairs: int | None = Field(None, ge=1, description="dev pairs per task (seeded sample)")
    eval_batch_size: int = Field(
        128, ge=1, description="sentences per forward pass of the dev evaluation"
    )
    sts_dir: str = Field(
        "$PAIRFORGE_SHARED_DATA/sts", description="STS data folder (dev sets); $VARS expand"
    )
    eval_fallback: list[str] = Field(
        [],
        description="dev tasks when the STS folder is absent (the demo: [demo_dev]); "
        "empty: an absent folder stops the run with the command that fetches it",
    )
    demo_dir: str = Field(
        "data/demo/eval", description="the demo evaluation set's folder (demo_dev, demo_test)"
    )
    log_every: int = Field(10, ge=1, description="steps between log lines and history rows")
    threads: int = Field(-1, ge=-1, description="CPU threads for torch; -1: torch's default")
    recipes: dict[str, RecipeConfig] = Field(
        default_factory=dict,
        description="per-objective overrides and options; the paper profile holds the papers'",
    )
    metrics: str = Field("metrics/train.json", description="metrics JSON path")
    plots: str = Field(
        "plots/train",
        description="folder of the DVC plots CSVs (<objective>.csv, <objective>_dev.csv)",
    )
    reports: str = Field(
        "reports", description="folder of the training curve PNG (train_<objective>.png)"
    )

    @model_validator(mode="after")
    def _objectives(self) -> TrainConfig:
        # Checked here, before any model loads, against the torch-free option declarations.
        from pairforge.pipeline.plumbing.errors import ConfigError
        from pairforge.train.objective_options import check_options, objective_options

        options = objective_options()
        known = ", ".join(options)
        if self.objective not in options:
            raise ConfigError(
                f"train.objective: unknown {self.objective!r}; known objectives: {known}"
            )
        for name, recipe in self.recipes.items():
            if name not in options:
                raise ConfigError(f"train.recipes.{name}: no such objective; known: {known}")
            check_options(name, recipe.options, f"train.recipes.{name}.options")
        return self


def _only(metrics: Mapping[str, Any]) -> Any:
    """The one objective's figures in metrics/train.json (``{objective: {...}}``)."""
    (value,) = metrics.values()
    return value


STAGE = StageDef(
    name="train",
    module=__name__,
    config=TrainConfig,
    inputs=(
        "${train.input}",
        # InfoCSE's auxiliary network (train.recipes.infocse.options.aux_path). DVC has no
        # per-objective deps, so every objective's run waits for it; it changes rarely.
        "${pretrain.output}",
        # The demo evaluation set: its dev split selects the checkpoint without the STS data.
        "${train.demo_dir}",
    ),
    outputs=("output", "metrics", "plots", "reports"),
    # The exact param is the recipe of the objective params.yaml names, not the others'.
    param_paths={"recipes": "recipes.${train.objective}"},
    data_files=("train/st_pooling.py",),
    outs={
        "${train.metrics}": {"cache": False},
        "${train.output}/${train.objective}": {"persist": True},
    },
    plots={
        "${train.plots}/${train.objective}.csv": {"x": "step", "y": "loss", "cache": False},
        "${train.plots}/${train.objective}_dev.csv": {"x": "step", "y": "score", "cache": False},
        "${train.reports}/train_${train.objective}.png": {"cache": False},
    },
    headlines={
        "steps": lambda m: _only(m)["steps"],
        "best_dev": lambda m: _only(m)["best_dev"],
    },
)


def _recipe_config() -> type[BaseModel]:
    """``RecipeConfig``: each ``RECIPE`` key of ``TrainConfig`` with its type and validation and
    no default (None: the shared key applies), then the objective's ``options``."""
    overridable = {
        name: (info.annotation | None, FieldInfo.merge_field_infos(info, default=None))
        for name, info in TrainConfig.model_fields.items()
        if RECIPE in info.metadata
    }
    return create_model(
        "RecipeConfig",
        __config__=ConfigDict(extra="forbid", frozen=True),
        __doc__="One objective's overrides of the shared training keys, and its own options.",
        __module__=__name__,
        **overridable,
        options=(
            dict[str, Any],
            Field(default_factory=dict, description="objective constructor arguments"),
        ),
    )


# Declared once, in TrainConfig: a recipe's keys are its RECIPE fields.
RecipeConfig = _recipe_config()
RECIPE_KEYS = tuple(name for name in RecipeConfig.model_fields if name != "options")
TrainConfig.model_rebuild()  # resolves ``recipes: dict[str, RecipeConfig]``


def settings_for(
    cfg: TrainConfig, objective: str | None = None, forced: frozenset[str] = frozenset()
):
    """The TrainSettings of ``objective`` (default ``cfg.objective``), every field taken from
    ``cfg`` by name: shared keys, its recipe, then ``forced`` keys (given on the command line)
    from the shared ones again. ``options`` are the recipe's (none without a recipe)."""
    from dataclasses import fields

    from pairforge.train.loop import TrainSettings

    objective = objective or cfg.objective
    own = {"objective", "options"}
    values = {f.name: getattr(cfg, f.name) for f in fields(TrainSettings) if f.name not in own}
    recipe = cfg.recipes.get(objective)
    if recipe is not None:
        for key in RECIPE_KEYS:
            value = getattr(recipe, key)
            if value is not None and key not in forced:
                values[key] = value
    values["eval_tasks"] = tuple(values["eval_tasks"])
    values["max_grad_norm"] = values["max_grad_norm"] or None
    return TrainSettings(
        objective=objective, options=dict(recipe.options) if recipe else {}, **values
    )


def inputs_hash(options: dict[str, Any]) -> dict[str, str]:
    """sha256 of every file in the folders an objective reads (InfoCSE's ``aux_path``), so a
    re-pretrained auxiliary network retrains the objective although its path is unchanged."""
    hashes = {}
    for key in ("aux_path",):
        folder = options.get(key)
        if not folder or not Path(folder).is_dir():
            continue  # the objective reports a missing folder itself, with what to run
        digest = hashlib.sha256()
        for file in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
            digest.update(str(file.relative_to(folder)).encode())
            with file.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
        hashes[key] = digest.hexdigest()
    return hashes


def dev_sets(cfg: TrainConfig, settings):
    """``settings`` with the dev tasks this run selects its checkpoint on: its ``eval_tasks``
    when their folder is there, else ``cfg.eval_fallback`` (the trainer says which, once). An
    absent STS folder without a fallback is a ConfigError with the command that fetches it."""
    from pairforge.pipeline.science import sts

    if settings.eval_every == 0:
        return settings
    wanted = [task for task in settings.eval_tasks if task not in sts.DEMO_TASKS]
    if not wanted or sts.find_data_folder(cfg.sts_dir) is not None:
        return settings
    if not cfg.eval_fallback:
        sts.data_folder(cfg.sts_dir)  # raises: the folder, and how to get the data
    return replace(settings, eval_tasks=tuple(cfg.eval_fallback))


def dev_hash(settings) -> str | None:
    """sha256 of the dev files the run selects on, so an edited dev set selects afresh."""
    from pairforge.pipeline.science import sts

    if settings.eval_every == 0:
        return None
    digest = hashlib.sha256()
    for task in settings.eval_tasks:
        root = sts.task_folder(task, settings.sts_dir, settings.demo_dir)
        for file in sts.task_files(root, task):
            digest.update(task.encode())
            digest.update(file.read_bytes() if file.is_file() else b"")
    return digest.hexdigest()


def fingerprint(cfg: TrainConfig, settings, data_fingerprint: str) -> str:
    """The run's fingerprint: the train section's exact keys (its objective's recipe, not the
    others'), the ``settings`` resolved from them (a key given on the command line beats the
    recipe), the pairs, the folders the objective reads and the dev files it selects on."""
    from dataclasses import asdict

    inputs = {
        "pairs": data_fingerprint,
        "objective": inputs_hash(settings.options),
        "dev": dev_hash(settings),
    }
    return run_fingerprint(STAGE, cfg.model_dump(), inputs, {"settings": asdict(settings)})


def run(
    cfg: TrainConfig,
    progress: bool = True,
    forced: frozenset[str] = frozenset(),
    hooks: dict | None = None,
) -> dict:
    """Train ``cfg.objective``; returns the metrics it also writes to ``cfg.metrics``."""
    out = Path(cfg.output) / cfg.objective
    # One writer per model folder, held before any work (rank 0 of torchrun: the ranks of one
    # run are one writer).
    with StageRun(STAGE, cfg, progress=progress, folders={out: "train output"}) as run:
        return _train(run, out, forced, hooks)


def _train(run: StageRun, out: Path, forced: frozenset[str], hooks: dict | None) -> dict:
    from pairforge.pipeline.plumbing.errors import ConfigError, IncompleteDatasetError
    from pairforge.pipeline.science.sts import DEMO_TASKS, DEV_TASKS, TASKS
    from pairforge.train.data import PairsSource
    from pairforge.train.loop import Trainer, quiet_transformers
    from pairforge.train.objectives import OBJECTIVES

    cfg, progress, objective = run.cfg, run.progress, run.cfg.objective
    if objective not in OBJECTIVES:
        raise ConfigError(
            f"train.objective: unknown {objective!r}; known objectives: {', '.join(sorted(OBJECTIVES))}"
        )
    unknown = sorted(set(cfg.recipes) - set(OBJECTIVES))
    if unknown:
        raise ConfigError(
            f"train.recipes: no objective {unknown}; known: {', '.join(sorted(OBJECTIVES))}"
        )
    settings = settings_for(cfg, forced=forced)
    for key, tasks in (("eval_tasks", settings.eval_tasks), ("eval_fallback", cfg.eval_fallback)):
        for task in tasks:
            if task not in TASKS:
                raise ConfigError(
                    f"train.{key}: {task!r} is not a task; dev tasks: "
                    f"{', '.join((*DEV_TASKS, *DEMO_TASKS))}"
                )
    try:
        data_fingerprint = PairsSource(cfg.input).fingerprint
    except IncompleteDatasetError as exc:
        raise ConfigError(
            f"train.input: {exc}; the 'sample' stage writes it: run `pairforge sample` "
            "(or `dvc repro sample`)"
        ) from None
    settings = dev_sets(cfg, settings)
    fp = fingerprint(cfg, settings, data_fingerprint)
    with quiet_transformers():
        result = Trainer(settings, cfg.input, out, fp, progress, hooks).run()
    return _write_outputs(run, settings, result)


def _write_outputs(run: StageRun, settings, result: dict) -> dict:
    """Rank 0 writes the training curves (CSV and figure) and the metrics; returns them ({} on
    the other ranks). Every rank then leaves the process group."""
    from pairforge.train import distributed as dist
    from pairforge.train.training_report import plot_training, write_csv

    cfg, objective = run.cfg, run.cfg.objective
    try:
        if not dist.is_main():
            return {}
        metrics = {objective: _objective_metrics(result["summary"])}
        plots = Path(cfg.plots)
        columns = ["step", "epoch", "loss", "lr", "rows_per_s", "tokens_per_s", "grad_norm"]
        extra = sorted({k for h in result["history"] for k in h} - set(columns))
        write_csv(plots / f"{objective}.csv", result["history"], columns + extra)
        write_csv(
            plots / f"{objective}_dev.csv",
            result["dev_history"],
            ["step", "score", *settings.eval_tasks],
        )
        plot_training(
            Path(cfg.reports) / f"train_{objective}.png",
            objective,
            result["history"],
            result["dev_history"],
            settings.eval_tasks,
        )
        return run.finish(metrics)
    finally:
        # Under torchrun every rank leaves the group together, once rank 0 has written the
        # outputs above: a rank that left first would abort the other.
        dist.shutdown()


def _objective_metrics(summary: dict) -> dict:
    best = summary.get("best") or {}
    return {
        "steps": summary.get("steps"),
        "final_loss": summary.get("final_loss"),
        "best_dev": best.get("score"),
        "best_step": best.get("step"),
        "rows_per_s": summary.get("rows_per_s"),
        "seconds": summary.get("seconds_this_run"),
        "rows_used": summary.get("rows_used"),
        "rows_skipped": summary.get("rows_skipped"),
        "epochs_seen": summary.get("epochs_seen"),
        "mlm_head": (summary.get("load_report") or {}).get("mlm_head"),
        # The pooling trained and exported, and the start model's (None: its folder names none).
        "pooling": summary.get("pooling"),
        "start_pooling": summary.get("start_pooling"),
        # Where it ran: the device, the GPU's name, the autocast dtype (None: float32 throughout).
        "device": summary.get("device"),
        "device_name": summary.get("device_name"),
        "autocast": summary.get("autocast"),
    }


@stage_command(STAGE, names={"objective": ("--objective", "-o")})
def command(
    cfg: TrainConfig,
    progress: bool,
    given: frozenset[str],
    params: str | None,
    profile: str | None,
) -> None:
    """Train a sentence encoder with one objective on the pairs dataset, resumably.

    Every option defaults to the key of the same name in the `train` section of params.yaml;
    per-objective settings live in `train.recipes.<objective>`. An option given on the command
    line beats the objective's recipe. Outside a project (no params.yaml, no --profile), the
    encoder is the one the pairs were mined with, as their manifest names it.
    """
    if params is None and profile is None and not Path(PARAMS_FILE).exists():
        cfg = _mined_encoder(cfg, given)
    run(cfg, progress=progress, forced=given)


def _mined_encoder(cfg: TrainConfig, given: frozenset[str]) -> TrainConfig:
    """``cfg`` with the pairs' own encoder as ``model`` (their manifest's ``encoder``, written
    by ``sample``) unless ``--model`` was given or the manifest names none."""
    import logging

    from pairforge.pipeline.plumbing.errors import ConfigError
    from pairforge.pipeline.plumbing.shards import read_manifest
    from pairforge.pipeline.plumbing.storage import dataset_path
    from pairforge.pipeline.science.models import spec_problem

    if "model" in given or not (dataset_path(cfg.input) / "_manifest.json").exists():
        return cfg
    encoder = read_manifest(cfg.input).get("encoder") or {}
    model = encoder.get("model")
    if not isinstance(model, str) or not model:
        return cfg
    problem = spec_problem(model)
    if problem is not None:
        raise ConfigError(
            f"train: the pairs {cfg.input!r} were mined with the encoder {model!r}, which "
            f"cannot load here ({problem}); pass --model"
        )
    logging.getLogger("pairforge").info(
        "train: the model is the encoder the pairs were mined with, %s (their manifest)", model
    )
    return cfg.model_copy(update={"model": model})
