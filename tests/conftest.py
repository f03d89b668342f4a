"""Shared fixtures: the shared data folder, and helpers to run the CLI as users do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def shared_data_dir() -> Path:
    return Path(os.environ.get("PAIRFORGE_SHARED_DATA", ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = shared_data_dir()
    if not path.exists():
        pytest.fail(f"shared data not found at {path}; set PAIRFORGE_SHARED_DATA")
    return path


def run_cli(
    args: list[str], cwd: Path, timeout: float = 300, **kwargs
) -> subprocess.CompletedProcess:
    """Run ``pairforge ARGS`` in a subprocess, as a user would."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), DVC_NO_ANALYTICS="1")
    return subprocess.run(
        [sys.executable, "-m", "pairforge.stages.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )
