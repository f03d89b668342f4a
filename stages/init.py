"""``pairforge init``: a working pairforge project in any folder, from the installed package.

It writes what a clone of this repository has and a project of one's own needs, nothing copied
from the repository: ``params.yaml`` from a profile (``pairforge profile use``), ``dvc.yaml`` from
the stages' declarations with their code as hashes (``.pairforge/code.yaml``, ``pairforge
dvc-yaml``), ``.dvcignore``, the data folders, and a README stub saying where the corpus goes.
The ``demo`` and ``apertium`` profiles get the packaged demo corpus and evaluation set
(``data/demo``, the package's ``pairforge.demo`` data), so ``dvc repro`` runs at once; ``paper``
gets an empty ``data/raw`` for the corpus. It runs ``dvc init`` where there is no DVC repository
yet (``--no-scm`` outside git). Files that exist are kept and named, unless ``--force``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer
from pairforge.pipeline.plumbing.config import DVC_FILE, PARAMS_FILE, preset
from pairforge.pipeline.plumbing.errors import ConfigError
from pairforge.stages.options import cli_errors

DVCIGNORE = """\
# Bytecode caches and editor files: machine state, never data
__pycache__/
*.pyc
.*.swp
"""

# The demo data the package carries (the repository's data/demo, as package pairforge.demo).
DEMO_FILES = ("corpus.txt", "extra.jsonl", "bad.txt", "README.md", "eval/README.md",
              "eval/dev.tsv", "eval/test.tsv")  # fmt: skip


def _readme(profile: str, root: str, inputs: list[str]) -> str:
    where = (
        f"The {profile!r} profile reads the packaged demo corpus in `{root}/` "
        f"({', '.join(inputs)}): `dvc repro` runs as it is."
        if profile in {"demo", "apertium"}
        else f"Put the corpus in `{root}/` and name its files under `ingest.inputs` in "
        f"params.yaml (now: {', '.join(inputs) or 'none'})."
    )
    return f"""# A pairforge project

Written by `pairforge init --profile {profile}`. {where} Text, JSON lines, CSV, TSV or
Parquet, gzipped or not; `ingest.format` and `ingest.field` say how to read them
(`pairforge ingest --help`).

```bash
dvc repro                    # every stage, in order; a rerun redoes only what changed
dvc metrics show             # the headline figures
pairforge verify data/pairs  # the mined pairs, checked against their manifest
```

- `params.yaml`: every key of every stage, under its description; `pairforge profile use
  <name>` writes another profile's.
- `dvc.yaml`: written by `pairforge dvc-yaml` from the stages' declarations (never by hand).
  After upgrading pairforge, run `pairforge dvc-yaml`: `.pairforge/code.yaml` then holds the
  new code's hashes and `dvc repro` reruns the stages whose code changed.
- Sharing the datasets (a DVC remote, `dvc push`, `dvc import`; or the Hub): pairforge's
  README, "Sharing datasets".
"""


def demo_data() -> Path:
    """The folder of the packaged demo data. ``pairforge.demo`` is a data-only package (no
    ``__init__``): its locations are read from its spec, where an editable install adds entries
    that are no folder (``importlib.resources`` refuses those)."""
    spec = importlib.util.find_spec("pairforge.demo")
    for location in (spec.submodule_search_locations or []) if spec else []:
        if (Path(location) / DEMO_FILES[0]).is_file():
            return Path(location)
    raise ConfigError(
        "init: the package's demo data (pairforge.demo) is missing; reinstall pairforge"
    )


def _copy_demo(root: Path, force: bool) -> list[str]:
    """The packaged demo corpus and evaluation set into ``root``; returns the files written."""
    source = demo_data()
    written = []
    for name in DEMO_FILES:
        target = root / name
        if target.exists() and not force:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / name, target)
        written.append(str(target))
    return written


def _dvc_init(folder: Path) -> str | None:
    """``dvc init`` in ``folder`` unless it is inside a DVC repository; what was done, or None."""
    for parent in (folder, *folder.parents):
        if (parent / ".dvc").is_dir():
            return None
    in_git = any((parent / ".git").exists() for parent in (folder, *folder.parents))
    command = [sys.executable, "-m", "dvc", "init", "-q"] + ([] if in_git else ["--no-scm"])
    env = {**os.environ, "DVC_NO_ANALYTICS": os.environ.get("DVC_NO_ANALYTICS", "1")}
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise ConfigError(f"init: `dvc init` failed in {str(folder)!r}: {last}")
    return "dvc init" + ("" if in_git else " --no-scm (no git repository here)")


@cli_errors
def command(
    folder: Annotated[
        Path, typer.Argument(help="the project folder (made if absent)", show_default=False)
    ] = Path("."),
    profile: Annotated[
        str, typer.Option("--profile", help="the params profile: demo, apertium or paper")
    ] = "demo",
    force: Annotated[
        bool, typer.Option("--force", help="write over params.yaml, dvc.yaml and the demo data")
    ] = False,
    dvc: Annotated[
        bool, typer.Option("--dvc/--no-dvc", help="run `dvc init` where there is no DVC repo")
    ] = True,
) -> None:
    """Start a pairforge project in a folder: params.yaml, dvc.yaml, the data folders, a README."""
    from pairforge.stages.dvcfile import write_project_files
    from pairforge.stages.params import profile_params
    from pairforge.stages.profile import preset_text, validate_params

    preset(profile)  # an unknown profile is one line before anything is written
    folder.mkdir(parents=True, exist_ok=True)
    folder = folder.resolve()
    ours = [folder / PARAMS_FILE, folder / DVC_FILE]
    kept = [p.name for p in ours if p.exists()]
    if kept and not force:
        raise ConfigError(
            f"init: {str(folder)!r} already holds {' and '.join(kept)}; pass --force to write "
            "over them (the data stays), or `pairforge profile use` to change the profile only"
        )
    params = profile_params(profile)
    ingest = params["ingest"]
    root = folder / ingest["root"]
    root.mkdir(parents=True, exist_ok=True)
    written = []
    if profile in {"demo", "apertium"}:
        written += _copy_demo(root, force)
    written += write_project_files(folder / DVC_FILE, code_files=False, check=False)
    # The model specs are checked from the project folder, its dvc.yaml now beside them.
    here = Path.cwd()
    os.chdir(folder)
    try:
        validate_params(params)
    finally:
        os.chdir(here)
    header = f"# Written by `pairforge init --profile {profile}`; edit freely, or switch profile.\n"
    (folder / PARAMS_FILE).write_text(header + preset_text(profile))
    written.append(str(folder / PARAMS_FILE))
    for name, text in (
        (".dvcignore", DVCIGNORE),
        ("README.md", _readme(profile, ingest["root"], ingest["inputs"])),
    ):
        if not (folder / name).exists():
            (folder / name).write_text(text)
            written.append(str(folder / name))
    done = _dvc_init(folder) if dvc else None
    for file in written:
        typer.echo(f"wrote {os.path.relpath(file, folder)}")
    if done:
        typer.echo(done)
    where = "" if folder == here.resolve() else f"cd {folder} && "
    typer.echo(f"a pairforge project ({profile} profile) is ready: {where}dvc repro")
