"""The training loop: one objective, one encoder, a streamed pairs dataset, resumable exactly.

One optimiser step per global batch: the stream's next ``batch_size`` rows (this rank's slice
under DDP), tokenised by the objective, the objective's loss under autocast (bf16/fp16 on a GPU),
back-propagation, gradient clipping, AdamW, the schedule, then the objective's
``after_optimizer_step`` (BSL's EMA). Every ``eval_every`` steps the encoder is scored on the dev
tasks with the objective's evaluation pooling, and a better score exports it to
``<out>/best/step-N`` (a sentence-transformers folder). Every ``save_every`` steps a checkpoint
holds everything needed to continue (``train/checkpoint.py``). At the end the best export (the
last one without dev evaluation) becomes ``<out>/model`` and the checkpoints are removed.

Output folder ``<out>`` (``models/<objective>``): ``model/`` (the result), ``history.json``
(per-log-interval loss, learning rate, throughput; dev scores), while running also
``checkpoints/`` and ``best/``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pairforge.pipeline.plumbing.errors import ConfigError, PairforgeError
from pairforge.pipeline.plumbing.files import atomic_write_json
from pairforge.pipeline.plumbing.progress import _fmt_duration
from pairforge.pipeline.plumbing.storage import dataset_path
from pairforge.pipeline.science import sts
from pairforge.pipeline.science.models import (
    EXPORT_INFO,
    SentenceEncoder,
    describe_model,
    hub_kwargs,
    load_masked_lm,
    mlm_head_of,
    pick_device,
    resolve_model,
)
from pairforge.train import distributed as dist
from pairforge.train.card import write_model_card
from pairforge.train.checkpoint import (
    CHECKPOINTS,
    CheckpointStore,
    rng_state,
    seed_everything,
    set_rng_state,
)
from pairforge.train.data import Collator, PairsSource, RowStream
from pairforge.train.export import export_model
from pairforge.train.objectives import OBJECTIVES, check_columns
from pairforge.train.objectives.base import BuildContext, Objective
from pairforge.train.optim import build_optimizer, build_schedule, warmup_steps
from pairforge.train.runtime import run_settings
from torch import nn

log = logging.getLogger("pairforge")

MODEL = "model"
BEST = "best"
HISTORY = "history.json"
Hook = Callable[["Trainer"], None]


@dataclass(frozen=True)
class TrainSettings:
    """Everything one training run reads: the ``train`` config's keys with the objective's recipe
    applied (``stages/train/stage.py``, ``settings_for``, builds it field by field by name).

    The config (``TrainConfig``) declares every key, its validation and its default; this view
    declares none. It exists because the loop must not import the stage module, and because a run
    is fingerprinted by its own resolved settings only: the config also holds the other
    objectives' recipes, which must not retrain this one when edited. ``max_grad_norm`` is None
    for no clipping (the config's 0); ``options`` are the objective's recipe options.
    """

    objective: str
    model: str
    options: dict[str, Any]
    batch_size: int
    lr: float
    weight_decay: float
    schedule: str
    warmup_steps: int
    warmup_ratio: float
    max_steps: int | None
    epochs: float
    max_length: int
    max_grad_norm: float | None
    precision: str
    device: str
    seed: int
    deterministic: bool
    buffer_size: int
    save_every: int
    keep_checkpoints: int
    eval_every: int
    eval_tasks: tuple[str, ...]
    eval_max_pairs: int | None
    eval_batch_size: int
    sts_dir: str
    demo_dir: str
    log_every: int
    threads: int


class TrainModule(nn.Module):
    """The encoder and the objective as one module, so DDP syncs both and a checkpoint holds both."""

    def __init__(self, encoder: nn.Module, objective: Objective) -> None:
        super().__init__()
        self.encoder = encoder
        self.objective = objective

    def forward(self, batch):
        return self.objective(batch, self.encoder)


def load_model(spec: str, want_mlm_head: bool) -> tuple[Any, nn.Module, nn.Module | None, dict]:
    """(tokenizer, encoder, MLM head or None, report) for the model ``spec``, in train mode.

    With ``want_mlm_head`` the masked-LM variant is loaded and its head returned; the report lists
    the head's weights the checkpoint lacked (initialised, as Hugging Face does, with the output
    layer tied to the word embeddings), which a sentence-transformers checkpoint always does.
    """
    from transformers import AutoModel, AutoTokenizer

    report: dict[str, Any] = {}
    if want_mlm_head:
        tokenizer, model, missing = load_masked_lm(spec)
        encoder, head = model.base_model, mlm_head_of(model, required=True)
        report = {"mlm_head": "initialised" if missing else "pretrained", "initialised": missing}
    else:
        where = resolve_model(spec)
        try:
            tokenizer = AutoTokenizer.from_pretrained(where, **hub_kwargs())
            encoder, head = AutoModel.from_pretrained(where, **hub_kwargs()), None
        except OSError as exc:
            raise ConfigError(f"model {spec!r} could not be loaded from {where!r}: {exc}") from None
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(f"model {spec!r}: training needs a fast (Rust) tokenizer")
    encoder.train()
    return tokenizer, encoder, head, report


def _base_max_seq_length(spec: str) -> int | None:
    """The base model's sentence-transformers ``max_seq_length``, kept by the export."""
    config = Path(resolve_model(spec)) / "sentence_bert_config.json"
    if config.exists():
        return json.loads(config.read_text()).get("max_seq_length")
    return None


