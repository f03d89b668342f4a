"""Shared fixtures: the shared data folder, the tiny models, a local S3 server, and helpers to run the CLI as users
do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.s3 import bucket, s3_server  # noqa: F401 (a local S3 server, once per run)

# Registered here, once for the whole run, so that each tiny model is built once per run
# whatever folders are selected; no folder conftest imports them again.
from tests.tiny_models import (  # noqa: F401
    _tiny_mlm_once,
    copy_marian,
    corpus,
    model_copy,
    sts_dir,
    tiny_bert,
    tiny_encoder_dir,
    tiny_marian,
    tiny_mlm,
    tiny_model_dir,
    tiny_sentences,
    tiny_tokenizer,
)

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
