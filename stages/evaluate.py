"""evaluate: trained encoders and the encoder they started from on the 7 STS tasks.

STS12-16 (SentEval's "all" aggregation, SimCSE's convention), STS-B test and SICK-R test:
Spearman x100 between the cosine similarity of the two sentences' vectors and the gold scores,
pairs without a gold score dropped (``train/sts.py``). Alignment (STS-B test pairs with gold > 4)
and uniformity (all STS-B test sentences) beside them.

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
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from pairforge.pipeline.cli_options import ParamsOpt, ProgressOpt, cli_errors
from pairforge.pipeline.config import OptionalModelSpec, StageConfig, stage_config
from pairforge.pipeline.errors import ConfigError
from pairforge.pipeline.shards import atomic_write_bytes, atomic_write_json
from pydantic import Field

log = logging.getLogger("pairforge")

STAGE = "evaluate"
TEST_TASKS = ["sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr"]


class EvaluateConfig(StageConfig):
    """The ``evaluate`` section of params.yaml."""

    data: str = Field(
        "$PAIRFORGE_SHARED_DATA/sts", description="STS data folder (SentEval layout); $VARS expand"
    )
    models: list[str] = Field(
        ["models/*/model"], description="model folders or specs; globs match exported folders"
    )
    baseline: OptionalModelSpec = Field(
        "bert-base-uncased", description="the encoder training started from"
    )
    baseline_poolings: list[str] = Field(
        ["auto"], min_length=1, description="auto: as the folder says"
    )
    baseline_prompt: str = Field('"[X]" means [MASK].', description="template for mask pooling")
    tasks: list[str] = Field(TEST_TASKS, min_length=1)
    max_pairs: int | None = Field(
        None, ge=1, description="pairs per task (seeded sample); null: all"
    )
    seed: int = 0
    batch_size: int = Field(128, ge=1)
    max_length: int | None = Field(None, ge=4, description="tokens per sentence; null: the model's")
    device: str = "auto"
    threads: int = Field(-1, ge=-1, description="CPU threads for torch; -1: torch's default")
    metrics: str = "metrics/evaluate.json"
    report: str = "reports/evaluate.md"
    plot: str = "reports/evaluate.png"


def _label(path: str, described: dict[str, Any]) -> str:
    info = described.get("info") or {}
    return info.get("objective") or Path(path).parent.name or path


def expand_models(specs: list[str]) -> list[str]:
    """``specs`` with glob patterns replaced by the exported model folders they match, sorted.

    A pattern that matches no folder holding ``pairforge.json`` is a ConfigError.
    """
    from pairforge.train.encode import EXPORT_INFO

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


def evaluate_model(
    cfg: EvaluateConfig,
    spec: str,
    pooling: str = "auto",
    prompt: str | None = None,
    data: Path | None = None,
    progress: bool = False,
    label: str | None = None,
) -> dict:
    """Scores of one model on ``cfg.tasks`` (see train.sts.evaluate), with how it was encoded."""
    from pairforge.pipeline.models import pick_device
    from pairforge.train import sts
    from pairforge.train.encode import load_embedder

    _check_local(spec)
    embedder, described = load_embedder(
        spec,
        pooling=pooling,
        prompt=prompt,
        device=pick_device(cfg.device),
        batch_size=cfg.batch_size,
        max_length=cfg.max_length,
    )
    if progress:
        embedder.progress = f"evaluate/{label or spec}"
    started = time.monotonic()
    data = data or sts.data_folder(cfg.data)
    result = sts.evaluate(embedder, data, cfg.tasks, max_pairs=cfg.max_pairs, seed=cfg.seed)
    seconds = time.monotonic() - started
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
    from pairforge.train import sts
    from pairforge.train.loop import quiet_transformers
    from pairforge.train.report import plot_align_uniform, sts_table

    unknown = [t for t in cfg.tasks if t not in sts.TASKS]
    if unknown:
        raise ConfigError(f"evaluate.tasks: unknown {unknown}; tasks: {', '.join(sts.TASKS)}")
    data = sts.data_folder(cfg.data)
    for task in cfg.tasks:  # fail on missing data before any model is loaded
        sts.load_task(data, task)
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
                result = evaluate_model(cfg, spec, pooling, prompt, data, progress, label)
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
    metrics = {
        "data": str(data),
        "tasks": list(cfg.tasks),
        "max_pairs": cfg.max_pairs,
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
    Path(cfg.metrics).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(Path(cfg.metrics), metrics)
    report = Path(cfg.report)
    report.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(
        report, _markdown(cfg, results, sts_table(results, cfg.tasks), data).encode()
    )
    plot_align_uniform(Path(cfg.plot), results)
    log.info("evaluate: %d models on %d tasks; table in %s", len(results), len(cfg.tasks), report)
    return metrics


def _markdown(cfg: EvaluateConfig, results: dict[str, dict], table: str, data: Path) -> str:
    lines = [
        "# STS evaluation",
        "",
        f'Spearman x100 of cosine similarity; data `{data}`. STS12-16: SentEval\'s "all" '
        "aggregation (one correlation over all subsets' pairs). align/uniform: STS-B test "
        "(lower is better).",
        "",
    ]
    if cfg.max_pairs:
        lines += [
            f"**Quick check on a seeded sample of at most {cfg.max_pairs} pairs per task: not "
            "comparable with published figures.**",
            "",
        ]
    lines += [table, ""]
    for label, r in results.items():
        trained = r.get("trained")
        if trained:
            dev = trained.get("dev") or {}
            dev_text = f", dev {dev['score']:.2f}" if dev.get("score") is not None else ""
            lines.append(
                f"- `{label}`: `{r['model']}`, objective `{trained.get('objective')}` from "
                f"`{trained.get('base_model')}`, step {trained.get('step')}{dev_text}, "
                f"`{r['pooling']}` pooling."
            )
        else:
            lines.append(
                f"- `{label}`: `{r['model']}` with `{r['pooling']}` pooling ({r['pooling_from']})."
            )
    return "\n".join(lines) + "\n"


@cli_errors
def command(
    models: Annotated[
        list[str] | None,
        typer.Option("--model", "-m", help="Model folder or spec to evaluate; repeat for several."),
    ] = None,
    baseline: Annotated[str | None, typer.Option(help="The encoder training started from.")] = None,
    data: Annotated[str | None, typer.Option(help="STS data folder (SentEval layout).")] = None,
    tasks: Annotated[
        list[str] | None,
        typer.Option(
            "--task",
            "-t",
            help="Task to run; repeat (sts12..sts16, stsb, sickr, stsb_dev, sickr_dev).",
        ),
    ] = None,
    max_pairs: Annotated[
        int | None, typer.Option(help="Pairs per task (seeded sample) for a quick check.")
    ] = None,
    batch_size: Annotated[int | None, typer.Option(help="Sentences per forward pass.")] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu, cuda or cuda:N.")] = None,
    metrics: Annotated[str | None, typer.Option(help="Metrics JSON path.")] = None,
    report: Annotated[str | None, typer.Option(help="Markdown report path.")] = None,
    params: ParamsOpt = "params.yaml",
    progress: ProgressOpt = True,
) -> None:
    """Score models on STS12-16, STS-B and SICK-R (Spearman x100), beside their base encoder.

    Every option defaults to the key of the same name in the `evaluate` section of params.yaml.
    Without the data: clone SentEval and run data/downstream/get_transfer_data.bash (see the
    module docs for the layout).
    """
    overrides = {
        k: v for k, v in locals().items() if k in EvaluateConfig.model_fields and v is not None
    }
    cfg = stage_config(STAGE, EvaluateConfig, params, overrides)
    run(cfg, progress=progress)
