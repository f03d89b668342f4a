"""One module per DVC stage; the stage word is the module, the CLI command and the params section."""

from __future__ import annotations

import importlib

# stage -> (module, config class). Order is pipeline order.
STAGES: dict[str, tuple[str, str]] = {
    "ingest": ("pairforge.stages.ingest.stage", "IngestConfig"),
    "standin": ("pairforge.stages.standin.stage", "StandinConfig"),
    "backtranslate": ("pairforge.stages.backtranslate.stage", "BacktranslateConfig"),
    "rewrite": ("pairforge.stages.rewrite.stage", "RewriteConfig"),
    "pretrain": ("pairforge.stages.pretrain.stage", "PretrainConfig"),
    "embed": ("pairforge.stages.embed.stage", "EmbedConfig"),
    "mine": ("pairforge.stages.mine.stage", "MineConfig"),
    "sample": ("pairforge.stages.sample.stage", "SampleConfig"),
    "report": ("pairforge.stages.report.stage", "ReportConfig"),
    "train": ("pairforge.stages.train.stage", "TrainConfig"),
    "evaluate": ("pairforge.stages.evaluate.stage", "EvaluateConfig"),
}


def config_models() -> dict[str, type]:
    """Each stage's config model, imported on demand."""
    return {
        name: getattr(importlib.import_module(module), cls)
        for name, (module, cls) in STAGES.items()
    }
