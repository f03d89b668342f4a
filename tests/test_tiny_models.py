"""The tiny models are built once per test run, whatever folders the run selects.

``pytest --setup-plan`` prints a SETUP line each time a session fixture would be set up, without
running a test or building anything; a fixture registered twice (once per folder conftest, as the
trainer's tiny BERT was in five folders) shows one line per registration.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

import tests.tiny_models as tiny_models
from tests.conftest import ROOT

# One file per folder that uses a tiny model: the trainer's BERT in tests/train, tests/pipeline,
# and the evaluate, pretrain and train stages; the mining BERT in embed and sample; the Marian
# models in backtranslate.
FILES = [
    "tests/train/test_pooling.py",
    "tests/pipeline/test_sts.py",
    "tests/stages/evaluate/test_no_sts.py",
    "tests/stages/pretrain/test_infocse.py",
    "tests/stages/train/test_stage.py",
    "tests/stages/embed/test_embed.py",
    "tests/stages/sample/test_chain_resume.py",
    "tests/stages/backtranslate/test_backtranslate.py",
]
SESSION_SETUP = re.compile(r"^\s*SETUP\s+S (\w+)", re.MULTILINE)


def session_fixtures_of_the_module() -> set[str]:
    """The names of the session fixtures ``tests/tiny_models.py`` defines."""
    names = set()
    for name, value in vars(tiny_models).items():
        marker = getattr(value, "_fixture_function_marker", None)
        if marker is not None and marker.scope == "session":
            names.add(marker.name or name)
    return names


@pytest.mark.slow
def test_every_session_fixture_is_set_up_once_across_folders():
    env = dict(os.environ, PYTHONPATH=str(ROOT), DVC_NO_ANALYTICS="1")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--setup-plan", "-q", "-p", "no:cacheprovider", *FILES],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    setups = SESSION_SETUP.findall(result.stdout)
    counts = {name: setups.count(name) for name in set(setups)}
    twice = {name: n for name, n in counts.items() if n > 1}
    assert not twice, f"session fixtures set up more than once in one run: {twice}"
    # Every tiny model was planned, so the check above covered each of them.
    expected = session_fixtures_of_the_module()
    assert {"_tiny_mlm_once", "tiny_bert", "tiny_marian", "sts_dir"} <= expected
    assert expected <= set(counts), f"never planned: {sorted(expected - set(counts))}"


def test_the_autouse_fixtures_stay_in_their_folders():
    # An autouse fixture here would run for every test of the suite once the root conftest
    # registers this module; the one-torch-thread ones belong to their folders' conftests.
    for name, value in vars(tiny_models).items():
        marker = getattr(value, "_fixture_function_marker", None)
        if marker is not None:
            assert not marker.autouse, f"{name} is autouse in tests/tiny_models.py"
