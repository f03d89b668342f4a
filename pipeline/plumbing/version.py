"""What code produced a dataset: the package version, the git commit when there is one, and a
hash of the stage's declared code (so a changed stage never resumes on shards of its old code)."""

from __future__ import annotations

import functools
import subprocess
from importlib import metadata

from pairforge.pipeline.plumbing.stagedefs import ROOT, StageDef, code_hash

# Plumbing: no stage's output depends on this module, so it is no stage's code (its edits rerun
# nothing): pipeline/plumbing/stagedefs.py.
CHANGES_NO_OUTPUT = True


@functools.cache
def package_version() -> str:
    try:
        return metadata.version("pairforge")
    except metadata.PackageNotFoundError:
        return "0+unknown"


@functools.cache
def source_hash(stage: StageDef | str) -> str:
    """The stage's code hash (``pipeline/plumbing/stagedefs.py``, ``code_hash``), computed once per
    process: a changed stage never resumes on shards of its old code."""
    return code_hash(stage)


@functools.cache
def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def code_version(stage: StageDef | str, git: bool = True) -> str:
    """``<version>+src.<source hash>``, plus ``.git.<commit>`` inside a git checkout when ``git``
    (manifests leave the commit out, so that their bytes depend on the stage's code only)."""
    parts = [f"{package_version()}+src.{source_hash(stage)}"]
    commit = git_commit() if git else None
    if commit:
        parts.append(f"git.{commit}")
    return ".".join(parts)
