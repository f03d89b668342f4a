"""evaluate: trained encoders and the encoder they started from on the 7 STS tasks and the
demo evaluation set.

STS12-16 (SentEval's "all" aggregation, SimCSE's convention), STS-B test and SICK-R test:
Spearman x100 between the cosine similarity of the two sentences' vectors and the gold scores,
pairs without a gold score dropped (``pipeline/science/sts.py``). Alignment (STS-B test pairs with gold > 4)
and uniformity (all STS-B test sentences) beside them; without the STS data, over the demo test
split instead.

The demo evaluation set (``demo_test``, ``data/demo/eval``, see its README) ships with the
project; the STS data cannot. With ``sts_missing: skip`` (the demo profile) an absent STS folder
is said once, with the command that fetches it, and the other tasks are scored; with ``error``
(the default, the paper profile) the stage stops with that command.

Each model is encoded as it is meant to be used: an exported model with the pooling of its
objective (``pairforge.json``), a sentence-transformers folder with its own Pooling module, a
plain Hugging Face model with ``cls_before_pooler`` unless ``baseline_poolings`` says otherwise.

Data: ``data`` is a folder in the layout of ``shared/data/sts`` (SentEval's processed files). To
get it: ``git clone https://github.com/facebookresearch/SentEval && cd SentEval/data/downstream &&
bash get_transfer_data.bash``, then copy ``STS/STS1{2..6}-en-test/STS.{input,gs}.*.txt`` to
``<data>/sts1{2..6}/``, ``STS/STSBenchmark/sts-{dev,test}.csv`` to ``<data>/stsb/`` and
``SICK/SICK_{trial,test_annotated}.txt`` to ``<data>/sickr/``.

Outputs: ``metrics/evaluate.json`` (every score, per-subset breakdowns included), a markdown table
(``reports/evaluate.md``) and an alignment-uniformity PNG.
"""

from __future__ import annotations

import glob
import logging
import os
import time
from pathlib import Path
from typing import Any, Literal

from pairforge.pipeline.plumbing.config import OptionalModelSpec, StageConfig
from pairforge.pipeline.plumbing.errors import ConfigError
from pairforge.pipeline.plumbing.files import atomic_write_bytes
from pairforge.pipeline.plumbing.stagedefs import StageDef
from pairforge.pipeline.plumbing.stagerun import StageRun
from pairforge.pipeline.science.models.pooling import DEFAULT_PROMPT
from pairforge.stages.options import stage_command
from pydantic import Field

log = logging.getLogger("pairforge")

TEST_TASKS = ["sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr"]


class EvaluateConfig(StageConfig):
    """The ``evaluate`` section of params.yaml."""

    data: str = Field(
        "$PAIRFORGE_SHARED_DATA/sts", description="STS data folder (SentEval layout); $VARS expand"
    )
    models: list[str] = Field(
        ["models/*/model"],
        description="model folders or specs; globs match exported folders (on the command line: repeat -m)",
    )
    baseline: OptionalModelSpec = Field(
        "bert-base-uncased", description="the encoder training started from"
    )
    baseline_poolings: list[str] = Field(
        ["auto"], min_length=1, description="auto: as the folder says"
    )
    baseline_prompt: str = Field(DEFAULT_PROMPT, description="template for mask pooling")
    tasks: list[str] = Field(
        TEST_TASKS,
        min_length=1,
        description="tasks to run: sts12..sts16, stsb, sickr, stsb_dev, sickr_dev, demo_test (on "
        "the command line: repeat -t)",
    )
    demo_data: str = Field(
        "data/demo/eval", description="the demo evaluation set's folder (demo_dev, demo_test)"
    )
    sts_missing: Literal["error", "skip"] = Field(
        "error",
        description="an absent STS folder: error stops with the command that fetches the data; "
        "skip scores the other tasks and says so once",
    )
    max_pairs: int | None = Field(
        None, ge=1, description="pairs per task (seeded sample); null: all"
    )
    seed: int = Field(0, description="seed of the pairs sampled under max_pairs")
    batch_size: int = Field(128, ge=1, description="sentences per forward pass")
    max_length: int | None = Field(None, ge=4, description="tokens per sentence; null: the model's")
    device: str = Field("auto", description="auto, cpu, cuda or cuda:N")
    threads: int = Field(-1, ge=-1, description="CPU threads for torch; -1: torch's default")
    metrics: str = Field("metrics/evaluate.json", description="metrics JSON path")
    report: str = Field("reports/evaluate.md", description="markdown report path")
    plot: str = Field("reports/evaluate.png", description="alignment and uniformity figure (PNG)")


