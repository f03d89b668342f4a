"""Exact inner-product search in torch: the GPU mining path when faiss has no GPU support.

The faiss-gpu wheels need a CUDA runtime of their own (``faiss-gpu-cu12`` wants CUDA 12's
cuBLAS), which many GPU machines do not have; torch, which the trainer needs anyway, brings its
own. So ``mine`` can search with blocked matrix products and a running top-k, as
sentence-transformers' ``mine_hard_negatives`` does without faiss: the corpus is copied to the
device once (float32, ``BLOCK`` rows at a time, ``release`` after each), queries are scored
against as many corpus rows at a time as keep one block of scores within ``SCORE_BYTES``, and
each block's top-k is merged into the running one. The products are exact float32 (TF32 off while searching), so the neighbours are
faiss ``IndexFlatIP``'s up to the order of exact ties and the last bits of a score; the pools
mined from them are tested equal on the CPU (tests/stages/mine/test_torch_search.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import numpy as np
from pairforge.pipeline.science.mining_inputs import no_release
from pairforge.stages.mine.index import BLOCK

# Bytes of one query block's scores against one corpus block (float32): bounds the memory the
# search adds on the device whatever the query batch.
SCORE_BYTES = 1 << 28


@contextlib.contextmanager
def _exact_float32() -> Iterator[None]:
    """Float32 matrix products in full precision (no TF32) inside, the previous setting after."""
    import torch

    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


class TorchFlatIndex:
    """Exact search over ``vectors`` (``(n, d)`` float32, unit rows) on a torch ``device``, with
    the part of faiss's index interface that ``mine`` uses: ``d``, ``ntotal`` and
    ``search(queries, k) -> (scores, ids)``, best first, padded with -inf / -1 past ``n``."""

    def __init__(
        self,
        vectors: np.ndarray,
        device: str = "cpu",
        release: Callable[[], None] = no_release,
    ) -> None:
        import torch

        self.ntotal, self.d = int(vectors.shape[0]), int(vectors.shape[1])
        self.device = torch.device(device)
        blocks = []
        for lo in range(0, self.ntotal, BLOCK):
            block = np.array(vectors[lo : lo + BLOCK], dtype=np.float32)  # a copy: writable
            blocks.append(torch.from_numpy(block).to(self.device))
            release()
        self.corpus = torch.cat(blocks) if blocks else torch.empty((0, self.d))  # (n, d)

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        import torch

        b = len(queries)
        keep = min(k, self.ntotal)
        step = max(1, SCORE_BYTES // (4 * max(b, 1)))  # corpus rows per block
        with torch.no_grad(), _exact_float32():
            q = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32)).to(self.device)
            best_s = torch.full((b, 0), -torch.inf, device=self.device)  # (b, <= keep)
            best_i = torch.full((b, 0), -1, dtype=torch.int64, device=self.device)
            for lo in range(0, self.ntotal, step):
                scores = q @ self.corpus[lo : lo + step].T  # (b, c)
                top = torch.topk(scores, min(keep, scores.shape[1]), dim=1)  # sorted
                merged_s = torch.cat([best_s, top.values], dim=1)
                merged_i = torch.cat([best_i, top.indices + lo], dim=1)
                order = torch.topk(merged_s, min(keep, merged_s.shape[1]), dim=1).indices
                best_s = torch.gather(merged_s, 1, order)
                best_i = torch.gather(merged_i, 1, order)
            out_s = np.full((b, k), -np.inf, dtype=np.float32)  # (b, k)
            out_i = np.full((b, k), -1, dtype=np.int64)  # (b, k)
            out_s[:, :keep] = best_s.cpu().numpy()
            out_i[:, :keep] = best_i.cpu().numpy()
        return out_s, out_i


def torch_device(use_gpu: str) -> str | None:
    """Where the torch search runs: ``cuda`` when a GPU is visible to torch and ``use_gpu``
    allows it, else ``cpu``; None when ``use_gpu: yes`` asks for a GPU torch does not see."""
    import torch

    if use_gpu != "no" and torch.cuda.is_available():
        return "cuda"
    return None if use_gpu == "yes" else "cpu"
