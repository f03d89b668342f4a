"""One sentence encoder for every stage: texts in, float32 vectors out, in input order.

:class:`SentenceEncoder` wraps a loaded model (a transformers encoder, CTranslate2's through
``ct2.CT2Model`` or ONNX Runtime's through ``ort.ORTModel``), its tokenizer and a pooling (``pooling.pool``). Embed and report build it with
:func:`load_text_encoder` (the ``embed`` params: model spec, engine, dtype, unit vectors); the
evaluator with ``describe.load_sentence_encoder`` (pooling read from the model folder); training's
dev evaluation wraps the model it is training.

Texts are encoded in batches over the texts sorted by length, so each batch pads to its own
longest text, not the corpus's (on sentence corpora that halves the tokens a forward pass
computes). Which length (``order``) changes the batches, and with them the last bits of a vector:

- ``tokens``: token count, shortest first (embed's vectors, hashed into the demo's datasets);
- ``chars``: character count, longest first (the evaluator's and training's dev scores).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
from pairforge.pipeline.errors import ConfigError, PairforgeError
from pairforge.pipeline.models.pooling import (
    DEFAULT_PROMPT,
    check_pooling,
    cut_sentences,
    pool,
    wrap_prompt,
)
from pairforge.pipeline.models.spec import load_encoder, pick_device
from pairforge.pipeline.progress import Progress

Order = Literal["tokens", "chars"]
ENGINES: tuple[str, ...] = ("transformers", "ctranslate2", "onnxruntime")


class SentenceEncoder:
    """``texts -> (n, dim)`` float32 vectors, in the order given; unit L2 norm with ``normalize``,
    else as pooled.

    ``model`` is called as a transformers encoder (``model(**batch, return_dict=True)``); its
    train/eval mode is restored after each call. With a ``prompt`` each sentence is cut to
    ``sentence_tokens`` tokens (None: what ``max_length`` leaves after the prompt) and wrapped
    (``mask`` pooling); else inputs are truncated to ``max_length`` tokens (None: the tokenizer's
    model maximum). ``autocast_dtype`` runs the forward pass under torch autocast (training's
    mixed precision). ``label`` shows sentences, rate and ETA while encoding. ``source`` is what
    :meth:`info` reports besides the encoder's own settings (model spec, dtype, engine).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        pooling: str,
        *,
        prompt: str | None = None,
        max_length: int | None = None,
        sentence_tokens: int | None = None,
        batch_size: int = 64,
        normalize: bool = True,
        order: Order = "tokens",
        autocast_dtype: Any = None,
        label: str | None = None,
        device: str | None = None,
        dim: int | None = None,
        source: dict[str, Any] | None = None,
    ) -> None:
        check_pooling(pooling)
        if order not in ("tokens", "chars"):
            raise ConfigError(f"order {order!r}: allowed tokens, chars")
        self.model = model
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.prompt = prompt
        self.batch_size = batch_size
        self.normalize = normalize
        self.order = order
        self.autocast_dtype = autocast_dtype
        self.label = label
        self.source = dict(source or {})
        config = getattr(model, "config", None)
        self.dim = int(dim if dim is not None else config.hidden_size)
        self.device = device if device is not None else str(next(model.parameters()).device)
        if max_length is None:
            positions = getattr(config, "max_position_embeddings", 512)
            max_length = min(int(tokenizer.model_max_length), int(positions))
        self.max_length = max_length
        self.sentence_tokens = sentence_tokens
        if prompt is not None:
            if tokenizer.mask_token is None:
                raise ConfigError(
                    f"model {self.name!r}: mask pooling needs a tokenizer with a [MASK]"
                )
            if sentence_tokens is None:
                overhead = len(
                    tokenizer(wrap_prompt([""], prompt, tokenizer.mask_token)[0])["input_ids"]
                )
                self.sentence_tokens = max_length - overhead
                if self.sentence_tokens < 1:
                    raise ConfigError(
                        f"max_length={max_length} leaves no room for a sentence in the prompt "
                        f"{prompt!r} ({overhead} tokens)"
                    )

    @property
    def name(self) -> str:
        return str(self.source.get("model") or type(self.model).__name__)

    def info(self) -> dict[str, Any]:
        """How vectors were made; stored in the embeddings manifest and compared downstream."""
        return {
            "model": self.source.get("model"),
            "pooling": self.pooling,
            "prompt": self.prompt,
            "max_length": self.max_length,
            "dtype": self.source.get("dtype", "float32"),
            "dim": self.dim,
            "device": self.device,
            "engine": self.source.get("engine", "transformers"),
            "compute_type": self.source.get("compute_type"),
        }

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        return self.encode(texts)

    def _inputs(self, texts: Sequence[str]) -> list[str]:
        if self.prompt is None:
            return list(texts)
        cut = cut_sentences(self.tokenizer, texts, self.sentence_tokens)
        return wrap_prompt(cut, self.prompt, self.tokenizer.mask_token)

    def _batches(self, texts: list[str]):
        """(rows, padded torch batch) in encoding order. A prompt's sentence is already cut to
        fit, so only prompt-free inputs are truncated (at ``max_length``)."""
        tok = self.tokenizer
        truncate = (
            {"truncation": True, "max_length": self.max_length} if self.prompt is None else {}
        )
        if self.order == "chars":
            order = np.argsort([-len(t) for t in texts], kind="stable")
            for start in range(0, len(texts), self.batch_size):
                rows = order[start : start + self.batch_size]
                inputs = self._inputs([texts[i] for i in rows])
                yield rows, dict(tok(inputs, padding=True, return_tensors="pt", **truncate))
            return
        enc = tok(self._inputs(texts), **truncate)
        lengths = np.fromiter((len(ids) for ids in enc["input_ids"]), dtype=np.int64)
        order = np.argsort(lengths, kind="stable")
        keys = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc]
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            yield (
                rows,
                dict(tok.pad({k: [enc[k][i] for i in rows] for k in keys}, return_tensors="pt")),
            )

    def encode(
        self,
        texts: Sequence[str],
        progress: Callable[[int], None] | None = None,
        dropout: bool = False,
    ) -> np.ndarray:
        """Vectors of ``texts``, float32 ``(len(texts), dim)``, in input order.

        ``progress(n)`` is called after each batch with the number of texts it held. ``dropout``
        runs the model in training mode (dropout on, no gradients): two such calls give the
        two views of SimCSE's positive pair. With ``normalize``, raises PairforgeError naming the
        text when the model returns NaN/inf or a zero vector (a bf16 or fp16 overflow, or a
        broken model).
        """
        import torch

        texts = list(texts)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        on_torch = isinstance(self.model, torch.nn.Module)
        if dropout and not on_torch:
            raise PairforgeError(
                f"the {self.source.get('engine')} engine has no training mode: dropout views need "
                "engine transformers"
            )
        was_training = bool(getattr(self.model, "training", False))
        if on_torch:
            self.model.train(dropout)
        bar = Progress(
            self.label or "", total=len(texts), unit="sentences", enabled=bool(self.label)
        )
        autocast = (
            torch.autocast(torch.device(self.device).type, dtype=self.autocast_dtype)
            if self.autocast_dtype is not None
            else contextlib.nullcontext()
        )
        try:
            with torch.inference_mode():
                for rows, batch in self._batches(texts):
                    if on_torch:
                        batch = {k: v.to(self.device) for k, v in batch.items()}
                    with autocast:
                        outputs = self.model(**batch, return_dict=True)
                    pooled = pool(
                        outputs,
                        batch["attention_mask"],
                        self.pooling,  # type: ignore[arg-type]
                        input_ids=batch.get("input_ids"),
                        mask_token_id=self.tokenizer.mask_token_id,
                    ).float()  # (b, d)
                    if self.normalize:
                        pooled = self._unit(pooled, rows, texts)
                    out[rows] = pooled.cpu().numpy()
                    bar.advance(done=len(rows), rows=len(rows))
                    if progress is not None:
                        progress(len(rows))
        finally:
            if on_torch:
                self.model.train(was_training)
        if self.label:
            bar.close()
        return out

    def _unit(self, pooled: Any, rows: np.ndarray, texts: list[str]) -> Any:
        """``pooled`` ``(b, d)`` scaled to unit length; a NaN/inf or zero row is an error."""
        import torch

        norms = pooled.norm(dim=1, keepdim=True)  # (b, 1)
        bad = ~torch.isfinite(pooled).all(dim=1) | (norms[:, 0] == 0)
        if bool(bad.any()):
            row = int(rows[int(torch.nonzero(bad)[0, 0])])
            precision = self.source.get("compute_type") or self.source.get("dtype", "float32")
            raise PairforgeError(
                f"encoder {self.name!r} returned a NaN/inf or zero vector for text "
                f"{texts[row][:80]!r} ({self.source.get('engine', 'transformers')}, {precision}); "
                "try dtype float32 with engine transformers"
            )
        return pooled / norms