STAGE = StageDef(
    name="evaluate",
    module=__name__,
    config=EvaluateConfig,
    inputs=("${train.output}/${train.objective}", "${evaluate.demo_data}"),
    outputs=("metrics", "report", "plot"),
    free=("batch_size", "device", "threads"),
    outs={
        "${evaluate.metrics}": {"cache": False},
        "${evaluate.report}": {"cache": False},
    },
    plots={
        "${evaluate.plot}": {"cache": False},
    },
    headlines={"sts_avg": "models.*.avg"},
)


def _label(path: str, described: dict[str, Any]) -> str:
    info = described.get("info") or {}
    return info.get("objective") or Path(path).parent.name or path


def expand_models(specs: list[str]) -> list[str]:
    """``specs`` with glob patterns replaced by the exported model folders they match, sorted.

    A pattern that matches no folder holding ``pairforge.json`` is a ConfigError.
    """
    from pairforge.pipeline.science.models import EXPORT_INFO

    out: list[str] = []
    for spec in specs:
        if not any(ch in spec for ch in "*?["):
            out.append(spec)
            continue
        found = sorted(p for p in glob.glob(spec) if (Path(p) / EXPORT_INFO).exists())
        if not found:
            raise ConfigError(
                f"evaluate.models: {spec!r} matches no trained model (train one: `pairforge train`)"
            )
        out.extend(found)
    return out


def _check_local(spec: str) -> None:
    looks_local = spec.startswith((".", "/", "~")) or spec.count("/") > 1
    if looks_local and not Path(spec).expanduser().exists():
        raise ConfigError(f"evaluate: model {spec!r} not found (train it first: `pairforge train`)")


def load_sets(cfg: EvaluateConfig) -> tuple[dict, Path | None, list[str]]:
    """Every task of ``cfg.tasks`` that can be scored, loaded whole: ``(sets, STS folder or
    None, tasks skipped)``.

    STS tasks need the STS folder ``cfg.data``; when it is absent they are skipped with one log
    line naming the command that fetches it (``sts_missing: skip``, and another task is left to
    score) or the stage stops with that command (a ConfigError). A missing or malformed file is
    a PairforgeError naming it, before any model is loaded.
    """
    from pairforge.pipeline.science import sts

    unknown = [t for t in cfg.tasks if t not in sts.TASKS]
    if unknown:
        raise ConfigError(f"evaluate.tasks: unknown {unknown}; tasks: {', '.join(sts.TASKS)}")
    wanted = [t for t in cfg.tasks if t not in sts.DEMO_TASKS]
    folder = sts.find_data_folder(cfg.data) if wanted else None
    skipped: list[str] = []
    if wanted and folder is None:
        if cfg.sts_missing == "error" or len(wanted) == len(cfg.tasks):
            sts.data_folder(cfg.data)  # raises: the folder, and how to get the data
        skipped = wanted
        log.warning(
            "evaluate: no STS data at %s, so %s are not scored (only %s); to score them, %s",
            os.path.expandvars(cfg.data),
            ", ".join(sts.LABELS[t] for t in skipped),
            ", ".join(sts.LABELS[t] for t in cfg.tasks if t not in skipped),
            sts.DOWNLOAD,
        )
    sets = {
        task: sts.load_task(sts.task_folder(task, folder, cfg.demo_data), task)
        for task in cfg.tasks
        if task not in skipped
    }
    return sets, folder, skipped


def align_task_for(sets: dict, folder: Path | None) -> str | None:
    """The set alignment and uniformity are measured on: STS-B test (SimCSE's) when the STS
    data is there, else the demo test split when it is scored, else none."""
    if folder is not None:
        return "stsb"
    return "demo_test" if "demo_test" in sets else None


