"""export: a ``pairs`` dataset -> the column layouts sentence-transformers trains on
(``pairforge export``)."""

from __future__ import annotations

from typing import Annotated

import typer
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.config import params_source
from pairforge.pipeline.plumbing.errors import ConfigError
from pairforge.pipeline.plumbing.locks import writer_lock
from pairforge.pipeline.plumbing.shards import open_dataset
from pairforge.pipeline.plumbing.storage import dataset_path
from pairforge.stages.options import ParamsOpt, cli_errors


def sample_output(params_path: str | None) -> str:
    """Where ``sample`` writes its pairs: the params' ``sample.output``, else its config's
    default (the key is declared once, in the sample stage's config)."""
    from pairforge.stages.sample.stage import SampleConfig

    params, _ = params_source(params_path, None)
    section = params.get("sample") or {}
    return str(section.get("output", SampleConfig.model_fields["output"].default))


@cli_errors
def command(
    input: Annotated[
        str | None,
        typer.Option(
            "--input",
            help="Pairs dataset folder [default: sample.output of params.yaml (or --params), "
            "else the sample stage's default].",
        ),
    ] = None,
    output: Annotated[
        str, typer.Option(help="Output folder (Hugging Face Hub layout).")
    ] = "data/export/sentence-transformers",
    format: Annotated[str, typer.Option("--format", help="triplet, n-tuple or pair.")] = "triplet",
    m: Annotated[
        int | None,
        typer.Option(help="n-tuple: negatives per row (default: sample.m of the dataset)."),
    ] = None,
    params: ParamsOpt = None,
) -> None:
    """Export a pairs dataset to the sentence-transformers (anchor, positive, negative) layout."""
    from pairforge.stages.export.layouts import FORMATS, write_export

    if input is None:
        input = sample_output(params)
    if format not in FORMATS:
        raise ConfigError(
            f"export: --format {format!r} is not allowed; allowed values: {', '.join(FORMATS)}"
        )
    ds = open_dataset(input, S.PAIRS)
    params = ds.manifest.get("params", {})
    m = m if m is not None else int(params.get("m", 2))
    with writer_lock(output, f"export output {output!r}"):
        totals = write_export(
            list(ds.iter_shards([S.TEXT, S.POSITIVE_TEXTS, S.NEGATIVE_TEXTS])),
            dataset_path(output),
            format,  # type: ignore[arg-type]
            m,
            {
                "name": params.get("corpus_name", "pairs"),
                "license": params.get("corpus_license"),
                "source": input,
                "params": params,
            },
        )
    typer.echo(
        f"export: {totals.get('rows', 0):,} {format} rows from {totals.get('anchors', 0):,} anchors -> {output}"
    )
    skipped = {k: v for k, v in totals.items() if k not in ("rows", "anchors") and v}
    if skipped:
        typer.echo(
            "export: anchors without a row: " + ", ".join(f"{k} {v:,}" for k, v in skipped.items())
        )
