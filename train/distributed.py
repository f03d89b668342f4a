"""One-node data parallelism: process-group set-up under ``torchrun``, and the embedding gather
that lets in-batch negatives span every device.

Every rank reads the same seeded data stream and takes its slice of each global batch, so the
samples a step sees do not depend on the number of processes. Contrastive losses compare their
local rows with the candidates of *all* ranks (:func:`gather_with_grad`); the gather's backward
sums the gradient that every rank's loss sends to a rank's rows, so after DDP's gradient average
each step follows the gradient of the mean loss over the global batch, as one process with the
whole batch would (up to floating-point order).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    """True inside an initialised process group of more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def is_main() -> bool:
    return rank() == 0


def gather_with_grad(tensor: torch.Tensor) -> torch.Tensor:
    """All ranks' ``tensor`` concatenated along dim 0 in rank order, ``(world * n, ...)``.

    Differentiable: the backward sums every rank's gradient for a rank's rows and hands it to that
    rank. Without a process group it returns ``tensor`` itself. Every rank must pass the same shape.
    """
    if not is_distributed():
        return tensor
    from torch.distributed.nn.functional import all_gather

    return torch.cat(all_gather(tensor), dim=0)


def row_offset(local_rows: int) -> int:
    """Index of this rank's first row in a gathered tensor of ``local_rows`` rows per rank."""
    return rank() * local_rows


def init_from_env(device: str) -> bool:
    """Join the process group ``torchrun`` describes (``WORLD_SIZE`` > 1); False when alone.

    NCCL on CUDA (each rank on ``cuda:LOCAL_RANK``), gloo on CPU.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or is_distributed():
        return is_distributed()
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=backend)
    return True


def local_device(device: str) -> str:
    """``cuda`` -> ``cuda:LOCAL_RANK`` under torchrun; anything else unchanged."""
    if device == "cuda" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return device


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def shutdown() -> None:
    """Leave the process group, every rank together (a no-op without one).

    The barrier first: a rank that tears the group down while another is still in a collective
    (or still working before its last one) aborts that rank ("terminate called without an
    active exception" under gloo)."""
    if dist.is_available() and dist.is_initialized():
        if dist.get_world_size() > 1:
            dist.barrier()
        dist.destroy_process_group()


def broadcast_object(obj):
    """``obj`` from rank 0 on every rank (identity when alone)."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]
