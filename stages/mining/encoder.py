"""A transformers encoder behind one small interface: texts in, L2-normalised float32 vectors out.

``TextEncoder.encode`` is what the ``embed`` and ``report`` stages call; tests pass a tiny BERT
built in the test through the same class. Batches are formed over the texts sorted by token
length, so each batch pads to its own longest text, not the corpus's (on sentence corpora that
halves the tokens a forward pass computes); vectors come back in input order.
"""

from __future__ import annotations

import os
from collections.abc import Callable
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
    as float32 whatever it is.
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
    ) -> None:
        if pooling not in POOLINGS:
            raise ConfigError(f"pooling {pooling!r}: allowed {', '.join(POOLINGS)}")
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
                        f"{texts[row][:80]!r} (dtype {self.dtype}); try dtype float32"
                    )
                out[rows] = (pooled / norms).cpu().numpy()
                if progress is not None:
                    progress(len(rows))
        return out
