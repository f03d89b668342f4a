"""The autouse fixture of ``tests/train/conftest.py`` (one torch thread) for the tests of this
folder, which came from there; their tiny models are in ``tests/tiny_models.py``."""

from tests.train.conftest import _one_torch_thread  # noqa: F401
