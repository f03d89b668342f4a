"""What a model folder says about its vectors, and the encoder built from it (the evaluator's).

A folder this project exported carries ``pairforge.json``; any sentence-transformers folder (a
local one, or a hub id's snapshot in the local hub cache) its Pooling module (and ``Normalize``,
which gives unit-length vectors here too, so both give the same vectors); a plain Hugging Face
model declares nothing and gets ``cls_before_pooler`` (SimCSE's evaluation setting).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pairforge.pipeline.plumbing.errors import ConfigError
from pairforge.pipeline.science.models.encoder import SentenceEncoder
from pairforge.pipeline.science.models.pooling import POOLINGS
from pairforge.pipeline.science.models.spec import load_encoder, resolve_model

EXPORT_INFO = "pairforge.json"


def st_modules(folder: Path) -> dict[str, Any]:
    """What a sentence-transformers folder says about its vectors: ``pooling`` (one of
    ``POOLINGS``, None without a Pooling module or without ``modules.json``), ``max_length``
    (``max_seq_length``) and ``normalize`` (a ``Normalize`` module after the pooling)."""
    modules_file = folder / "modules.json"
    if not modules_file.exists():
        return {"pooling": None, "max_length": None, "normalize": False}
    modules = json.loads(modules_file.read_text())
    pooling, max_length = _st_pooling(folder, modules)
    normalize = any(m.get("type", "").endswith("Normalize") for m in modules)
    return {"pooling": pooling, "max_length": max_length, "normalize": normalize}


def _st_pooling(folder: Path, modules: list[dict[str, Any]]) -> tuple[str | None, int | None]:
    """(pooling, max_seq_length) of a sentence-transformers folder's ``modules``."""
    max_length = None
    bert_config = folder / "sentence_bert_config.json"
    if bert_config.exists():
        max_length = json.loads(bert_config.read_text()).get("max_seq_length")
    for module in modules:
        kind = module.get("type", "")
        if kind.endswith("Dense"):
            raise ConfigError(
                f"model {str(folder)!r}: sentence-transformers Dense modules are not supported by "
                "the evaluator's encoder; evaluate it with its own pooling or export it anew"
            )
        if not kind.endswith("Pooling"):
            continue
        config = json.loads((folder / module["path"] / "config.json").read_text())
        mode = config.get("pooling_mode")
        if mode is None:
            legacy = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean"}
            active = [m for key, m in legacy.items() if config.get(key)]
            others = [
                k
                for k, v in config.items()
                if k.startswith("pooling_mode_") and v and k not in legacy
            ]
            mode = active[0] if len(active) == 1 and not others else str(others or active)
        if mode == "cls":
            return "cls_before_pooler", max_length  # ST's cls is the raw [CLS] state
        if mode == "mean":
            return "mean", max_length
        raise ConfigError(
            f"model {str(folder)!r}: sentence-transformers pooling {mode!r} is not supported; "
            f"set the pooling explicitly (one of {', '.join(POOLINGS)})"
        )
    return None, max_length


def _cached_hub_folder(spec: str) -> Path | None:
    """The local hub cache's snapshot of the hub id ``spec``, or None when it is not cached (or
    ``spec`` is no hub id). Never downloads: what a hub model declares is read where
    ``from_pretrained`` will load it from."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(spec, local_files_only=True))
    except Exception:  # not cached, not a valid repo id, no huggingface_hub: nothing declared
        return None


def describe_model(spec: str) -> dict[str, Any]:
    """How the evaluator encodes with the model ``spec``: pooling, prompt, max length, whether
    vectors are normalised, source.

    A folder exported by this project carries ``pairforge.json``; a sentence-transformers folder
    (a local one, or a hub id's snapshot in the local hub cache) its Pooling (and Normalize)
    module; anything else gets ``cls_before_pooler`` (SimCSE's evaluation setting).
    """
    where = Path(resolve_model(spec))
    info_file = where / EXPORT_INFO
    if info_file.exists():
        info = json.loads(info_file.read_text())
        # The exported tokenizer wraps sentences in the prompt itself (see train/export.py).
        return {
            "pooling": info["pooling"],
            "prompt": None,
            "max_length": info.get("max_seq_length"),
            "normalize": bool(info.get("normalize", False)),
            "from": "pairforge export",
            "info": info,
        }
    folder = where if where.is_dir() else _cached_hub_folder(spec)
    found = (
        st_modules(folder)
        if folder is not None
        else {"pooling": None, "max_length": None, "normalize": False}
    )
    if found["pooling"] is not None:
        return {"prompt": None, **found, "from": "sentence-transformers"}
    return {
        "pooling": "cls_before_pooler",
        "prompt": None,
        "max_length": found["max_length"],
        "normalize": found["normalize"],
        "from": "default",
    }


def load_sentence_encoder(
    spec: str,
    pooling: str = "auto",
    prompt: str | None = None,
    device: str = "cpu",
    batch_size: int = 64,
    max_length: int | None = None,
    max_sentence_tokens: int = 32,
) -> tuple[SentenceEncoder, dict[str, Any]]:
    """The evaluator's :class:`SentenceEncoder` for the model ``spec`` and what it was built from.

    ``pooling="auto"`` reads it from the folder (:func:`describe_model`); anything else overrides
    it, with ``prompt`` the template for ``mask`` pooling (each sentence cut to
    ``max_sentence_tokens`` tokens). Vectors are unit length when the folder normalises them;
    batches go longest text first (``order="chars"``).
    """
    described = describe_model(spec)
    if pooling != "auto":
        described.update(pooling=pooling, prompt=prompt, **{"from": "configured"})
    if (
        described["pooling"] == "mask"
        and described["prompt"] is None
        and described["from"] != "pairforge export"
    ):
        raise ConfigError(f"model {spec!r}: mask pooling needs a prompt template")
    tokenizer, model = load_encoder(spec, device=device)
    encoder = SentenceEncoder(
        model,
        tokenizer,
        described["pooling"],
        prompt=described["prompt"],
        max_length=max_length or described["max_length"],
        sentence_tokens=max_sentence_tokens,
        batch_size=batch_size,
        normalize=described["normalize"],
        order="chars",
        source={"model": spec},
    )
    return encoder, described
