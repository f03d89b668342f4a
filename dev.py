#!/usr/bin/env python3
"""One entry point for setting up and checking pairforge on a fresh machine.

    python3 dev.py demo    # create .venv, install the pinned dependencies, run `dvc repro` on the demo
    python3 dev.py test    # same set-up, then the test suite (extra arguments go to pytest)

Both are idempotent: the environment is reinstalled only when pyproject.toml or constraints.txt
changed, and `dvc repro` reruns only the stages whose code, params or data changed.
Only the standard library is used here, so python3 alone is enough to start.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
STAMP = VENV / ".pairforge-installed"
EXTRAS = "dev,demo"


def _run(cmd: list[str], env: dict[str, str] | None = None) -> None:
    print("+", " ".join(cmd), flush=True)
    result = subprocess.run(cmd, cwd=ROOT, env=env)
    if result.returncode != 0:
        sys.exit(result.returncode)


def _install_fingerprint() -> str:
    digest = hashlib.sha256(EXTRAS.encode())
    for name in ("pyproject.toml", "constraints.txt"):
        path = ROOT / name
        if path.exists():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def ensure_env() -> dict[str, str]:
    """Create the virtual environment and install pairforge into it when needed."""
    if not (BIN / "python").exists():
        print(f"creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    fingerprint = _install_fingerprint()
    if not STAMP.exists() or STAMP.read_text() != fingerprint:
        cmd = [str(BIN / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        if (ROOT / "constraints.txt").exists():
            cmd += ["-c", "constraints.txt"]
        _run(cmd + ["-e", f".[{EXTRAS}]"])
        STAMP.write_text(fingerprint)
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(VENV)
    env.setdefault("DVC_NO_ANALYTICS", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("PAIRFORGE_SHARED_DATA", str(ROOT.parent / "shared" / "data"))
    return env


def demo(env: dict[str, str]) -> None:
    _run([str(BIN / "dvc"), "repro"], env)
    # The result people want to see; `dvc metrics show` lists every metric of every stage.
    report = ROOT / "reports" / "evaluate.md"
    if report.exists():
        print("\n" + report.read_text(), flush=True)
    print("all metrics: .venv/bin/dvc metrics show; plots: reports/ and plots/", flush=True)


def test(env: dict[str, str], args: list[str]) -> None:
    _run([str(BIN / "python"), "-m", "pytest", *args], env)


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in {"demo", "test", "setup"}:
        sys.exit(__doc__)
    env = ensure_env()
    if argv[0] == "demo":
        demo(env)
    elif argv[0] == "test":
        test(env, argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
