"""The trainer tests' autouse fixture: one torch thread. Their tiny BERT, tokenizer, model
folders and STS folder are in ``tests/tiny_models.py``, registered once for the whole run."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="package", autouse=True)
def _one_torch_thread():
    """Tiny models gain nothing from a second thread, and on a busy machine two threads that
    spin-wait on each other make a step 10-100x slower: the training tests run on one, and so do
    the processes they start (OMP_NUM_THREADS), so in-process and subprocess runs compare
    bitwise."""
    import os

    threads, env = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    yield
    torch.set_num_threads(threads)
    if env is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = env
