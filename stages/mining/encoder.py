"""An encoder behind one small interface: texts in, L2-normalised float32 vectors out.

``TextEncoder.encode`` is what the ``embed`` and ``report`` stages call; tests pass a tiny BERT
built in the test through the same class. Batches are formed over the texts sorted by token
length, so each batch pads to its own longest text, not the corpus's (on sentence corpora that
halves the tokens a forward pass computes); vectors come back in input order.

Two engines run the forward pass (``engine``):

- ``transformers``: the model in torch, in ``dtype``;
- ``ctranslate2``: the model converted once with CTranslate2's ``TransformersConverter`` (BERT,
  DistilBERT, RoBERTa and XLM-R encoders) at ``compute_type`` (``int8`` by default: int8 weights
  and dynamically quantised activations), cached under ``models_dir`` by model, revision and
  quantisation as the back-translation models are (``stages.augment.modelfiles``). The token
  states it returns go through the same ``pipeline.models.pool`` as the torch engine's, so every
  pooling means the same thing on both. Measured against the torch engine in docs/mine.md
  (benchmarks/embed_int8.py). It has no training mode: ``encode(dropout=True)`` needs torch.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
from pairforge.pipeline.errors import ConfigError, PairforgeError
from pairforge.pipeline.models import (
    DEFAULT_PROMPT,
    POOLINGS,
    load_encoder,
    pick_device,
    pool,
    wrap_prompt,
)


class TextEncoder:
    """Encode texts with a transformers model and a pooling (see ``pipeline.models``).

    ``pooling="mask"`` wraps each text in ``prompt`` and reads the last [MASK] state; the text is
    first cut to the token budget that ``max_length`` leaves after the prompt, so the [MASK] is
    never truncated away (DenoSent's code truncates the sentence before wrapping it, likewise).
    ``dtype`` is the compute dtype (``float32``, ``bfloat16``, ``float16``); vectors are returned
    as float32 whatever it is. ``engine="ctranslate2"`` runs the model converted at
    ``compute_type`` (kept under ``models_dir``) instead; ``dtype`` must then stay float32.
    """

    def __init__(
        self,
        model: str,
        pooling: str = "cls_before_pooler",
        *,
        device: str = "auto",
        dtype: str = "float32",
        max_length: int = 128,
        batch_size: int = 64,
        prompt: str = DEFAULT_PROMPT,
        threads: int = -1,
        engine: str = "transformers",
        compute_type: str = "int8",
        models_dir: str = ".cache/pairforge/ctranslate2",
    ) -> None:
        if pooling not in POOLINGS:
            raise ConfigError(f"pooling {pooling!r}: allowed {', '.join(POOLINGS)}")
        if engine not in ENGINES:
            raise ConfigError(f"engine {engine!r}: allowed {', '.join(ENGINES)}")
        if engine == "ctranslate2" and dtype != "float32":
            raise ConfigError(
                f"dtype {dtype!r} applies to the transformers engine; the ctranslate2 engine's "
                f"precision is compute_type (now {compute_type!r}): leave dtype at float32"
            )
        # OpenMP threads that spin while waiting make torch 2-3x slower on a CPU shared with
        # other work (measured: 52 vs 113 sentences/s for MiniLM on 2 busy cores); sleeping
        # waiters cost little on an idle machine. Read once, when torch loads its OpenMP: an
        # explicit OMP_WAIT_POLICY, or torch imported earlier, wins.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        import torch

        if threads > 0:  # CPU threads of this process's torch (-1: torch's default, all cores)
            torch.set_num_threads(threads)
        self.torch = torch
        self.model_spec = model
        self.pooling = pooling
        self.device = pick_device(device)
        self.dtype = dtype
        self.max_length = max_length
        self.batch_size = batch_size
        self.prompt = prompt
        self.engine = engine
        self.compute_type = compute_type if engine == "ctranslate2" else None
        self.ct2: Any = None
        if engine == "ctranslate2":
            self.tokenizer, self.ct2, self.dim = _load_ctranslate2(
                model, self.device, compute_type, models_dir, threads
            )
            self.model = None
        else:
            self.tokenizer, self.model = load_encoder(model, self.device, dtype)
            self.dim = int(self.model.config.hidden_size)
        if pooling == "mask":
            if self.tokenizer.mask_token is None:
                raise ConfigError(f"model {model!r}: mask pooling needs a tokenizer with a [MASK]")
            wrapped = wrap_prompt([""], prompt, self.tokenizer.mask_token)[0]
            overhead = len(self.tokenizer(wrapped)["input_ids"])
            self._sentence_budget = max_length - overhead
            if self._sentence_budget < 1:
                raise ConfigError(
                    f"max_length={max_length} leaves no room for a sentence in the prompt "
                    f"{prompt!r} ({overhead} tokens)"
                )

    def info(self) -> dict[str, Any]:
        """How vectors were made; stored in the embeddings manifest and compared downstream."""
        return {
            "model": self.model_spec,
            "pooling": self.pooling,
            "prompt": self.prompt if self.pooling == "mask" else None,
            "max_length": self.max_length,
            "dtype": self.dtype,
            "dim": self.dim,
            "device": self.device,
            "engine": self.engine,
            "compute_type": self.compute_type,
        }

    def _cut(self, texts: list[str]) -> list[str]:
        """Each text cut to the prompt's sentence budget, at a token boundary of the original."""
        enc = self.tokenizer(
            texts,
            add_special_tokens=False,
            truncation=True,
            max_length=self._sentence_budget,
            return_offsets_mapping=True,
        )
        out = []
        for text, offsets in zip(texts, enc["offset_mapping"], strict=True):
            out.append(text[: offsets[-1][1]] if offsets else text)
        return out

    def encode(
        self,
        texts: list[str],
        progress: Callable[[int], None] | None = None,
        dropout: bool = False,
    ) -> np.ndarray:
        """Vectors of ``texts``, float32 ``(len(texts), dim)``, unit L2 norm, in input order.

        ``progress(n)`` is called after each batch with the number of texts it held. ``dropout``
        runs the model in training mode (dropout on, no gradients): two such calls give the
        two views of SimCSE's positive pair. Raises PairforgeError naming the text when the model
        returns NaN/inf or a zero vector (a bf16 or fp16 overflow, or a broken model).
        """
        if dropout:
            if self.model is None:
                raise PairforgeError(
                    f"the {self.engine} engine has no training mode: dropout views need "
                    "engine transformers"
                )
            self.model.train()
            try:
                return self.encode(texts, progress)
            finally:
                self.model.eval()
        torch = self.torch
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        inputs = texts
        if self.pooling == "mask":
            inputs = wrap_prompt(self._cut(texts), self.prompt, self.tokenizer.mask_token)
        enc = self.tokenizer(inputs, truncation=True, max_length=self.max_length)
        lengths = np.fromiter((len(ids) for ids in enc["input_ids"]), dtype=np.int64)
        order = np.argsort(lengths, kind="stable")  # length-sorted batches
        keys = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc]
        mask_id = self.tokenizer.mask_token_id
        with torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                rows = order[start : start + self.batch_size]
                batch = self.tokenizer.pad(
                    {k: [enc[k][i] for i in rows] for k in keys}, return_tensors="pt"
                )
                if self.ct2 is not None:
                    outputs = self._ct2_forward(batch)
                else:
                    batch = {k: v.to(self.device) for k, v in batch.items()}
                    outputs = self.model(**batch)
                pooled = pool(
                    outputs,
                    batch["attention_mask"],
                    self.pooling,  # type: ignore[arg-type]
                    input_ids=batch["input_ids"],
                    mask_token_id=mask_id,
                )  # (b, d)
                pooled = pooled.float()
                norms = pooled.norm(dim=1, keepdim=True)  # (b, 1)
                bad = ~torch.isfinite(pooled).all(dim=1) | (norms[:, 0] == 0)
                if bool(bad.any()):
                    row = int(rows[int(torch.nonzero(bad)[0, 0])])
                    raise PairforgeError(
                        f"encoder {self.model_spec!r} returned a NaN/inf or zero vector for text "
                        f"{texts[row][:80]!r} ({self.engine}, {self.compute_type or self.dtype}); "
                        "try dtype float32 with engine transformers"
                    )
                out[rows] = (pooled / norms).cpu().numpy()
                if progress is not None:
                    progress(len(rows))
        return out

    def _ct2_forward(self, batch: dict[str, Any]) -> SimpleNamespace:
        """The CTranslate2 encoder's output for a right-padded torch batch, as float32 torch
        tensors shaped like transformers' (``last_hidden_state`` ``(b, seq, d)``,
        ``pooler_output`` ``(b, d)`` or None), for ``pool``."""
        import ctranslate2

        torch = self.torch
        ids = np.ascontiguousarray(batch["input_ids"].numpy(), dtype=np.int32)  # (b, seq)
        lengths = batch["attention_mask"].sum(1).numpy().astype(np.int32)  # (b,)
        type_ids = batch.get("token_type_ids")
        out = self.ct2.forward_batch(
            ctranslate2.StorageView.from_array(ids),
            ctranslate2.StorageView.from_array(lengths),
            token_type_ids=type_ids.tolist() if type_ids is not None else None,
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


ENGINES: tuple[str, ...] = ("transformers", "ctranslate2")


def _load_ctranslate2(
    spec: str, device: str, compute_type: str, models_dir: str, threads: int
) -> tuple[Any, Any, int]:
    """(tokenizer, ``ctranslate2.Encoder``, dim) of a model spec, converted at ``compute_type``
    on first use and loaded from ``models_dir`` after; a ConfigError names the spec when the
    model cannot be found or converted (an architecture CTranslate2 has no encoder for)."""
    import ctranslate2
    from pairforge.stages.augment.modelfiles import convert_ctranslate2, resolve_translation_model
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
    return tokenizer, encoder, int(config.hidden_size)


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
