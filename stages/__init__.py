"""One module per DVC stage; the stage word is the module, the CLI command and the params section."""

from __future__ import annotations

import importlib

# stage -> (module, config class). Order is pipeline order.
STAGES: dict[str, tuple[str, str]] = {
    "ingest": ("stages.ingest", "IngestConfig"),
    "standin": ("stages.standin", "StandinConfig"),
    "backtranslate": ("stages.backtranslate", "BacktranslateConfig"),
    "rewrite": ("stages.rewrite", "RewriteConfig"),
    "pretrain": ("stages.pretrain", "PretrainConfig"),
    "embed": ("stages.embed", "EmbedConfig"),
    "mine": ("stages.mine", "MineConfig"),
    "sample": ("stages.sample", "SampleConfig"),
    "report": ("stages.report", "ReportConfig"),
    "train": ("stages.train", "TrainConfig"),
    "evaluate": ("stages.evaluate", "EvaluateConfig"),
}


def config_models() -> dict[str, type]:
    """Each stage's config model, imported on demand."""
    return {
        name: getattr(importlib.import_module(module), cls)
        for name, (module, cls) in STAGES.items()
    }
