"""The NCCL transport: a process group over NVLink/InfiniBand/PCIe for CUDA tensors.

Called by `group.form` when every rank of a group holds a CUDA device. Written and type
checked; exercised only where at least two CUDA devices exist (this project's CI has none,
so the tests that need it skip and say so). `available()` tells why it cannot be used.
"""

from __future__ import annotations

import datetime

import torch
from torch._C import _distributed_c10d as c10d

NAME = "nccl"


def available() -> str | None:
    """Why NCCL cannot be used in this process, or None when it can."""
    if not torch.distributed.is_nccl_available():
        return "this torch build has no NCCL"
    if not torch.cuda.is_available():
        return "no CUDA device is visible"
    return None


def make(
    store: c10d.Store, rank: int, size: int, timeout_s: float, device: torch.device
) -> c10d.Backend:
    """An NCCL group of `size` ranks bound to `device`; the communicator is created at
    the first collective (NCCL's own lazy init)."""
    why = available()
    if why is not None:
        raise RuntimeError(f"NCCL group cannot be formed: {why}")
    from torch._C._distributed_c10d import ProcessGroupNCCL  # only in CUDA builds

    opts = ProcessGroupNCCL.Options()
    opts._timeout = datetime.timedelta(seconds=timeout_s)
    torch.cuda.set_device(device)
    return ProcessGroupNCCL(store, rank, size, opts)
