"""Apertium language pairs as translation "models": where a mode is installed, what its data's
revision is, and what to install when it is missing.

A spec ``apertium:<mode>`` (``apertium:eng-spa``) names one translation direction of an installed
Apertium language pair. Apertium is a rule-based machine translation system packaged by Debian
(``apt-get install apertium apertium-eng-spa``); it runs offline, on the CPU, with no model
weights. A mode is a shell pipeline (``<prefix>/share/apertium/modes/<mode>.mode``) over the
pair's compiled dictionaries and rules; its revision is a content hash of the mode file and every
data file it names, so caches and fingerprints follow the data, not the name.

Nothing here runs a translation: ``stages.backtranslate.apertium`` does.
"""

from __future__ import annotations

import functools
import hashlib
import re
import shutil
import subprocess
from pathlib import Path

APERTIUM_PREFIX = "apertium:"
_MODE = re.compile(r"^[a-z]{2,3}(_[A-Za-z0-9]+)?-[a-z]{2,3}(_[A-Za-z0-9]+)?(-[A-Za-z0-9_]+)*$")

# The Debian package of each mode this project's profiles use (both directions of a pair).
DEBIAN_PACKAGES = {
    "eng-spa": "apertium-eng-spa",
    "spa-eng": "apertium-eng-spa",
    "eng-cat": "apertium-eng-cat",
    "cat-eng": "apertium-eng-cat",
    "en-eo": "apertium-eo-en",
    "eo-en": "apertium-eo-en",
}
INSTALL_ALL = "apt-get install apertium apertium-eng-spa apertium-eng-cat apertium-eo-en"


def is_apertium_spec(spec: str) -> bool:
    return spec.startswith(APERTIUM_PREFIX)


def mode_name(spec: str) -> str:
    """``apertium:eng-spa`` -> ``eng-spa``."""
    return spec[len(APERTIUM_PREFIX) :]


def package_hint(mode: str) -> str:
    """The install command that provides ``mode`` (a guess from its languages when unknown)."""
    if mode in DEBIAN_PACKAGES:
        return f"apt-get install {DEBIAN_PACKAGES[mode]}"
    a, b = (part.split("_")[0] for part in mode.split("-")[:2])
    return (
        f"install the Apertium pair that has mode {mode!r} (Debian: apertium-{a}-{b} or "
        f"apertium-{b}-{a}; `apertium -l` lists the installed modes)"
    )


def apertium_binary() -> Path | None:
    found = shutil.which("apertium")
    return Path(found) if found else None


def modes_dir() -> Path | None:
    """``<prefix>/share/apertium/modes`` of the ``apertium`` on PATH (None: not installed)."""
    binary = apertium_binary()
    if binary is None:
        return None
    return binary.resolve().parent.parent / "share" / "apertium" / "modes"


def mode_problem(spec: str) -> str | None:
    """Why ``apertium:<mode>`` cannot run here, in one line with what to install; None when it
    can. Looks at files only (nothing is started)."""
    mode = mode_name(spec)
    if not _MODE.match(mode):
        return f"{mode!r} is not an Apertium mode name (e.g. eng-spa, spa-eng, en-eo)"
    if apertium_binary() is None:
        return (
            f"the `apertium` program is not installed: `apt-get install apertium` ({INSTALL_ALL})"
        )
    if shutil.which("apertium-wblank-mode") is None:
        return "`apertium-wblank-mode` is missing: apertium 3.8 or newer is needed"
    folder = modes_dir()
    if folder is None or not (folder / f"{mode}.mode").is_file():
        return f"Apertium mode {mode!r} is not installed: {package_hint(mode)}"
    return None


def mode_file(spec: str) -> Path:
    """The mode file of an ``apertium:`` spec (call :func:`mode_problem` first)."""
    folder = modes_dir()
    assert folder is not None
    return folder / f"{mode_name(spec)}.mode"


_QUOTED = re.compile(r"'([^']+)'")


def mode_data_files(path: Path) -> list[Path]:
    """The data files a mode's pipeline reads (its quoted absolute paths that exist)."""
    return [Path(p) for p in _QUOTED.findall(path.read_text()) if Path(p).is_file()]


@functools.lru_cache(maxsize=32)
def _revision(files: tuple[tuple[str, int, int], ...]) -> str:
    digest = hashlib.sha256()
    for name, _, _ in files:
        digest.update(name.encode() + b"\0")
        with open(name, "rb") as fh:
            while block := fh.read(1 << 20):
                digest.update(block)
    return "sha256:" + digest.hexdigest()[:16]


def mode_revision(spec: str) -> str:
    """Content hash of the mode file and its data files (recomputed when one changes)."""
    path = mode_file(spec)
    files = [path, *mode_data_files(path)]
    return _revision(tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files))


@functools.lru_cache(maxsize=1)
def apertium_version() -> str:
    """``apertium -V`` (``Apertium 3.8.3``): part of a translation's identity."""
    binary = apertium_binary()
    if binary is None:
        return "missing"
    out = subprocess.run([str(binary), "-V"], capture_output=True, text=True, timeout=30)
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else ""
