"""One module per DVC stage; the stage word is the module, the CLI command and the params section."""

from __future__ import annotations

import importlib

# stage -> (module, config class). Order is pipeline order.
STAGES: dict[str, tuple[str, str]] = {
    "ingest": ("pairforge.stages.ingest", "IngestConfig"),
    "standin": ("pairforge.stages.standin", "StandinConfig"),
    "backtranslate": ("pairforge.stages.backtranslate", "BacktranslateConfig"),
    "rewrite": ("pairforge.stages.rewrite", "RewriteConfig"),
    "pretrain": ("pairforge.stages.pretrain", "PretrainConfig"),
    "embed": ("pairforge.stages.embed", "EmbedConfig"),
    "mine": ("pairforge.stages.mine", "MineConfig"),
    "sample": ("pairforge.stages.sample", "SampleConfig"),
    "report": ("pairforge.stages.report", "ReportConfig"),
    "train": ("pairforge.stages.train", "TrainConfig"),
    "evaluate": ("pairforge.stages.evaluate", "EvaluateConfig"),
}


def config_models() -> dict[str, type]:
    """Each stage's config model, imported on demand."""
    return {
        name: getattr(importlib.import_module(module), cls)
        for name, (module, cls) in STAGES.items()
    }
