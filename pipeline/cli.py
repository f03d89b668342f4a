"""The ``pairforge`` command: one sub-command per stage, plus profile management."""

from __future__ import annotations

import typer

from pipeline import profiles
from stages import ingest

app = typer.Typer(
    name="pairforge",
    help="Offline augmentation and hard-pair mining for unsupervised sentence embeddings.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command(name="ingest")(ingest.command)
app.add_typer(profiles.app, name="profile")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
