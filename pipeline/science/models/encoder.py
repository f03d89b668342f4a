"""One sentence encoder for every stage: texts in, float32 vectors out, in input order.

:class:`SentenceEncoder` wraps a loaded model (a transformers encoder, CTranslate2's through
``ct2.CT2Model`` or ONNX Runtime's through ``ort.ORTModel``), its tokenizer and a pooling
(``pooling.pool``). Embed and report build it with :func:`load_text_encoder` (the ``embed``
params: model spec, engine, dtype, unit vectors); the evaluator with
``describe.load_sentence_encoder`` (pooling read from the model folder); training's dev
evaluation wraps the model it is training.

Texts are encoded in batches over the texts sorted by length, so each batch pads to its own
longest text, not the corpus's (on sentence corpora that halves the tokens a forward pass
computes). Which length (``order``) changes the batches, and with them the last bits of a vector:

- ``tokens``: token count, longest first (embed's vectors, hashed into the demo's datasets);
- ``chars``: character count, longest first (the evaluator's and training's dev scores).

Longest first because of the allocator: the first batch sizes its heap for the largest
activations, and every later (smaller) batch fits in the blocks it freed. Shortest first, each
batch asked for slightly larger blocks than any freed before, and the process grew to about
100 MiB more by the end of a 10k-sentence shard (docs/mine.md). For the same reason ``tokens``
keeps a shard's token ids as two flat arrays (ids and offsets) rather than the tokenizer's
per-text encodings (about 5 times their size), and gives freed heap back to the system every
``TRIM_EVERY`` batches and after the last, where the C library can (glibc's ``malloc_trim``).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
from pairforge.pipeline.plumbing.errors import ConfigError, PairforgeError
from pairforge.pipeline.plumbing.progress import Progress
from pairforge.pipeline.science.models.pooling import (
    DEFAULT_PROMPT,
    check_pooling,
    cut_sentences,
    pool,
    wrap_prompt,
)
from pairforge.pipeline.science.models.spec import load_encoder, pick_device

Order = Literal["tokens", "chars"]
ENGINES: tuple[str, ...] = ("transformers", "ctranslate2", "onnxruntime")


class SentenceEncoder:
    """``texts -> (n, dim)`` float32 vectors, in the order given; unit L2 norm with ``normalize``,
    else as pooled.

    ``model`` is called as a transformers encoder (``model(**batch, return_dict=True)``); its
    train/eval mode is restored after each call. With a ``prompt`` each sentence is cut to
    ``sentence_tokens`` tokens (None: what ``max_length`` leaves after the prompt) and wrapped
    (``mask`` pooling); else inputs are truncated to ``max_length`` tokens (None: the tokenizer's
    model maximum). A batch holds ``batch_size`` texts, and with ``max_batch_tokens``
    (``tokens`` order) at most that many padded tokens: the longest texts go in smaller
    batches, which bounds a forward pass's activations. ``autocast_dtype`` runs the forward
    pass under torch autocast (training's mixed precision). ``label`` shows sentences, rate and
    ETA while encoding. ``source`` is what :meth:`info` reports besides the encoder's own
    settings (model spec, dtype, engine).
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
        max_batch_tokens: int | None = None,
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
        if max_batch_tokens is not None and max_batch_tokens < 1:
            raise ConfigError(
                f"max_batch_tokens={max_batch_tokens}: at least 1, or None for no limit"
            )
        self.max_batch_tokens = max_batch_tokens
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
            # onnxruntime's int8 only: how the model was quantised (``ort.Int8Recipe``).
            **({"int8_recipe": self.source["int8_recipe"]} if "int8_recipe" in self.source else {}),
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
        ids = TokenIds.of(tok, self._inputs(texts), truncate)
        # Longest first; among equal lengths, input order (a stable sort of the negated counts).
        order = np.argsort(-ids.lengths, kind="stable")
        start = 0
        for n in itertools.count(1):
            if start >= len(order):
                break
            size = self.batch_size
            if self.max_batch_tokens is not None:  # the batch's first text is its longest
                size = max(1, min(size, self.max_batch_tokens // int(ids.lengths[order[start]])))
            rows = order[start : start + size]
            start += size
            yield rows, ids.batch(rows, tok)
            if n % TRIM_EVERY == 0:
                release_free_heap()
        release_free_heap()

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


_TOKENIZE_CHUNK = 4096  # texts per tokenizer call: bounds its transient encodings
# Batches between two release_free_heap calls (and one after the last): trimming after every
# batch costs a system call and the pages faulted in again by the next batch; never trimming
# lets the heap keep the largest batch's peak for the whole run (benchmarks/results/
# embed_trim-2026-11-26.md).
TRIM_EVERY = 32


class TokenIds:
    """A list of texts' token ids as flat arrays: ``flat[offsets[i]:offsets[i + 1]]`` are text
    ``i``'s ids (int32), ``type_ids`` likewise where the model takes token types (else None).
    Tokenised ``_TOKENIZE_CHUNK`` texts at a time and kept at 4-5 bytes a token, where the
    tokenizer's encodings of a shard (tokens, offsets, masks as Python lists) take about 5 times
    that for as long as the shard is encoded."""

    def __init__(self, flat: np.ndarray, offsets: np.ndarray, type_ids: np.ndarray | None):
        self.flat = flat
        self.offsets = offsets
        self.type_ids = type_ids
        self.lengths = np.diff(offsets)

    @classmethod
    def of(cls, tokenizer: Any, texts: list[str], options: dict[str, Any]) -> TokenIds:
        with_types = "token_type_ids" in tokenizer.model_input_names
        ids: list[np.ndarray] = []
        types: list[np.ndarray] = []
        lengths: list[np.ndarray] = []
        for start in range(0, len(texts), _TOKENIZE_CHUNK):
            enc = tokenizer(
                texts[start : start + _TOKENIZE_CHUNK],
                return_attention_mask=False,
                return_token_type_ids=with_types,
                **options,
            )
            lengths.append(np.fromiter(map(len, enc["input_ids"]), np.int64))
            count = int(lengths[-1].sum())
            ids.append(
                np.fromiter(itertools.chain.from_iterable(enc["input_ids"]), np.int32, count)
            )
            if with_types:
                types.append(
                    np.fromiter(
                        itertools.chain.from_iterable(enc["token_type_ids"]), np.int8, count
                    )
                )
        offsets = np.zeros(len(texts) + 1, dtype=np.int64)
        np.cumsum(np.concatenate(lengths) if lengths else [], out=offsets[1:])
        flat = np.concatenate(ids) if ids else np.empty(0, np.int32)
        return cls(flat, offsets, np.concatenate(types) if with_types and types else None)

    def batch(self, rows: np.ndarray, tokenizer: Any) -> dict[str, Any]:
        """The padded torch batch of ``rows``, as ``tokenizer.pad`` makes it: ``input_ids``
        padded with the pad token on the tokenizer's padding side, ``attention_mask``, and
        ``token_type_ids`` (padded with the tokenizer's pad type id) where the model takes
        them."""
        import torch

        if tokenizer.pad_token_id is None:
            raise ConfigError(
                f"tokenizer {tokenizer.name_or_path!r} has no padding token: batches of texts "
                "of different lengths need one"
            )
        lengths = self.lengths[rows]
        width = int(lengths.max())
        input_ids = np.full((len(rows), width), tokenizer.pad_token_id, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        types = (
            np.full((len(rows), width), tokenizer.pad_token_type_id, dtype=np.int64)
            if self.type_ids is not None
            else None
        )
        left = tokenizer.padding_side == "left"
        for j, (row, n) in enumerate(zip(rows, lengths, strict=True)):
            span = slice(width - n, width) if left else slice(0, n)
            lo, hi = self.offsets[row], self.offsets[row + 1]
            input_ids[j, span] = self.flat[lo:hi]
            mask[j, span] = 1
            if types is not None:
                types[j, span] = self.type_ids[lo:hi]
        batch = {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(mask)}
        if types is not None:
            batch["token_type_ids"] = torch.from_numpy(types)
        return batch


def release_free_heap() -> None:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim``; a no-op
    elsewhere). A batch's activations are freed to the heap, not to the system, and a process
    that encodes batches of many shapes keeps the high-water mark of them all otherwise."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _malloc_trim() -> Any:
    import ctypes

    try:  # the process's own symbols: the C library it runs on
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        return None


_MALLOC_TRIM = _malloc_trim()


def load_text_encoder(
    model: str,
    pooling: str = "cls_before_pooler",
    *,
    device: str = "auto",
    dtype: str = "float32",
    max_length: int = 128,
    batch_size: int = 64,
    max_batch_tokens: int | None = None,
    prompt: str = DEFAULT_PROMPT,
    threads: int = -1,
    engine: str = "transformers",
    compute_type: str = "int8",
    models_dir: str = ".cache/pairforge/ctranslate2",
    int8_weights: str | None = None,
) -> SentenceEncoder:
    """The :class:`SentenceEncoder` of the ``embed`` params: unit vectors, token-length batches.

    ``pooling="mask"`` wraps each text in ``prompt``, cut first to the token budget ``max_length``
    leaves after the prompt, so the [MASK] is never truncated away. ``dtype`` is the compute
    dtype of the transformers engine (``float32``, ``bfloat16``, ``float16``); vectors are
    float32 whatever it is. ``engine="ctranslate2"`` runs the model converted at
    ``compute_type`` (kept under ``models_dir``, see ``ct2``) instead, ``engine="onnxruntime"``
    its ONNX export at ``compute_type`` ``int8`` or ``float32`` (on CPU, see ``ort``), int8
    with ``int8_weights`` (``int8`` or ``uint8``; None: what suits this CPU); ``dtype`` must
    then stay float32. ``threads`` > 0 sets this process's torch CPU threads, and the engine's
    (-1: their defaults).
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
    # OpenMP threads that spin while waiting take the cores other work needs, and torch slows
    # several times on a shared CPU; sleeping waiters cost little on an idle machine. Read once, when torch loads its OpenMP: an
    # explicit OMP_WAIT_POLICY, or torch imported earlier, wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    if threads > 0:
        torch.set_num_threads(threads)
    requested, device = device, pick_device(device)
    source = {"model": model, "dtype": dtype, "engine": engine, "compute_type": None}
    dim = None
    if engine == "ctranslate2":
        from pairforge.pipeline.science.models.ct2 import load_ctranslate2

        tokenizer, net, dim = load_ctranslate2(model, device, compute_type, models_dir, threads)
        source["compute_type"] = compute_type
    elif engine == "onnxruntime":
        from pairforge.pipeline.science.models.ort import (
            Int8Recipe,
            default_recipe,
            load_onnxruntime,
        )

        # Its package runs on CPU only: auto means cpu here, whatever GPU is visible.
        device = "cpu" if requested == "auto" else device
        recipe = Int8Recipe(weights=int8_weights) if int8_weights else default_recipe()  # type: ignore[arg-type]
        tokenizer, net, dim = load_onnxruntime(
            model, device, compute_type, models_dir, threads, recipe
        )
        source["compute_type"] = compute_type
        if compute_type == "int8":
            source["int8_recipe"] = recipe.name
    else:
        tokenizer, net = load_encoder(model, device, dtype)
    return SentenceEncoder(
        net,
        tokenizer,
        pooling,
        prompt=prompt if pooling == "mask" else None,
        max_length=max_length,
        batch_size=batch_size,
        max_batch_tokens=max_batch_tokens,
        normalize=True,
        order="tokens",
        device=device,
        dim=dim,
        source=source,
    )
