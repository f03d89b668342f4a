"""CI's script runs the README's test command as the README states it, then the slow tests."""

from __future__ import annotations

import os
import re

from tests.conftest import ROOT


def test_ci_runs_the_readme_test_command_then_the_slow_tests():
    quick_start = (ROOT / "README.md").read_text().split("## Quick start", 1)[1]
    readme_test = re.search(r"^(python3 dev\.py test)\b", quick_start, re.MULTILINE)
    assert readme_test, "README's Quick start has no `python3 dev.py test` line"
    script = ROOT / ".ci" / "run"
    assert os.access(script, os.X_OK)
    commands = [
        line.strip()
        for line in script.read_text().splitlines()
        if line.strip().startswith("python3 ")
    ]
    assert commands == [readme_test.group(1), f"{readme_test.group(1)} -m slow"]
    assert "set -euo pipefail" in script.read_text()  # a failing suite stops CI
    # The Apertium engine's tests run the real binary in CI: its packages come first.
    text = script.read_text()
    assert text.index("apt-get install") < text.index(readme_test.group(1))
    for package in ("apertium", "apertium-eng-spa", "apertium-eng-cat", "apertium-eo-en"):
        assert re.search(rf"\b{package}\b", text)
