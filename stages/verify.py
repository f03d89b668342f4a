"""``pairforge verify``: check datasets against their manifests on demand (for a dataset received
from another team, or before a long run).

Each shard is checked for presence, size, sha256, xxh3_128 (format-2 manifests) and its Parquet
footer against the manifest's schema and row count; a Parquet file in ``data/`` that the manifest
does not list is a problem too (folder readers would read it). Stages verify what they read on
their own (``pipeline/plumbing/integrity.py``); this command checks everything at once and reports
every problem rather than the first.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from pairforge.stages.options import setup_logging


@dataclass
class VerifyReport:
    """What ``verify_dataset`` found in one dataset."""

    path: str
    shards: int = 0
    rows: int = 0
    bytes: int = 0
    checksums: str = ""
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        if not self.ok:
            return f"{self.path}: FAILED: {len(self.problems)} problem(s)"
        mb = self.bytes / 1e6
        return (
            f"{self.path}: ok: {self.shards} shards, {self.rows:,} rows, {mb:.1f} MB checked "
            f"({self.checksums}) in {self.seconds:.2f} s"
        )


def _type(text: str) -> str:
    """A type's text without item-field names and nullability, which Parquet does not keep."""
    return re.sub(r"<\w+: ", "<", text).replace(" not null", "")


def _check_shard(folder: Any, shard: dict[str, Any], fields: list[dict], stage: str) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import xxhash

    name = shard.get("file", "?")
    fix = f"rerun `pairforge {stage}` or fetch the dataset again" if stage else "fetch it again"
    file = folder / name
    if not file.is_file():
        return [f"shard {name} is missing; {fix}"]
    data = file.read_bytes()
    if len(data) != shard.get("bytes"):
        return [f"shard {name}: size {len(data)} != {shard.get('bytes')} in the manifest; {fix}"]
    problems = []
    if hashlib.sha256(data).hexdigest() != shard.get("sha256"):
        problems.append(f"shard {name}: sha256 mismatch; {fix}")
    if shard.get("xxh3_128") and xxhash.xxh3_128(data).hexdigest() != shard["xxh3_128"]:
        problems.append(f"shard {name}: xxh3_128 mismatch; {fix}")
    if problems:
        return problems
    try:
        pf = pq.ParquetFile(pa.BufferReader(pa.py_buffer(data)))
    except (pa.ArrowException, OSError) as exc:
        return [f"shard {name}: not a Parquet file ({str(exc).splitlines()[0][:120]}); {fix}"]
    found = [{"name": f.name, "type": _type(str(f.type))} for f in pf.schema_arrow]
    if fields and found != [{"name": f["name"], "type": _type(f["type"])} for f in fields]:
        want = ", ".join(f"{f['name']}: {f['type']}" for f in fields)
        got = ", ".join(f"{f['name']}: {f['type']}" for f in found)
        problems.append(f"shard {name}: columns ({got}) differ from the manifest's ({want})")
    if pf.metadata.num_rows != shard.get("rows"):
        problems.append(
            f"shard {name}: {pf.metadata.num_rows} rows, {shard.get('rows')} in the manifest"
        )
    return problems


def verify_dataset(path: str | Path) -> VerifyReport:
    """Check every shard of the dataset at ``path``; problems are one line each."""
    from pairforge.pipeline.plumbing.errors import PairforgeError
    from pairforge.pipeline.plumbing.shards import DATA_DIR, read_manifest
    from pairforge.pipeline.plumbing.storage import dataset_path

    report = VerifyReport(str(path))
    start = time.perf_counter()
    try:
        folder = dataset_path(path)
        manifest = read_manifest(folder)
    except PairforgeError as exc:
        report.problems.append(str(exc))
        return report
    shards = manifest.get("shards", [])
    fields = manifest.get("schema", {}).get("fields", [])
    stage = manifest.get("stage", "")
    report.shards = len(shards)
    report.rows = sum(int(s.get("rows", 0)) for s in shards)
    report.bytes = sum(int(s.get("bytes", 0)) for s in shards)
    fast = shards and all(s.get("xxh3_128") for s in shards)
    report.checksums = "sha256 + xxh3_128" if fast else "sha256"
    for shard in shards:
        report.problems += _check_shard(folder, shard, fields, stage)
    listed = {str(folder / s.get("file", "")) for s in shards}
    for extra in sorted((folder / DATA_DIR).glob("*.parquet")):
        if str(extra) not in listed:
            report.problems.append(
                f"{extra.relative_to(folder)} is not in the manifest (folder readers would read "
                "it); remove it"
            )
    report.seconds = time.perf_counter() - start
    return report


def command(
    datasets: Annotated[
        list[str],
        typer.Argument(help="Dataset folders (each with a _manifest.json), local or fsspec URLs."),
    ],
) -> None:
    """Check datasets against their manifests: every shard's size, sha256, xxh3_128, schema and
    row count. Prints one summary line per dataset (and one line per problem); exit 1 when any
    dataset fails."""
    setup_logging()
    failed = 0
    for path in datasets:
        report = verify_dataset(path)
        typer.echo(report.summary())
        for problem in report.problems:
            typer.echo(f"  {problem}")
        failed += not report.ok
    if failed:
        typer.echo(f"{failed} of {len(datasets)} dataset(s) failed verification", err=True)
        raise typer.Exit(1)
