"""The ``ctranslate2`` engine of the encoder: a model converted once with CTranslate2's
``TransformersConverter`` (BERT, DistilBERT, RoBERTa and XLM-R encoders) at ``compute_type``
(``int8`` by default: int8 weights and dynamically quantised activations), cached under
``models_dir`` by model, revision and quantisation as the back-translation models are
(``pipeline.science.models.files``). Its token states go through the same ``pooling.pool`` as the
torch engine's, so every pooling means the same thing on both. benchmarks/embed_int8.py
measures it against the torch engine (docs/mine.md, "Engines: int8 on the CPU"). It has no training mode: dropout views need torch.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

import numpy as np
from pairforge.pipeline.plumbing.errors import ConfigError


class CT2Model:
    """A ``ctranslate2.Encoder`` called like a transformers encoder (for ``SentenceEncoder``)."""

    training = False

    def __init__(self, encoder: Any, device: str) -> None:
        self.encoder = encoder
        self.device = device

    def __call__(
        self,
        input_ids: Any,
        attention_mask: Any,
        token_type_ids: Any = None,
        return_dict: bool = True,
    ) -> SimpleNamespace:
        """The encoder's output for a right-padded torch batch, as float32 torch tensors shaped
        like transformers' (``last_hidden_state`` ``(b, seq, d)``, ``pooler_output`` ``(b, d)``
        or None), for ``pool``."""
        import ctranslate2
        import torch

        ids = np.ascontiguousarray(input_ids.numpy(), dtype=np.int32)  # (b, seq)
        lengths = attention_mask.sum(1).numpy().astype(np.int32)  # (b,)
        out = self.encoder.forward_batch(
            ctranslate2.StorageView.from_array(ids),
            ctranslate2.StorageView.from_array(lengths),
            token_type_ids=token_type_ids.tolist() if token_type_ids is not None else None,
        )

        def tensor(view: Any) -> Any:
            if view is None:
                return None
            if self.device.startswith("cuda"):
                return torch.as_tensor(view, device=self.device).float().cpu()
            return torch.from_numpy(np.asarray(view)).float()

        return SimpleNamespace(
            last_hidden_state=tensor(out.last_hidden_state),
            pooler_output=tensor(out.pooler_output),
        )


def load_ctranslate2(
    spec: str, device: str, compute_type: str, models_dir: str, threads: int
) -> tuple[Any, CT2Model, int]:
    """(tokenizer, :class:`CT2Model`, dim) of a model spec, converted at ``compute_type`` on
    first use and loaded from ``models_dir`` after; a ConfigError names the spec when the model
    cannot be found or converted (an architecture CTranslate2 has no encoder for)."""
    import ctranslate2
    from pairforge.pipeline.science.models.files import (
        convert_ctranslate2,
        resolve_translation_model,
    )
    from transformers import AutoConfig, AutoTokenizer

    ref = resolve_translation_model(spec)
    config = AutoConfig.from_pretrained(ref.path)
    with _absolute_positions_default():
        folder, _ = convert_ctranslate2(ref, compute_type, models_dir)
    tokenizer = AutoTokenizer.from_pretrained(ref.path)
    if tokenizer.padding_side != "right":
        raise ConfigError(f"model {spec!r}: the ctranslate2 engine needs right padding")
    kind, _, index = device.partition(":")
    try:
        encoder = ctranslate2.Encoder(
            str(folder),
            device=kind,
            device_index=int(index or 0),
            compute_type=compute_type,
            intra_threads=max(threads, 0),  # 0: CTranslate2's default
        )
    except ValueError as exc:  # e.g. a compute type this device does not support
        raise ConfigError(
            f"model {spec!r} on {device} with compute_type {compute_type}: {exc}"
        ) from None
    return tokenizer, CT2Model(encoder, device), int(config.hidden_size)


@contextlib.contextmanager
def _absolute_positions_default():
    """CTranslate2's BERT converter asserts ``config.position_embedding_type == "absolute"``;
    transformers 5 dropped that attribute from ``BertConfig`` (BERT's positions are absolute), so
    a config saved without it would fail the assert: give the class that default meanwhile."""
    from transformers import BertConfig

    missing = not hasattr(BertConfig, "position_embedding_type")
    if missing:
        BertConfig.position_embedding_type = "absolute"
    try:
        yield
    finally:
        if missing:
            del BertConfig.position_embedding_type
