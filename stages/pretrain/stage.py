"""pretrain: the sentences -> InfoCSE's pre-trained auxiliary MLM network (``models/infocse-aux``).

InfoCSE (METHODS.md section 3) pre-trains its auxiliary network before joint training: the
encoder's MLM loss and the auxiliary loss (2 layers over the final [CLS] and the lower layers'
states) on the same masked sentences, with a shared output projection. Without this phase the
paper's STS-B dev drops from 85.49 to 83.73. The ``train`` stage reads the result through the
InfoCSE option ``aux_path``.

The training itself is ``stages.pretrain.infocse.pretrain``; this module is the thin command:
params, the input dataset, the model, and the metrics and plots. A killed run resumes from its
last checkpoint (``<output>/_checkpoint``); a finished one with the same fingerprint (params,
input dataset, code) is not run again.
"""

from __future__ import annotations

import csv
import io
import logging
import math
from pathlib import Path

from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.config import ModelSpec, StageConfig
from pairforge.pipeline.plumbing.errors import ConfigError, PairforgeError
from pairforge.pipeline.plumbing.files import atomic_write_bytes
from pairforge.pipeline.plumbing.stagedefs import StageDef
from pairforge.pipeline.plumbing.stagerun import StageRun
from pairforge.pipeline.science.models import load_masked_lm, pick_device, resolve_model
from pairforge.stages.options import stage_command
from pydantic import Field

log = logging.getLogger("pairforge")

SMOOTHING = 10  # steps in the moving average of the loss plot and of the reported final losses


class PretrainConfig(StageConfig):
    """The ``pretrain`` section of params.yaml."""

    input: str = Field("data/sentences", description="sentences dataset (SENTENCES schema)")
    model: ModelSpec = Field(
        "bert-base-uncased", description="encoder spec: hub id, local folder or package:<name>"
    )
    output: str = Field(
        "models/infocse-aux", description="folder for the pre-trained auxiliary network"
    )
    lower_layers: int = Field(
        6, ge=1, description="frozen lower encoder layers under the auxiliary head (paper: 6)"
    )
    head_layers: int = Field(
        2, ge=1, description="trainable layers over [CLS] + lower states (paper: 2)"
    )
    mask_rate: float = Field(0.15, gt=0, le=1, description="share of tokens masked")
    aux_weight: float = Field(1.0, ge=0, description="weight of the auxiliary MLM loss (eq. 6)")
    train_backbone: bool = Field(True, description="update the encoder too (paper) or only heads")
    max_length: int = Field(32, ge=4, description="tokens per sentence, special tokens included")
    batch_size: int = Field(64, ge=1, description="sentences per optimiser step")
    steps: int = Field(0, ge=0, description="optimiser steps; 0: from epochs")
    epochs: float = Field(8.0, gt=0, description="passes over the sentences when steps is 0")
    learning_rate: float = Field(1e-4, gt=0, description="peak AdamW learning rate")
    weight_decay: float = Field(0.01, ge=0, description="adamW weight decay")
    warmup_ratio: float = Field(
        0.1, ge=0, lt=1, description="share of steps with linear warm-up; then linear decay"
    )
    seed: int = Field(42, description="seed of data order, masking and dropout")
    checkpoint_every: int = Field(100, ge=1, description="steps between resumable checkpoints")
    device: str = Field("auto", description="auto, cpu, cuda, cuda:N")
    metrics: str = Field("metrics/pretrain.json", description="metrics JSON path")
    plot_data: str = Field("plots/pretrain.csv", description="per-step loss CSV (DVC plot)")
    figure: str = Field("plots/pretrain.png", description="loss curve PNG")


STAGE = StageDef(
    name="pretrain",
    module=__name__,
    config=PretrainConfig,
    inputs=("${pretrain.input}",),
    outputs=("output", "metrics", "plot_data", "figure"),
    models=("output",),
    free=("device",),
    outs={
        "${pretrain.metrics}": {"cache": False},
        "${pretrain.output}": {"persist": True},
    },
    plots={
        "${pretrain.plot_data}": {"x": "step", "y": "aux_mlm", "cache": False},
        "${pretrain.figure}": {"cache": False},
    },
    headlines={"steps": "steps", "aux_mlm": "aux_mlm_last"},
)


def total_steps(cfg: PretrainConfig, n_sentences: int) -> int:
    """``steps``, or ``epochs`` passes over ``n_sentences`` at ``batch_size`` (at least 1)."""
    if cfg.steps:
        return cfg.steps
    return max(1, math.ceil(cfg.epochs * n_sentences / cfg.batch_size))


def run(cfg: PretrainConfig, progress: bool = True) -> dict:
    """Pre-train (or resume) and write the network, metrics and plots; returns the metrics."""
    with StageRun(STAGE, cfg, progress=progress) as run:
        return _run(run)