def start_model_vectors(spec: str) -> dict[str, Any]:
    """How the start model ``spec`` makes its sentence vectors, when its folder says so.

    ``pooling``: from its sentence-transformers Pooling module or its ``pairforge.json``, else
    ``None`` (a plain Hugging Face model declares none); ``normalize``: a ``Normalize`` module;
    ``from``: which of the two said it.
    """
    described = describe_model(spec)
    declared = described["from"] in ("sentence-transformers", "pairforge export")
    return {
        "pooling": described["pooling"] if declared else None,
        "normalize": bool(described.get("normalize", False)),
        "from": described["from"] if declared else None,
    }


def _autocast_dtype(precision: str, device: str) -> torch.dtype | None:
    if precision == "fp32" or (precision == "auto" and not device.startswith("cuda")):
        return None
    if precision == "auto":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if precision in ("bf16", "fp16"):
        return torch.bfloat16 if precision == "bf16" else torch.float16
    raise ConfigError(f"precision {precision!r}: allowed auto, fp32, bf16, fp16")


class Trainer:
    """Trains ``settings.objective`` on the pairs dataset ``data`` into ``out``.

    ``fingerprint`` identifies the run (params, data, model, code): checkpoints of another
    fingerprint are discarded, and a finished ``out/model`` of the same one is kept without
    training again. ``hooks`` maps ``"step"`` (after each optimiser step) and ``"checkpoint"``
    (after each checkpoint) to callables receiving the trainer.
    """

    def __init__(
        self,
        settings: TrainSettings,
        data: str | Path,
        out: str | Path,
        fingerprint: str,
        progress: bool = True,
        hooks: dict[str, Hook] | None = None,
    ) -> None:
        self.settings = settings
        self.data = dataset_path(data)  # a local folder or a store's URL
        self.out = Path(out)
        self.fingerprint = fingerprint
        self.progress = progress
        self.hooks = hooks or {}
        self.label = f"train/{settings.objective}"
        self.step = 0
        self.history: list[dict[str, Any]] = []
        self.dev_history: list[dict[str, Any]] = []
        self.best: dict[str, Any] = {"score": None, "step": None}

    # --- set-up ---------------------------------------------------------------------------

    def _finished(self) -> dict[str, Any] | None:
        info_file = self.out / MODEL / EXPORT_INFO
        history_file = self.out / HISTORY
        if not (info_file.exists() and history_file.exists()):
            return None
        info = json.loads(info_file.read_text())
        if info.get("fingerprint") != self.fingerprint:
            return None
        return json.loads(history_file.read_text())

    def _remove_leftovers(self) -> None:
        """Remove what a kill after the run's last file (``history.json``) left behind: the
        checkpoints and the best export's folder, which the finished run removes next. They are
        cleared after that file, never before: without it a rerun resumes from them."""
        shutil.rmtree(self.out / CHECKPOINTS, ignore_errors=True)
        shutil.rmtree(self.out / BEST, ignore_errors=True)

    def _setup(self) -> None:
        s = self.settings
        if s.objective not in OBJECTIVES:
            raise ConfigError(
                f"train: unknown objective {s.objective!r}; known: {', '.join(sorted(OBJECTIVES))}"
            )
        self.objective_cls = OBJECTIVES[s.objective]
        self.source = PairsSource(self.data)
        try:
            check_columns(s.objective, self.source.available)
        except ValueError as exc:
            raise PairforgeError(
                f"train: {exc}; the `sample` stage writes them into {str(self.data)!r}"
            ) from None
        self.source.select(self.objective_cls.columns)
        self.device = dist.local_device(pick_device(s.device))
        dist.init_from_env(self.device)
        self.world = dist.world_size()
        if s.batch_size % self.world:
            raise ConfigError(
                f"train.batch_size ({s.batch_size}) must be a multiple of the {self.world} processes"
            )
        seed_everything(s.seed + dist.rank())
        tokenizer, encoder, head, self.load_report = load_model(
            s.model, self.objective_cls.wants_mlm_head()
        )
        if self.load_report.get("mlm_head") == "initialised":
            log.warning(
                "%s: %s has no pretrained MLM head; initialised %s (the decoder's output layer, "
                "its vocabulary projection tied to the word embeddings)",
                self.label,
                s.model,
                ", ".join(self.load_report["initialised"]),
            )
        self.tokenizer = tokenizer
        self.start = start_model_vectors(s.model)
        context = BuildContext(encoder, tokenizer, head, start_pooling=self.start["pooling"])
        try:
            objective = self.objective_cls.build(context, s.options)
        except ValueError as exc:
            raise ConfigError(f"train.recipes.{s.objective}.options: {exc}") from None
        self._log_pooling_change(objective)
        self.module = TrainModule(encoder, objective).to(self.device)
        if dist.is_distributed() and self.device.startswith("cuda"):
            self.module = nn.SyncBatchNorm.convert_sync_batchnorm(self.module)
        self.encoder, self.objective = self.module.encoder, self.module.objective
        self.total = s.max_steps or max(1, math.ceil(s.epochs * self.source.rows / s.batch_size))
        self.optimizer = build_optimizer([self.encoder, self.objective], s.lr, s.weight_decay)
        self.warmup = warmup_steps(self.total, s.warmup_steps, s.warmup_ratio)
        self.scheduler = build_schedule(self.optimizer, self.total, self.warmup, s.schedule)
        self.autocast = _autocast_dtype(s.precision, self.device)
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.autocast == torch.float16)
        self.stream = RowStream(self.source, s.buffer_size, s.seed)
        self.collate = Collator(
            objective,
            tokenizer,
            self.objective_cls.columns,
            self.source.kinds,
            s.max_length,
            s.seed,
        )
        self.model_for_step: nn.Module = self.module
        if dist.is_distributed():
            self.model_for_step = nn.parallel.DistributedDataParallel(
                self.module,
                device_ids=[int(self.device.split(":")[1])]
                if self.device.startswith("cuda")
                else None,
                # Parts of a pretrained model an objective does not use (BERT's pooler) get no grad.
                find_unused_parameters=True,
            )
        self.store = CheckpointStore(self.out, self.fingerprint, s.keep_checkpoints)
        self.dev = self._load_dev() if s.eval_every > 0 else {}

    def _log_pooling_change(self, objective: Objective) -> None:
        """One warning when the pooling trained is not the start model's own."""
        start = self.start["pooling"]
        if start is None or objective.pooling == start or not dist.is_main():
            return
        option = self.settings.options.get("pooling")
        if option is not None:
            why = f"the recipe's option pooling: {option}"
        elif objective.pooling == "mask":
            why = "the objective's prompt pooling, part of its method"
        else:
            why = "the objective's default"
        log.warning(
            "%s: trains and exports %s pooling (%s), not the start model's %s pooling (its %s "
            "config); the STS scores of the two are then not like for like",
            self.label,
            objective.pooling,
            why,
            start,
            self.start["from"],
        )

    def _load_dev(self) -> dict[str, sts.STSData]:
        s = self.settings
        if not s.sts_dir and any(task not in sts.DEMO_TASKS for task in s.eval_tasks):
            raise ConfigError("train: eval_every > 0 needs sts_dir (the STS data folder)")
        folders = {task: sts.task_folder(task, s.sts_dir, s.demo_dir) for task in s.eval_tasks}
        if dist.is_main():
            # Said once, after the checks that fail a run, so that a failure stays one line.
            where = ", ".join(f"{sts.LABELS.get(t, t)} ({folder})" for t, folder in folders.items())
            if s.sts_dir and sts.find_data_folder(s.sts_dir) is None:
                missing = os.path.expandvars(s.sts_dir)
                log.info("%s: no STS data at %s; dev sets: %s", self.label, missing, where)
            else:
                log.info("%s: dev sets: %s", self.label, where)
        return {
            task: sts.subsample(sts.load_task(folder, task), s.eval_max_pairs, seed=0)
            for task, folder in folders.items()
        }

    # --- state ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        rngs = rng_state()
        if dist.is_distributed():
            gathered: list[Any] = [None] * self.world
            torch.distributed.all_gather_object(gathered, rngs)
            rngs = gathered
        else:
            rngs = [rngs]
        return {
            "step": self.step,
            "module": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "stream": self.stream.state_dict(),
            "rng": rngs,
            "best": dict(self.best),
            "history": list(self.history),
            "dev_history": list(self.dev_history),
            "world_size": self.world,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["world_size"] != self.world:
            raise PairforgeError(
                f"{self.label}: the checkpoint was written by {state['world_size']} processes, "
                f"this run has {self.world}; resume with the same number"
            )
        self.module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.stream.load_state_dict(state["stream"])
        set_rng_state(state["rng"][dist.rank()])
        self.step = int(state["step"])
        self.best = dict(state["best"])
        self.history = list(state["history"])
        self.dev_history = list(state["dev_history"])

    def _resume(self) -> None:
        resumable = self.store.prepare() if dist.is_main() else False
        resumable = dist.broadcast_object(resumable)
        latest = dist.broadcast_object(self.store.latest() if resumable else None)
        best_dir = self.out / BEST
        if latest is None:
            if dist.is_main():
                shutil.rmtree(best_dir, ignore_errors=True)
            return
        # Loaded on the CPU: generator states must stay CPU tensors; load_state_dict moves the
        # weights and the optimiser's state to their parameters' device.
        self.load_state_dict(self.store.load(latest, "cpu"))
        if dist.is_main() and best_dir.exists():
            # Exports newer than the checkpoint are redone (identically) by the resumed run.
            for child in best_dir.iterdir():
                if child.name != f"step-{self.best['step']}":
                    shutil.rmtree(child, ignore_errors=True)
        log.info(
            "%s: resuming at step %d of %d from %s",
            self.label,
            self.step,
            self.total,
            self.store.path(latest),
        )

    # --- the loop -------------------------------------------------------------------------

    def train_step(self, rows: list[tuple]) -> dict[str, float]:
        s = self.settings
        per_rank = s.batch_size // self.world
        part = slice(dist.rank() * per_rank, (dist.rank() + 1) * per_rank)
        batch = self.collate(rows, self.step, part)
        tokens = sum(
            int(f["attention_mask"].sum()) for f in batch.values() if "attention_mask" in f
        )
        batch = {c: {k: v.to(self.device) for k, v in f.items()} for c, f in batch.items()}
        self.module.train()
        with torch.autocast(
            torch.device(self.device).type,
            dtype=self.autocast or torch.float32,
            enabled=self.autocast is not None,
        ):
            out = self.model_for_step(batch)
        loss = out["loss"]
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        grad_norm = loss.new_full((), float("nan"))
        if s.max_grad_norm:
            grad_norm = torch.nn.utils.clip_grad_norm_(
                [p for g in self.optimizer.param_groups for p in g["params"]], s.max_grad_norm
            )
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.objective.after_optimizer_step(self.encoder)
        self.step += 1
        # Logged values stay on the device until a log line needs them: no sync per step.
        names = [k for k, v in out.items() if v.dim() == 0]
        values = torch.stack([out[k].detach().float() for k in names] + [grad_norm.float()])
        if dist.is_distributed():
            # The global batch's values: each rank's loss is the mean over its rows.
            counted = torch.cat([values, values.new_tensor([float(tokens)])])
            torch.distributed.all_reduce(counted)
            values, tokens = counted[:-1] / self.world, int(counted[-1])
        return {"names": [*names, "grad_norm"], "values": values, "tokens": tokens}

    def _window_record(self, window: list[dict[str, Any]]) -> dict[str, float]:
        """Means over a log window of the step values; a non-finite loss is an error."""
        names = window[0]["names"]
        stacked = torch.stack([w["values"] for w in window]).cpu()  # (steps, values)
        loss = stacked[:, names.index("loss")]
        bad = (~torch.isfinite(loss)).nonzero()
        if len(bad):
            index = int(bad[0])
            raise PairforgeError(
                f"{self.label}: the loss is {float(loss[index])} at step "
                f"{self.step - len(window) + 1 + index}; lower the learning rate or check the data"
            )
        means = stacked.nanmean(dim=0) if stacked.numel() else stacked
        return {
            name: float(means[j]) for j, name in enumerate(names) if not bool(torch.isnan(means[j]))
        }

    def embedder(self) -> SentenceEncoder:
        """The evaluator's encoder over the model being trained (its mode restored after)."""
        s = self.settings
        return SentenceEncoder(
            self.encoder,
            self.tokenizer,
            self.objective.pooling,
            prompt=self.objective.prompt,
            sentence_tokens=s.max_length,
            batch_size=s.eval_batch_size,
            normalize=self.start["normalize"],
            order="chars",
            autocast_dtype=self.autocast,
        )

    def evaluate_dev(self) -> dict[str, Any]:
        """Dev Spearman x100 per task and their mean (``score``), with the evaluation pooling."""
        started = time.monotonic()
        result = sts.evaluate(
            self.embedder(),
            "",  # the dev tasks are loaded once, in _setup
            self.settings.eval_tasks,
            align_uniform=False,
            data=self.dev,
        )
        scores = {task: r["spearman"] for task, r in result["tasks"].items()}
        return {
            "step": self.step,
            "score": float(np.mean(list(scores.values()))),
            **scores,
            "seconds": time.monotonic() - started,
        }

    def export(self, folder: Path, dev: dict[str, Any] | None) -> None:
        s = self.settings
        info = {
            "objective": s.objective,
            "options": s.options,
            "base_model": s.model,
            "step": self.step,
            "dev": dev,
            "data": {"path": str(self.data), "rows": self.source.rows},
            "fingerprint": self.fingerprint,
            "settings": asdict(s),
            "load_report": self.load_report,
            "start_pooling": self.start["pooling"],
        }
        export_model(
            folder,
            self.encoder,
            self.tokenizer,
            self.objective.pooling,
            prompt=self.objective.prompt,
            max_sentence_tokens=s.max_length,
            max_seq_length=_base_max_seq_length(s.model),
            info=info,
            normalize=self.start["normalize"],
        )

    def _call(self, event: str) -> None:
        hook = self.hooks.get(event)
        if hook is not None:
            hook(self)

    def run(self) -> dict[str, Any]:
        """Train to the end (or resume and finish); returns the run's summary and history.

        Process-wide settings changed for the run (threads, deterministic kernels, on a CPU the
        retention of freed host memory: ``train/runtime.py``) are restored when it returns.
        """
        s = self.settings
        on_cpu = pick_device(s.device).startswith("cpu")
        with run_settings(s.threads, s.deterministic, keep_memory=on_cpu, cuda=not on_cpu):
            return self._run()

    def _run(self) -> dict[str, Any]:
        finished = self._finished() if dist.is_main() else None
        if dist.broadcast_object(finished is not None):
            if dist.is_main():
                self._remove_leftovers()
            log.info(
                "%s: %s is up to date (same fingerprint); not training again",
                self.label,
                self.out / MODEL,
            )
            return finished
        self._setup()
        self._resume()
        s = self.settings
        started = time.monotonic()
        first_step = self.step
        window: list[dict[str, float]] = []
        window_start, window_rows = time.monotonic(), 0
        while self.step < self.total:
            rows = self.stream.take(s.batch_size)
            parts = self.train_step(rows)
            window.append(parts)
            window_rows += len(rows)
            self._call("step")
            if self.step % s.log_every == 0 or self.step == self.total:
                elapsed = time.monotonic() - window_start
                record = {
                    "step": self.step,
                    "epoch": self.stream.epoch,
                    "lr": self.scheduler.get_last_lr()[0],
                    "rows_per_s": window_rows / max(elapsed, 1e-9),
                    "tokens_per_s": sum(p["tokens"] for p in window) / max(elapsed, 1e-9),
                    **self._window_record(window),
                }
                self.history.append(record)
                done = self.step - first_step
                eta = (self.total - self.step) * (time.monotonic() - started) / max(done, 1)
                log.log(
                    logging.INFO if self.progress else logging.DEBUG,
                    "%s: step %d/%d (%d%%) loss %.4f lr %.3g %.1f rows/s ETA %s",
                    self.label,
                    self.step,
                    self.total,
                    100 * self.step // self.total,
                    record["loss"],
                    record["lr"],
                    record["rows_per_s"],
                    _fmt_duration(eta),
                )
                window, window_start, window_rows = [], time.monotonic(), 0
            evaluate = s.eval_every > 0 and (
                self.step % s.eval_every == 0 or self.step == self.total
            )
            if evaluate:
                self._dev_step()
            if self.step % s.save_every == 0 or self.step == self.total:
                if window:
                    self._window_record(window)  # never checkpoint weights a NaN step wrote
                state = self.state_dict()
                if dist.is_main():
                    self.store.save(self.step, state)
                dist.barrier()
                self._call("checkpoint")
        return self._finish(time.monotonic() - started, first_step)

    def _dev_step(self) -> None:
        improved = False
        if dist.is_main():
            dev = self.evaluate_dev()
            self.dev_history.append(dev)
            improved = self.best["score"] is None or dev["score"] > self.best["score"]
            log.info(
                "%s: dev at step %d: %s (mean %.2f; best %.2f at step %s)%s",
                self.label,
                self.step,
                ", ".join(f"{sts.LABELS.get(t, t)} {dev[t]:.2f}" for t in self.settings.eval_tasks),
                dev["score"],
                max(dev["score"], self.best["score"] or dev["score"]),
                self.step if improved else self.best["step"],
                " new best" if improved else "",
            )
            if improved:
                previous = self.best["step"]
                self.best = {
                    "score": dev["score"],
                    "step": self.step,
                    **{t: dev[t] for t in self.settings.eval_tasks},
                }
                self.export(self.out / BEST / f"step-{self.step}", dev)
                if previous is not None:
                    shutil.rmtree(self.out / BEST / f"step-{previous}", ignore_errors=True)
        self.best = dist.broadcast_object(self.best)
        dist.barrier()

    def _is_best_export(self, folder: Path) -> bool:
        """True if ``folder`` already holds this run's best export (a kill after moving it)."""
        info_file = folder / EXPORT_INFO
        if not info_file.exists():
            return False
        info = json.loads(info_file.read_text())
        return info.get("fingerprint") == self.fingerprint and info.get("step") == self.best["step"]

    def _finish(self, seconds: float, first_step: int) -> dict[str, Any]:
        summary: dict[str, Any] = {}
        if dist.is_main():
            model = self.out / MODEL
            best = self.out / BEST / f"step-{self.best['step']}"
            if self.best["step"] is None:
                self.export(model, None)
            elif best.exists():
                if model.exists():
                    shutil.rmtree(model)
                os.replace(best, model)
            elif not self._is_best_export(model):
                raise PairforgeError(
                    f"{self.label}: the best export (step {self.best['step']}) is missing from "
                    f"{self.out}; delete the folder and train again"
                )
            # The export's card was written for its checkpoint; the finished run knows the steps
            # run and the whole dev curve.
            write_model_card(
                model, {"steps": self.total, "best": self.best, "dev_history": self.dev_history}
            )
            trained = self.step - first_step
            summary = {
                "objective": self.settings.objective,
                "base_model": self.settings.model,
                "steps": self.total,
                "steps_this_run": trained,
                "seconds_this_run": round(seconds, 3),
                "rows_per_s": (trained * self.settings.batch_size / seconds)
                if seconds > 0 and trained
                else None,
                "batch_size": self.settings.batch_size,
                "world_size": self.world,
                "epochs_seen": self.stream.epoch + 1,
                "rows_used": self.stream.rows_used,
                "rows_skipped": dict(self.stream.skipped),
                "final_loss": self.history[-1]["loss"] if self.history else None,
                "best": self.best,
                "load_report": self.load_report,
                "model": str(model),
                "pooling": self.objective.pooling,
                "start_pooling": self.start["pooling"],
                "device": self.device,
                "device_name": torch.cuda.get_device_name(self.device)
                if self.device.startswith("cuda")
                else None,
                "autocast": None if self.autocast is None else str(self.autocast).split(".")[-1],
            }
            record = {"summary": summary, "history": self.history, "dev_history": self.dev_history}
            atomic_write_json(self.out / HISTORY, record)
            self.store.clear()
            shutil.rmtree(self.out / BEST, ignore_errors=True)
            log.info(
                "%s: done, %d steps (%d this run) in %s, %.1f rows/s; best dev %s at step %s; model in %s",
                self.label,
                self.total,
                trained,
                _fmt_duration(seconds),
                summary["rows_per_s"] or 0.0,
                "n/a" if self.best["score"] is None else f"{self.best['score']:.2f}",
                self.best["step"],
                model,
            )
        dist.barrier()
        return {"summary": summary, "history": self.history, "dev_history": self.dev_history}


@contextlib.contextmanager
def quiet_transformers():
    """Hide Hugging Face's per-load progress bars (weights, shards): we log our own progress."""
    try:
        from transformers.utils import logging as hf_logging

        enabled = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        yield
        return
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()
