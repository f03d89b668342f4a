"""Masked-LM models and their heads, for pretrain and train: one loader, one head finder, the
head's output projection, a fresh head of an architecture, and telling an untrained head.

A checkpoint without an MLM head (MiniLM and other sentence-transformers exports) still loads:
transformers initialises the head (its output layer tied to the word embeddings), and
:func:`load_masked_lm` names the weights it had to initialise so that the caller can say so.
"""

from __future__ import annotations

from typing import Any

from pairforge.pipeline.plumbing.errors import ConfigError
from pairforge.pipeline.science.models.spec import hub_kwargs, resolve_model

HEAD_NAMES = ("cls", "lm_head")  # BERT's, RoBERTa's


def load_masked_lm(
    spec: str, seed: int | None = None, key: str = "model"
) -> tuple[Any, Any, list[str]]:
    """(tokenizer, ``AutoModelForMaskedLM`` model, head weights the checkpoint lacked) for a
    model spec, the model as ``from_pretrained`` leaves it (eval mode).

    ``seed`` seeds torch first, so that a head initialised here is the same on every rerun.
    transformers' own load report is silenced: the missing head weights are returned instead.
    A model that cannot be loaded is a ConfigError naming ``key`` (the params key) and the spec.
    """
    import torch
    import transformers
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    if seed is not None:
        torch.manual_seed(seed)
    where = resolve_model(spec)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, **hub_kwargs())
        model, info = AutoModelForMaskedLM.from_pretrained(
            where, output_loading_info=True, **hub_kwargs()
        )
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{key} {spec!r} could not be loaded from {where!r}: {exc}") from None
    finally:
        transformers.logging.set_verbosity(verbosity)
    prefix = model.base_model_prefix + "."
    missing = sorted(k for k in info.get("missing_keys", []) if not k.startswith(prefix))
    return tokenizer, model, missing


def mlm_head_of(model: Any, required: bool = False) -> Any:
    """The MLM head of a ``*ForMaskedLM`` model: BERT's ``cls``, RoBERTa's ``lm_head``, else its
    one child besides the encoder; None when it has none (a ConfigError when ``required``)."""
    from torch import nn

    for name in HEAD_NAMES:
        head = getattr(model, name, None)
        if isinstance(head, nn.Module):
            return head
    base = getattr(model, "base_model", None)
    others = [(n, m) for n, m in model.named_children() if m is not base]
    if base is not None and base is not model and len(others) == 1:
        return others[0][1]
    if required:
        raise ConfigError(
            f"cannot tell the MLM head of {type(model).__name__} (children besides the encoder: "
            f"{[n for n, _ in others]})"
        )
    return None


def output_projection(head: Any) -> Any:
    """The hidden-to-vocabulary ``Linear`` of an MLM head."""
    from torch import nn

    decoder = getattr(head, "decoder", None) or getattr(
        getattr(head, "predictions", None), "decoder", None
    )
    if not isinstance(decoder, nn.Linear):
        raise ConfigError(f"MLM head {type(head).__name__} has no decoder Linear")
    return decoder


def new_mlm_head(config: Any, word_embeddings: Any = None) -> Any:
    """A freshly initialised MLM head of the encoder's architecture (``config``).

    The output projection starts as a copy of ``word_embeddings`` when given (BERT ties the two),
    the transform from the architecture's own initialisation.
    """
    import copy

    from torch import nn
    from transformers import AutoModelForMaskedLM

    model = AutoModelForMaskedLM.from_config(copy.deepcopy(config))
    head = mlm_head_of(model)
    if head is None:
        raise ConfigError(f"no MLM head class for model_type {config.model_type!r}")
    head = copy.deepcopy(head)
    if word_embeddings is not None:
        decoder = output_projection(head)
        decoder.weight = nn.Parameter(word_embeddings.detach().clone())
    return head


def head_is_untrained(head: Any) -> bool:
    """True when an MLM head's LayerNorms and biases still hold their initial ones and zeros.

    A ``*ForMaskedLM`` loaded from a checkpoint without a head (MiniLM, sentence-transformers
    exports) gets a fresh one; trained LayerNorm weights are never all exactly 1.
    """
    from torch import nn

    norms = [m for m in head.modules() if isinstance(m, nn.LayerNorm)]
    if not norms:
        return False
    return all(
        bool((m.weight == 1).all()) and (m.bias is None or bool((m.bias == 0).all())) for m in norms
    )