def _run(run: StageRun) -> dict:
    from pairforge.stages.pretrain.infocse import PretrainSettings, pretrain, read_history
    from pairforge.train.infocse_aux import AUX_MANIFEST, read_aux_config

    cfg, progress = run.cfg, run.progress

    dataset = run.input("input", S.SENTENCES)
    fingerprint = run.fingerprint({"model": resolve_model(cfg.model)})
    out = Path(cfg.output)
    done = (out / AUX_MANIFEST).exists() and read_aux_config(out).get("fingerprint") == fingerprint
    if done:
        log.info("pretrain: %s is up to date (same params, input and code)", out)
    else:
        (out / AUX_MANIFEST).unlink(missing_ok=True)
        sentences = dataset.read_table([S.TEXT])[S.TEXT].to_pylist()
        if not sentences:
            raise PairforgeError(f"pretrain: {cfg.input!r} holds no sentences to train on")
        steps = total_steps(cfg, len(sentences))
        # A checkpoint without an MLM head (MiniLM) gets one initialised from the seed, so that a
        # rerun with the same params gives the same weights.
        tokenizer, model, missing = load_masked_lm(cfg.model, seed=cfg.seed, key="pretrain.model")
        initialised = any(key.endswith("dense.weight") for key in missing)
        layers = model.config.num_hidden_layers
        if cfg.lower_layers > layers:
            raise ConfigError(
                f"pretrain.lower_layers: {cfg.lower_layers} is invalid: {cfg.model!r} has "
                f"{layers} layers"
            )
        if initialised:
            log.warning(
                "pretrain: %s has no MLM head; a newly initialised one is trained (shared by both "
                "MLM losses)",
                cfg.model,
            )
        settings = PretrainSettings.of(cfg, steps)
        meta = {
            "fingerprint": fingerprint,
            "model": cfg.model,
            "input": cfg.input,
            "sentences": len(sentences),
            "mlm_head_initialised": initialised,
        }
        pretrain(
            model, tokenizer, sentences, out, settings, fingerprint, meta,
            device=pick_device(cfg.device), progress=progress,
        )  # fmt: skip
    aux = read_aux_config(out)
    history = read_history(out)
    metrics = run.finish(_metrics(aux, history))
    _write_plots(history, Path(cfg.plot_data), Path(cfg.figure))
    log.info(
        "pretrain: %d steps over %d sentences (%.2f epochs) in %.0fs; MLM loss %.3f -> %.3f, "
        "auxiliary MLM loss %.3f -> %.3f (accuracy %.3f); wrote %s",
        metrics["steps"],
        metrics["sentences"],
        metrics["epochs"],
        metrics["seconds"],
        metrics["mlm_first"],
        metrics["mlm_last"],
        metrics["aux_mlm_first"],
        metrics["aux_mlm_last"],
        metrics["aux_mlm_accuracy_last"],
        out,
    )
    return metrics


def _mean(rows: list[dict[str, float]], key: str) -> float:
    return round(sum(row[key] for row in rows) / len(rows), 4)


def _metrics(aux: dict, history: list[dict[str, float]]) -> dict:
    settings = aux["settings"]
    first, last = history[:SMOOTHING], history[-SMOOTHING:]
    steps = len(history)
    return {
        "steps": steps,
        "resumed_from": aux.get("resumed_from", 0),
        "sentences": aux["sentences"],
        "epochs": round(steps * settings["batch_size"] / max(1, aux["sentences"]), 4),
        "seconds": aux.get("seconds", 0.0),
        "lower_layers": aux["lower_layers"],
        "head_layers": aux["head_layers"],
        "backbone_trained": settings["train_backbone"],
        "mlm_head_initialised": aux["mlm_head_initialised"],
        **{
            f"{key}_{where}": _mean(rows, key)
            for key in ("loss", "mlm", "aux_mlm", "mlm_accuracy", "aux_mlm_accuracy")
            for where, rows in (("first", first), ("last", last))
        },
    }


def _write_plots(history: list[dict[str, float]], data: Path, figure: Path) -> None:
    """The per-step losses as DVC plot data (CSV) and as a PNG with moving averages."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = ("step", "loss", "mlm", "aux_mlm", "aux_mlm_accuracy", "lr")
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(keys)
    writer.writerows([row[key] for key in keys] for row in history)
    data.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(data, buffer.getvalue().encode())

    fig = pretrain_figure(history)
    figure.parent.mkdir(parents=True, exist_ok=True)
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    atomic_write_bytes(figure, png.getvalue())


def pretrain_figure(history: list[dict[str, float]]):
    """Both MLM losses per step (faint) and their moving means; a matplotlib Figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    steps = [row["step"] for row in history]
    fig, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    for key, label in (("mlm", "encoder MLM (eq. 4)"), ("aux_mlm", "auxiliary MLM (eq. 5)")):
        values = [row[key] for row in history]
        line = ax.plot(steps, values, alpha=0.3, lw=1, label=f"{label}, per step")[0]
        window = min(SMOOTHING, len(values))
        smooth = [
            sum(values[max(0, i - window + 1) : i + 1]) / (i - max(0, i - window + 1) + 1)
            for i in range(len(values))
        ]
        ax.plot(steps, smooth, color=line.get_color(), lw=1.8, label=f"{label}, {window}-step mean")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("masked-token cross-entropy")
    ax.set_title("InfoCSE auxiliary network pre-training", fontsize=11)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


@stage_command(STAGE, names={"train_backbone": ("--train-backbone/--freeze-backbone",)})
def command(cfg: PretrainConfig, progress: bool) -> None:
    """Pre-train InfoCSE's auxiliary MLM network on the sentences (resumable).

    Every option defaults to the key of the same name in the `pretrain` section of params.yaml.
    The `train` stage uses the result through the InfoCSE option `aux_path`.
    """
    run(cfg, progress=progress)
