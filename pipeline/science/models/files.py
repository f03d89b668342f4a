"""Where translation models come from: a spec resolved to files with a revision, and the
on-disk CTranslate2 conversions.

A model is named by a spec (hub id, local folder, ``package:`` or, for translation, an
``apertium:`` mode; see ``pipeline.science.models``). Its
``revision`` is the hub commit of the snapshot used, or ``sha256:<16 hex>`` of a local folder's
files, so that caches and conversions follow the weights, not the name. A CTranslate2 conversion
is made once per (model, revision, quantization) under ``models_dir`` and reused by every later
run; a file lock keeps concurrent workers from converting twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import os
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pairforge.pipeline.plumbing.errors import ConfigError
from pairforge.pipeline.science.models.apertium import (
    is_apertium_spec,
    mode_file,
    mode_problem,
    mode_revision,
)
from pairforge.pipeline.science.models.spec import hub_kwargs, resolve_model

log = logging.getLogger("pairforge")

STANDIN_FILE = "pairforge-standin.json"


@dataclass(frozen=True)
class ModelRef:
    """A translation model resolved to files: ``spec`` as written in params, ``path`` to load
    from, ``revision`` (hub commit or content hash) and the stand-in note when it is one."""

    spec: str
    path: str
    revision: str
    local: bool
    standin: dict | None = field(default=None, compare=False)

    @property
    def cache_name(self) -> str:
        """Identity in cache keys: a local folder by content, a hub model by id and commit."""
        return f"local@{self.revision}" if self.local else f"{self.spec}@{self.revision}"


@functools.lru_cache(maxsize=64)
def _folder_hash(path: str, stamp: tuple) -> str:
    digest = hashlib.sha256()
    for file in sorted(p for p in Path(path).rglob("*") if p.is_file()):
        rel = file.relative_to(path)
        if any(part.startswith(".") for part in rel.parts):
            continue
        digest.update(str(rel).encode() + b"\0")
        with open(file, "rb") as fh:
            while block := fh.read(1 << 20):
                digest.update(block)
    return "sha256:" + digest.hexdigest()[:16]


def folder_revision(path: str | Path) -> str:
    """Content hash of a model folder (recomputed only when a file's size or mtime changed)."""
    files = sorted(p for p in Path(path).rglob("*") if p.is_file())
    stamp = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    return _folder_hash(str(path), stamp)


def resolve_translation_model(spec: str, revision: str | None = None) -> ModelRef:
    """Find the files of a Marian model spec; a ConfigError names the spec when they are not
    there (offline with an empty hub cache, a missing folder, a folder without config.json).
    An ``apertium:<mode>`` spec resolves to its mode file, its revision the hash of its data."""
    if is_apertium_spec(spec):
        if revision:
            raise ConfigError(f"model {spec!r}: a revision applies to hub ids, not Apertium modes")
        problem = mode_problem(spec)
        if problem:
            raise ConfigError(f"model {spec!r}: {problem}")
        return ModelRef(spec, str(mode_file(spec)), mode_revision(spec), local=True)
    where = resolve_model(spec)
    if Path(where).is_dir():
        if revision:
            raise ConfigError(f"model {spec!r}: a revision applies to hub ids, not local folders")
        if not (Path(where) / "config.json").exists():
            raise ConfigError(f"model {spec!r}: {where!r} has no config.json")
        standin_file = Path(where) / STANDIN_FILE
        standin = json.loads(standin_file.read_text()) if standin_file.exists() else None
        return ModelRef(spec, where, folder_revision(where), local=True, standin=standin)
    from huggingface_hub import snapshot_download

    try:
        path = snapshot_download(
            repo_id=where,
            revision=revision,
            local_files_only=bool(hub_kwargs().get("local_files_only")),
            allow_patterns=["*.json", "*.spm", "*.model", "*.txt", "*.safetensors", "*.bin"],
        )
    except Exception as exc:  # hub errors come in many classes; all mean "not available"
        offline = (
            " (HF_HUB_OFFLINE is set: only the local hub cache is searched)" if hub_kwargs() else ""
        )
        raise ConfigError(
            f"model {spec!r} (revision {revision or 'main'}) could not be found{offline}: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ) from None
    return ModelRef(spec, str(path), Path(path).name, local=False)


def _quantization_dir(ref: ModelRef, quantization: str, models_dir: str) -> Path:
    stem = ref.spec.replace("package:", "").strip("/").replace("/", "--").replace(".", "_")[-60:]
    rev = ref.revision.replace("sha256:", "")[:16]
    return Path(models_dir) / f"{stem}-{rev}-{quantization}"


@contextlib.contextmanager
def _file_lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def made_once(
    ref: ModelRef,
    name: str,
    models_dir: str,
    marker: str,
    build: Callable[[Path], None],
    what: str,
    record: dict[str, Any],
) -> tuple[Path, bool]:
    """The folder ``<models_dir>/<model>-<revision>-<name>`` holding ``marker``: ``(folder, made
    now)``. Made once per (model, revision, name) by ``build(tmp folder)`` and reused by every
    later run; a lock keeps concurrent workers from making it twice, and the folder appears only
    when complete, with ``record`` as its ``pairforge-source.json``. A ConfigError from ``build``
    passes through; any other failure becomes one ConfigError line naming the model and ``what``
    failed. Nothing of a failed attempt is left behind."""
    target = _quantization_dir(ref, name, models_dir)
    if (target / marker).exists():
        return target, False
    with _file_lock(target.with_name(f".{target.name}.lock")):
        if (target / marker).exists():
            return target, False
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            build(tmp)
        except ConfigError:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        except Exception as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise ConfigError(
                f"model {ref.spec!r}: {what} failed: {type(exc).__name__}: {first}"
            ) from None
        (tmp / "pairforge-source.json").write_text(json.dumps(record))
        os.replace(tmp, target)
    return target, True


def convert_ctranslate2(ref: ModelRef, quantization: str, models_dir: str) -> tuple[Path, bool]:
    """The CTranslate2 conversion of ``ref`` at ``quantization``: ``(folder, converted now)``,
    made once (:func:`made_once`)."""

    def build(tmp: Path) -> None:
        from ctranslate2.converters import TransformersConverter

        log.info(
            "converting %s to CTranslate2 (%s), once, into %s", ref.spec, quantization, models_dir
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            TransformersConverter(ref.path, low_cpu_mem_usage=True).convert(
                str(tmp), quantization=quantization, force=True
            )

    record = {"spec": ref.spec, "revision": ref.revision, "quantization": quantization}
    return made_once(
        ref, quantization, models_dir, "model.bin", build, "CTranslate2 conversion", record
    )
