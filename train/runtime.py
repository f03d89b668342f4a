"""Process-wide settings for the length of one training run, restored when it ends.

:func:`run_settings` sets, then restores:

- **torch threads** (``threads`` > 0; otherwise torch's default is left alone);
- **deterministic kernels** (``deterministic``), *without* torch's NaN fill of every new tensor.
  That fill (``torch.utils.deterministic.fill_uninitialized_memory``) only guards against kernels
  that read memory they never wrote; no kernel we use does, so results are the same, and bitwise
  reproducible, without it. It costs a full extra write of every activation and gradient;
- **deterministic attention on CUDA** (``deterministic`` and ``cuda``): the fused attention
  kernels that ``scaled_dot_product_attention`` picks on a GPU (flash, memory-efficient, cuDNN)
  have backward passes that accumulate with atomics, so two runs differ, and
  ``use_deterministic_algorithms(warn_only=True)`` only warns about it (seen on an H200: "cuDNN
  Attention defaults to a non-deterministic algorithm"). They are switched off for the run, which
  leaves the math kernel, deterministic; at 32 tokens a sentence it costs little. On a CPU the
  backends are left alone (the CPU's flash kernel is deterministic, and switching it changes the
  arithmetic of every CPU run);
- **keeping freed host memory** (``keep_host_memory``, glibc only): a step allocates its
  activations and gradients afresh and frees them all at its end. glibc returns large freed blocks
  to the kernel (any block above its mmap threshold, which cannot exceed 32 MiB, such as a
  word-embedding gradient; and the top of the heap beyond its trim threshold), so every
  step faults the same pages in again, zero-filled by the kernel (in a VM, often by the host as
  well). Here glibc serves every block from its heap and never shrinks it during the run, as
  PyTorch's CUDA caching allocator does for GPU memory; at the end the defaults come back and the
  free memory is returned. Only where the bytes live changes, never the arithmetic. The first
  few steps may still grow the heap (up to three of them in tests/train/test_runtime.py's
  measurement): torch asks for 64-byte-aligned blocks, and glibc's ``posix_memalign`` looks for
  a free chunk a little larger than the block, which the block just freed is not unless it
  merged into the top of the heap; once the heap holds such a chunk, every later step is served
  from it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Iterator

import torch

# mallopt(3) parameters (malloc.h) and glibc's documented defaults, restored after a run.
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
GLIBC_DEFAULTS = {M_TRIM_THRESHOLD: 128 * 1024, M_MMAP_MAX: 65536}
# Every block from the heap (no mmap), and the heap never trimmed below 2 GiB of free top.
KEEP = {M_MMAP_MAX: 0, M_TRIM_THRESHOLD: 2**31 - 1}

_keeping = 0  # nesting depth: only the outermost run restores glibc's settings


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - absent on musl and other C libraries
        return libc
    except (OSError, AttributeError):
        return None


@contextlib.contextmanager
def keep_host_memory() -> Iterator[bool]:
    """Keep freed memory in the process while inside; yields whether it could (glibc only)."""
    global _keeping
    libc = _glibc()
    if libc is None:
        yield False
        return
    if _keeping == 0:
        for parameter, value in KEEP.items():
            libc.mallopt(parameter, value)
    _keeping += 1
    try:
        yield True
    finally:
        _keeping -= 1
        if _keeping == 0:
            for parameter, value in GLIBC_DEFAULTS.items():
                libc.mallopt(parameter, value)
            libc.malloc_trim(0)


def _sdp_backends() -> dict[str, bool]:
    b = torch.backends.cuda
    return {"flash": b.flash_sdp_enabled(), "mem_efficient": b.mem_efficient_sdp_enabled(),
            "cudnn": b.cudnn_sdp_enabled()}  # fmt: skip


def _set_sdp_backends(enabled: dict[str, bool]) -> None:
    b = torch.backends.cuda
    b.enable_flash_sdp(enabled["flash"])
    b.enable_mem_efficient_sdp(enabled["mem_efficient"])
    b.enable_cudnn_sdp(enabled["cudnn"])


@contextlib.contextmanager
def run_settings(
    threads: int, deterministic: bool, keep_memory: bool, cuda: bool = False
) -> Iterator[None]:
    """Threads, deterministic kernels (attention too, on CUDA) and host-memory retention for one
    run (module docstring)."""
    saved_threads = torch.get_num_threads()
    saved_deterministic = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    saved_fill = torch.utils.deterministic.fill_uninitialized_memory
    saved_cudnn = torch.backends.cudnn.benchmark
    saved_sdp = _sdp_backends()
    with contextlib.ExitStack() as stack:
        if keep_memory:
            stack.enter_context(keep_host_memory())
        try:
            if threads > 0:
                torch.set_num_threads(threads)
            if deterministic:
                os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
                torch.use_deterministic_algorithms(True, warn_only=True)
                torch.utils.deterministic.fill_uninitialized_memory = False
                torch.backends.cudnn.benchmark = False
                if cuda:
                    _set_sdp_backends({"flash": False, "mem_efficient": False, "cudnn": False})
            yield
        finally:
            torch.set_num_threads(saved_threads)
            torch.use_deterministic_algorithms(
                saved_deterministic[0], warn_only=saved_deterministic[1]
            )
            torch.utils.deterministic.fill_uninitialized_memory = saved_fill
            torch.backends.cudnn.benchmark = saved_cudnn
            _set_sdp_backends(saved_sdp)
