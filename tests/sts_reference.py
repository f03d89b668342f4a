"""An STS score computed apart from pairforge's evaluator, to check the scores `evaluate` reports:
sentence-transformers encodes the sentences and scipy correlates their cosines with the gold
scores. A score the evaluator gets wrong (vectors, pairing, ranking, aggregation) disagrees."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pairforge.pipeline.science import sts
from pairforge.pipeline.science.models import resolve_model
from scipy.stats import spearmanr

# What pairforge's pooling names are in sentence-transformers' Pooling module.
ST_POOLING = {"cls_before_pooler": "cls", "mean": "mean"}


def st_encoder(spec: str, pooling: str, exported: bool, cwd: Path | None = None):
    """sentence-transformers' model for ``spec`` (a model spec as `evaluate` names it, relative to
    ``cwd``): an exported model as its folder declares it, a base model as its transformer with
    ``pooling`` (``cls_before_pooler`` or ``mean``)."""
    from sentence_transformers import SentenceTransformer, models

    if cwd is not None and not spec.startswith("package:") and not Path(spec).is_absolute():
        spec = str(cwd / spec)
    folder = resolve_model(spec)
    if exported:
        return SentenceTransformer(folder, device="cpu")
    transformer = models.Transformer(folder)
    head = models.Pooling(transformer.get_embedding_dimension(), pooling_mode=ST_POOLING[pooling])
    return SentenceTransformer(modules=[transformer, head], device="cpu")


def reference_score(model, data: sts.STSData) -> float:
    """100 x scipy's Spearman correlation of the pairs' cosines with their gold scores; for
    STS12-16 one correlation over every subset's pairs (SentEval's "all")."""
    vectors = model.encode(data.s1 + data.s2, batch_size=16, convert_to_numpy=True)
    vectors = vectors.astype(np.float64)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    a, b = vectors[: len(data)], vectors[len(data) :]
    cosines = (a * b).sum(axis=1)
    return 100 * float(spearmanr(cosines, data.gold).statistic)
