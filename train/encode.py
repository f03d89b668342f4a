"""Sentence vectors from an encoder, as the evaluator and the dev evaluation compute them.

:class:`Embedder` wraps a Hugging Face encoder, its tokenizer and a pooling
(``pipeline.models.pool``); :func:`load_embedder` builds one from a model spec, reading how to
pool from the model folder: a folder this project exported (``pairforge.json``), any
sentence-transformers folder (its Pooling module), or a plain Hugging Face model
(``cls_before_pooler`` unless told otherwise). A folder whose sentence-transformers modules end
with ``Normalize`` gets unit-length vectors here too, so both give the same vectors.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pairforge.pipeline.errors import ConfigError
from pairforge.pipeline.models import POOLINGS, load_encoder, pool, resolve_model
from pairforge.pipeline.progress import Progress
from pairforge.train.objectives.prompts import build_prompt_inputs

log = logging.getLogger("pairforge")

EXPORT_INFO = "pairforge.json"


class Embedder:
    """``texts -> (n, dim)`` float32 vectors, in the order given; unit length with ``normalize``
    (a model folder with a sentence-transformers ``Normalize`` module), else as pooled.

    Texts are encoded longest first in batches of ``batch_size`` (less padding), in eval mode and
    without gradient; the encoder's train/eval mode is restored afterwards. With a ``prompt``
    each sentence is cut to ``max_sentence_tokens`` tokens and wrapped (``mask`` pooling); else
    inputs are truncated to ``max_length`` tokens (None: the tokenizer's model maximum).
    """

    def __init__(
        self,
        encoder: Any,
        tokenizer: Any,
        pooling: str,
        prompt: str | None = None,
        max_length: int | None = None,
        max_sentence_tokens: int = 32,
        batch_size: int = 64,
        autocast_dtype: torch.dtype | None = None,
        progress: str | None = None,
        normalize: bool = False,
    ) -> None:
        if pooling not in POOLINGS:
            raise ConfigError(f"pooling {pooling!r}: allowed {', '.join(POOLINGS)}")
        self.encoder = encoder
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.prompt = prompt
        self.max_length = max_length
        self.max_sentence_tokens = max_sentence_tokens
        self.batch_size = batch_size
        self.autocast_dtype = autocast_dtype
        self.progress = progress  # a label: report sentences, rate and ETA while encoding
        self.normalize = normalize

    @property
    def device(self) -> torch.device:
        return next(self.encoder.parameters()).device

    def inputs(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        if self.prompt is not None:
            encoded = build_prompt_inputs(
                self.tokenizer, texts, self.prompt, self.max_sentence_tokens
            )
        else:
            positions = getattr(
                getattr(self.encoder, "config", None), "max_position_embeddings", 512
            )
            max_length = self.max_length or min(
                int(self.tokenizer.model_max_length), int(positions)
            )
            encoded = self.tokenizer(
                list(texts),
                padding=True,
                truncation=True,
                max_length=max_length,
                return_tensors="pt",
            )
        return {key: value.to(self.device) for key, value in dict(encoded).items()}

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out: np.ndarray | None = None
        was_training = self.encoder.training
        self.encoder.eval()
        bar = Progress(
            self.progress or "", total=len(texts), unit="sentences", enabled=bool(self.progress)
        )
        try:
            with torch.inference_mode():
                for start in range(0, len(texts), self.batch_size):
                    index = order[start : start + self.batch_size]
                    inputs = self.inputs([texts[i] for i in index])
                    with torch.autocast(
                        self.device.type,
                        dtype=self.autocast_dtype or torch.float32,
                        enabled=self.autocast_dtype is not None,
                    ):
                        outputs = self.encoder(**inputs, return_dict=True)
                    vectors = pool(
                        outputs,
                        inputs["attention_mask"],
                        self.pooling,
                        inputs.get("input_ids"),
                        self.tokenizer.mask_token_id,
                    )
                    if self.normalize:
                        vectors = torch.nn.functional.normalize(vectors.float(), dim=-1)
                    vectors = vectors.float().cpu().numpy()
                    if out is None:
                        out = np.empty((len(texts), vectors.shape[1]), dtype=np.float32)
                    out[index] = vectors
                    bar.advance(done=len(index), rows=len(index))
        finally:
            self.encoder.train(was_training)
        if self.progress:
            bar.close()
        return out if out is not None else np.zeros((0, 0), dtype=np.float32)


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


def load_embedder(
    spec: str,
    pooling: str = "auto",
    prompt: str | None = None,
    device: str = "cpu",
    batch_size: int = 64,
    max_length: int | None = None,
    max_sentence_tokens: int = 32,
) -> tuple[Embedder, dict[str, Any]]:
    """An :class:`Embedder` for the model ``spec`` and what it was built from.

    ``pooling="auto"`` reads it from the folder (:func:`describe_model`); anything else overrides
    it, with ``prompt`` the template for ``mask`` pooling.
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
    tokenizer, encoder = load_encoder(spec, device=device)
    embedder = Embedder(
        encoder,
        tokenizer,
        described["pooling"],
        prompt=described["prompt"],
        max_length=max_length or described["max_length"],
        max_sentence_tokens=max_sentence_tokens,
        batch_size=batch_size,
        normalize=described["normalize"],
    )
    return embedder, described
