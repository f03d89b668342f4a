"""The ``pairforge`` command: one sub-command per stage, plus profile management."""

from __future__ import annotations

import typer
from pairforge.pipeline import profiles
from pairforge.stages import (
    backtranslate,
    embed,
    ingest,
    mine,
    pretrain,
    report,
    rewrite,
    sample,
    standin,
)
from pairforge.stages import evaluate as evaluate_stage
from pairforge.stages import train as train_stage

app = typer.Typer(
    name="pairforge",
    help="Offline augmentation and hard-pair mining for unsupervised sentence embeddings.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command(name="ingest")(ingest.command)
app.command(name="standin")(standin.command)
app.command(name="backtranslate")(backtranslate.command)
app.command(name="rewrite")(rewrite.command)
app.command(name="pretrain")(pretrain.command)
app.command(name="embed")(embed.command)
app.command(name="mine")(mine.command)
app.command(name="sample")(sample.command)
app.command(name="report")(report.command)
app.command(name="export")(sample.export_command)
app.command(name="train")(train_stage.command)
app.command(name="evaluate")(evaluate_stage.command)
app.add_typer(profiles.app, name="profile")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
