"""The model layer: where a model comes from, how a sentence becomes a vector, the MLM head.

- ``spec``: model specs (hub id, local folder, ``package:``), loading a tokenizer and encoder;
- ``pooling``: token states to one vector (``cls``, ``cls_before_pooler``, ``mean``, ``mask``);
- ``encoder``: :class:`SentenceEncoder`, texts to vectors for embed, report, train and evaluate;
  :func:`load_text_encoder` builds embed's (``transformers``, ``ctranslate2`` (``ct2``) or
  ``onnxruntime`` (``ort``) engine);
- ``describe``: what a model folder says about its vectors (sentence-transformers modules,
  this project's export) and :func:`load_sentence_encoder`, the evaluator's encoder;
- ``mlm``: masked-LM models and their heads (loader, head finder, fresh heads) for pretrain and
  train.

Importing this package imports neither torch nor transformers: they load on first use.
"""

from pairforge.pipeline.science.models.describe import (
    EXPORT_INFO,
    describe_model,
    load_sentence_encoder,
    st_modules,
)
from pairforge.pipeline.science.models.encoder import ENGINES, SentenceEncoder, load_text_encoder
from pairforge.pipeline.science.models.mlm import (
    head_is_untrained,
    load_masked_lm,
    mlm_head_of,
    new_mlm_head,
    output_projection,
)
from pairforge.pipeline.science.models.pooling import (
    DEFAULT_PROMPT,
    POOLINGS,
    Pooling,
    check_pooling,
    cut_sentences,
    pool,
    wrap_prompt,
)
from pairforge.pipeline.science.models.spec import (
    PACKAGE_PREFIX,
    hub_id,
    hub_kwargs,
    is_local_spec,
    load_encoder,
    model_label,
    pick_device,
    resolve_model,
    spec_problem,
)

__all__ = [
    "DEFAULT_PROMPT",
    "ENGINES",
    "EXPORT_INFO",
    "PACKAGE_PREFIX",
    "POOLINGS",
    "SentenceEncoder",
    "Pooling",
    "check_pooling",
    "cut_sentences",
    "describe_model",
    "head_is_untrained",
    "hub_id",
    "hub_kwargs",
    "is_local_spec",
    "load_encoder",
    "load_masked_lm",
    "load_sentence_encoder",
    "load_text_encoder",
    "mlm_head_of",
    "model_label",
    "new_mlm_head",
    "output_projection",
    "pick_device",
    "pool",
    "resolve_model",
    "spec_problem",
    "st_modules",
    "wrap_prompt",
]