def load_text_encoder(
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
) -> SentenceEncoder:
    """The :class:`SentenceEncoder` of the ``embed`` params: unit vectors, token-length batches.

    ``pooling="mask"`` wraps each text in ``prompt``, cut first to the token budget ``max_length``
    leaves after the prompt, so the [MASK] is never truncated away. ``dtype`` is the compute
    dtype of the transformers engine (``float32``, ``bfloat16``, ``float16``); vectors are
    float32 whatever it is. ``engine="ctranslate2"`` runs the model converted at
    ``compute_type`` (kept under ``models_dir``, see ``ct2``) instead, ``engine="onnxruntime"``
    its ONNX export at ``compute_type`` ``int8`` or ``float32`` (on CPU, see ``ort``); ``dtype``
    must then stay float32. ``threads`` > 0 sets this process's torch CPU threads, and the
    engine's (-1: their defaults).
    """
    import os

    check_pooling(pooling)
    if engine not in ENGINES:
        raise ConfigError(f"engine {engine!r}: allowed {', '.join(ENGINES)}")
    if engine != "transformers" and dtype != "float32":
        raise ConfigError(
            f"dtype {dtype!r} applies to the transformers engine; the {engine} engine's "
            f"precision is compute_type (now {compute_type!r}): leave dtype at float32"
        )
    # OpenMP threads that spin while waiting make torch 2-3x slower on a CPU shared with
    # other work (measured: 52 vs 113 sentences/s for MiniLM on 2 busy cores); sleeping
    # waiters cost little on an idle machine. Read once, when torch loads its OpenMP: an
    # explicit OMP_WAIT_POLICY, or torch imported earlier, wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    if threads > 0:
        torch.set_num_threads(threads)
    requested, device = device, pick_device(device)
    source = {"model": model, "dtype": dtype, "engine": engine, "compute_type": None}
    dim = None
    if engine == "ctranslate2":
        from pairforge.pipeline.models.ct2 import load_ctranslate2

        tokenizer, net, dim = load_ctranslate2(model, device, compute_type, models_dir, threads)
        source["compute_type"] = compute_type
    elif engine == "onnxruntime":
        from pairforge.pipeline.models.ort import load_onnxruntime

        # Its package runs on CPU only: auto means cpu here, whatever GPU is visible.
        device = "cpu" if requested == "auto" else device
        tokenizer, net, dim = load_onnxruntime(model, device, compute_type, models_dir, threads)
        source["compute_type"] = compute_type
    else:
        tokenizer, net = load_encoder(model, device, dtype)
    return SentenceEncoder(
        net,
        tokenizer,
        pooling,
        prompt=prompt if pooling == "mask" else None,
        max_length=max_length,
        batch_size=batch_size,
        normalize=True,
        order="tokens",
        device=device,
        dim=dim,
        source=source,
    )
