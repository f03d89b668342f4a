"""The computational core of DebCSE mining (CIKM'23, section 4), as pure functions.

- ``index``: FAISS inner-product index over normalised embeddings, batched kNN search, recall.
- ``pools``: negative candidate pools: kNN neighbours in a cosine band, minus self, duplicates,
  near duplicates and the anchor's own augmentations, with fallbacks for short pools.
- ``edits``: edit distances, the ``edit`` of eq. 1 (compiled kernels or rapidfuzz over texts
  encoded once; the rapidfuzz string reference is the tests' ``edit_oracle``).
- ``ipw``: eqs. 1-6 (surface / semantic scores, P_neg, P_pos), entropy ratios, seeded sampling.

Pools travel in ragged form (offsets + flat arrays, the layout of an Arrow list column). Nothing
in those four touches files; the ``mine`` and ``sample`` stage commands read params and shards and
call them. The stages' own parts:

- ``inputs``: reading and checking embeddings, candidates and texts;
- ``encoder``: a transformers encoder behind ``encode(texts) -> unit vectors`` (embed, report);
- ``searcher``: the ``mine`` index built from its settings (saved for resume), batched search;
- ``pairs`` and ``sampling``: scores and draws over Arrow columns, the ``sample`` shard function;
- ``card``, ``export``, ``diagnostics``: the dataset card, the sentence-transformers export and
  DebCSE's Table 1/4 diagnostics of the ``report`` stage.
"""

import importlib
from typing import Any

# name -> submodule. Resolved on first access (PEP 562) so that importing one submodule (the
# stage commands import ``inputs``) does not load FAISS and rapidfuzz with the others.
_EXPORTS = {
    "edit_scorer": "edits",
    "build_index": "index",
    "check_vectors": "index",
    "measure_recall": "index",
    "recall_at_k": "index",
    "search": "index",
    "entropy_ratio": "ipw",
    "negative_probs": "ipw",
    "pool_entropy_ratios": "ipw",
    "positive_probs": "ipw",
    "sample_pools": "ipw",
    "sample_without_replacement": "ipw",
    "semantic_scores": "ipw",
    "surface_scores": "ipw",
    "NegativePools": "pools",
    "build_negative_pools": "pools",
    "normalize_text": "pools",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)


__all__ = [
    "NegativePools",
    "build_index",
    "build_negative_pools",
    "check_vectors",
    "edit_scorer",
    "entropy_ratio",
    "measure_recall",
    "negative_probs",
    "normalize_text",
    "pool_entropy_ratios",
    "positive_probs",
    "recall_at_k",
    "sample_pools",
    "sample_without_replacement",
    "search",
    "semantic_scores",
    "surface_scores",
]