def evaluate_model(
    cfg: EvaluateConfig,
    spec: str,
    pooling: str = "auto",
    prompt: str | None = None,
    sets: dict | None = None,
    progress: bool = False,
    label: str | None = None,
    folder: Path | None = None,
) -> dict:
    """Scores of one model on ``sets`` (default: ``load_sets(cfg)``; see pipeline.science.sts.evaluate),
    with how it was encoded."""
    from pairforge.pipeline.science import sts
    from pairforge.pipeline.science.models import load_sentence_encoder, pick_device

    _check_local(spec)
    if sets is None:
        sets, folder, _ = load_sets(cfg)
    embedder, described = load_sentence_encoder(
        spec,
        pooling=pooling,
        prompt=prompt,
        device=pick_device(cfg.device),
        batch_size=cfg.batch_size,
        max_length=cfg.max_length,
    )
    if progress:
        embedder.label = f"evaluate/{label or spec}"
    started = time.monotonic()
    align_task = align_task_for(sets, folder)
    result = sts.evaluate(
        embedder,
        folder or "",
        list(sets),
        max_pairs=cfg.max_pairs,
        seed=cfg.seed,
        align_uniform=align_task is not None,
        data=sets,
        align_task=align_task or "stsb",
    )
    seconds = time.monotonic() - started
    # The average is the STS average wherever STS tasks were scored, comparable with published
    # figures; the demo set, small and in-domain, stands beside it and enters it only alone.
    sts_scores = [r["spearman"] for t, r in result["tasks"].items() if t not in sts.DEMO_TASKS]
    if sts_scores:
        result["avg"] = sum(sts_scores) / len(sts_scores)
    info = described.get("info") or {}
    result.update(
        model=spec,
        pooling=described["pooling"],
        pooling_from=described["from"],
        seconds=round(seconds, 3),
        sentences_per_s=result["sentences_embedded"] / seconds if seconds > 0 else None,
        trained={k: info.get(k) for k in ("objective", "base_model", "step", "dev")}
        if info
        else None,
    )
    return result


def run(cfg: EvaluateConfig, progress: bool = True) -> dict:
    """Evaluate the baseline and every model; returns the metrics it also writes."""
    import torch
    from pairforge.pipeline.science import sts
    from pairforge.train.loop import quiet_transformers
    from pairforge.train.training_report import plot_align_uniform, sts_table

    sets, folder, skipped = load_sets(cfg)
    tasks = list(sets)
    threads = torch.get_num_threads()
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    results: dict[str, dict] = {}
    jobs: list[tuple[str, str, str, str | None]] = []
    if cfg.baseline:
        for pooling in cfg.baseline_poolings:
            prompt = cfg.baseline_prompt if pooling == "mask" else None
            jobs.append((f"base ({pooling})", cfg.baseline, pooling, prompt))
    for spec in expand_models(cfg.models):
        jobs.append(("", spec, "auto", None))
    try:
        with quiet_transformers():
            for label, spec, pooling, prompt in jobs:
                result = evaluate_model(cfg, spec, pooling, prompt, sets, progress, label, folder)
                if not label:
                    label = _label(spec, {"info": result["trained"]})
                elif pooling == "auto":
                    label = f"base ({result['pooling']})"
                results[label] = result
                log.info(
                    "evaluate: %s (%s, %s pooling): avg %.2f [%s] in %.1fs (%.0f sentences/s)",
                    label, spec, result["pooling"], result["avg"],
                    ", ".join(f"{sts.LABELS[t]} {r['spearman']:.2f}" for t, r in result["tasks"].items()),
                    result["seconds"], result["sentences_per_s"] or 0,
                )  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    scored = next(iter(results.values()), {"tasks": {}})
    metrics = {
        "data": str(folder) if folder is not None else None,
        "demo_data": cfg.demo_data if any(t in sts.DEMO_TASKS for t in tasks) else None,
        "tasks": tasks,
        "skipped": skipped,
        "max_pairs": cfg.max_pairs,
        "pairs": {
            t: {"scored": r["pairs"], "total": r["pairs_total"]} for t, r in scored["tasks"].items()
        },
        "align_task": scored.get("align_task"),
        "models": {
            label: {
                "model": r["model"],
                "pooling": r["pooling"],
                "avg": r["avg"],
                **{t: r["tasks"][t]["spearman"] for t in r["tasks"]},
                **{k: r[k] for k in ("alignment", "uniformity") if k in r},
                "details": {t: r["tasks"][t] for t in r["tasks"]},
                "trained": r["trained"],
                "seconds": r["seconds"],
            }
            for label, r in results.items()
        },
    }
    StageRun(STAGE, cfg).finish(metrics)  # the metrics and their headline
    report = Path(cfg.report)
    report.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(report, _markdown(cfg, results, sts_table(results, tasks), metrics).encode())
    plot_align_uniform(Path(cfg.plot), results, caption=_align_caption(scored))
    log.info("evaluate: %d models on %d tasks; table in %s", len(results), len(tasks), report)
    return metrics


