"""The fixtures of ``tests/train/conftest.py``, which the tests of this folder came from."""

from tests.train.conftest import (  # noqa: F401
    _tiny_mlm_once,
    sts_dir,
    tiny_encoder_dir,
    tiny_mlm,
    tiny_model_dir,
    tiny_sentences,
    tiny_tokenizer,
)
