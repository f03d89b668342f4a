"""What code produced a dataset: the package version, the git commit when there is one, and a
hash of the pipeline's own source (so a changed stage never resumes on shards of the old code)."""

from __future__ import annotations

import functools
import hashlib
import subprocess
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def package_version() -> str:
    try:
        return metadata.version("pairforge")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def _stage_sources(stage: str) -> list[Path]:
    module = ROOT / "stages" / f"{stage}.py"
    package = ROOT / "stages" / stage
    return (
        [module] if module.exists() else sorted(package.rglob("*.py")) if package.is_dir() else []
    )


@functools.cache
def source_hash(stage: str) -> str:
    """sha256 over the sources a stage runs (``pipeline/`` and its own module or package),
    first 12 hex digits: a changed stage never resumes on shards of its old code."""
    digest = hashlib.sha256()
    for file in [*sorted((ROOT / "pipeline").rglob("*.py")), *_stage_sources(stage)]:
        digest.update(str(file.relative_to(ROOT)).encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()[:12]


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


def code_version(stage: str, git: bool = True) -> str:
    """``<version>+src.<source hash>``, plus ``.git.<commit>`` inside a git checkout when ``git``
    (manifests leave the commit out, so that their bytes depend on the stage's code only)."""
    parts = [f"{package_version()}+src.{source_hash(stage)}"]
    commit = git_commit() if git else None
    if commit:
        parts.append(f"git.{commit}")
    return ".".join(parts)