def _align_caption(scored: dict) -> str | None:
    """Which pairs the alignment-uniformity figure measured, and whether they were a sample."""
    from pairforge.pipeline.science import sts

    task = scored.get("align_task")
    if task is None:
        return None
    used, total = scored["align_pairs"], scored["align_pairs_total"]
    how = f"a seeded sample of {used} of {total} pairs" if used < total else f"all {total} pairs"
    return f"{sts.LABELS.get(task, task)}, {how}"


def _markdown(cfg: EvaluateConfig, results: dict[str, dict], table: str, metrics: dict) -> str:
    from pairforge.pipeline.science import sts

    def label(task: str) -> str:
        return sts.LABELS.get(task, task)

    pairs = metrics["pairs"]
    sets = []
    for task in metrics["tasks"]:
        n = pairs.get(task, {})
        count = (
            f"{n['scored']} of {n['total']} pairs"
            if n and n["scored"] < n["total"]
            else f"{n.get('total', '?')} pairs"
        )
        # The configured spec ($PAIRFORGE_SHARED_DATA/sts), not this machine's folder: the report
        # is committed and read on other machines.
        where = metrics["demo_data"] if task in sts.DEMO_TASKS else cfg.data
        sets.append(f"{label(task)} ({count}, `{where}`)")
    lines = [
        "# Evaluation",
        "",
        "Spearman x100 of cosine similarity. Sets scored: " + "; ".join(sets) + ".",
        "",
    ]
    if metrics["skipped"]:
        lines += [
            f"**Not scored: {', '.join(label(t) for t in metrics['skipped'])}**: no STS data at "
            f"`{cfg.data}`. To score them, {sts.DOWNLOAD}.",
            "",
        ]
    if any(t in sts.DEMO_TASKS for t in metrics["tasks"]):
        lines += [
            "The demo set (`data/demo/eval/README.md`) is small, written by one author and "
            "in-domain with the demo corpus: it shows whether training moved the encoder on this "
            "corpus, and its figures are not comparable with STS figures. Avg. is the mean "
            "over the STS tasks scored; the demo set enters it only when it is scored alone.",
            "",
        ]
    if any(t in sts.STS_SUBSETS for t in metrics["tasks"]):
        lines += [
            "STS12-16: SentEval's \"all\" aggregation (one correlation over all subsets' pairs).",
            "",
        ]
    caption = _align_caption(next(iter(results.values()), {}))
    if caption:
        lines += [f"align/uniform (lower is better): {caption}.", ""]
    if cfg.max_pairs and any(n["scored"] < n["total"] for n in pairs.values()):
        lines += [
            f"**Quick check on a seeded sample of at most {cfg.max_pairs} pairs per task: not "
            "comparable with published figures.**",
            "",
        ]
    lines += [table, ""]
    for name, r in results.items():
        trained = r.get("trained")
        if trained:
            dev = trained.get("dev") or {}
            dev_text = f", dev {dev['score']:.2f}" if dev.get("score") is not None else ""
            dev_sets = [label(t) for t in dev if t in sts.TASKS]
            if dev_text and dev_sets:
                dev_text += f" ({', '.join(dev_sets)})"
            lines.append(
                f"- `{name}`: `{r['model']}`, objective `{trained.get('objective')}` from "
                f"`{trained.get('base_model')}`, step {trained.get('step')}{dev_text}, "
                f"`{r['pooling']}` pooling."
            )
        else:
            lines.append(
                f"- `{name}`: `{r['model']}` with `{r['pooling']}` pooling ({r['pooling_from']})."
            )
    return "\n".join(lines) + "\n"


@stage_command(STAGE, names={"models": ("--model", "-m"), "tasks": ("--task", "-t")})
def command(cfg: EvaluateConfig, progress: bool) -> None:
    """Score models on the demo evaluation set and STS12-16, STS-B, SICK-R, beside their base.

    Every option defaults to the key of the same name in the `evaluate` section of params.yaml.
    Without the STS data: clone SentEval and run data/downstream/get_transfer_data.bash (see the
    module docs for the layout); the demo profile then scores its own set (demo_test) alone.
    """
    run(cfg, progress=progress)
